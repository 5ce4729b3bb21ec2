// SPDX-License-Identifier: Apache-2.0
#include "topology/device_reader.h"

#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "topology/sysfs_text.h"
#include "topology/transport.h"

namespace mergewatch {
namespace topology_internal {

// ---------------------------------------------------------------------------
// Per-device readers. `rel` is always a canonical device directory.

namespace {

template <typename T>
std::optional<T> ReadNumberAttr(const SysfsTree& tree, const std::string& rel, T min, T max) {
  const std::optional<std::string> text = tree.ReadAttr(rel);
  if (!text) {
    tree.Warn(rel, "missing");
    return std::nullopt;
  }
  const std::optional<T> value = ParseDecimal<T>(*text, min, max);
  if (!value) tree.Warn(rel, "malformed value \"" + *text + "\"");
  return value;
}

std::string ReadSchedulerAttr(const SysfsTree& tree, const std::string& rel,
                              std::vector<std::string>* available) {
  const std::optional<std::string> text = tree.ReadAttr(rel);
  if (!text) return "";  // bio-based devices may have no scheduler file
  const std::optional<std::string> scheduler = ParseScheduler(*text);
  if (!scheduler) tree.Warn(rel, "malformed value \"" + *text + "\"");
  else *available = ParseSchedulerList(*text);
  return scheduler.value_or("");
}

// An attribute older kernels or fixtures may lack: absent is 0 without a warning, malformed warns.
uint64_t ReadOptionalCount(const SysfsTree& tree, const std::string& rel) {
  const std::optional<std::string> text = tree.ReadAttr(rel);
  if (!text) return 0;
  const std::optional<uint64_t> value =
      ParseDecimal<uint64_t>(*text, 0, std::numeric_limits<uint64_t>::max());
  if (!value) tree.Warn(rel, "malformed value \"" + *text + "\"");
  return value.value_or(0);
}

}  // namespace

QueueSettings ReadQueue(const SysfsTree& tree, const std::string& disk_rel) {
  QueueSettings queue;
  const std::string dir = disk_rel + "/queue";
  if (!tree.IsDir(dir)) {
    tree.Warn(dir, "missing, queue settings unknown");
    return queue;
  }
  queue.nomerges = ReadNumberAttr<int>(tree, dir + "/nomerges", 0, 2).value_or(-1);
  queue.scheduler = ReadSchedulerAttr(tree, dir + "/scheduler", &queue.available_schedulers);
  queue.max_sectors_kb =
      ReadNumberAttr<uint64_t>(tree, dir + "/max_sectors_kb", 0,
                               std::numeric_limits<uint64_t>::max())
          .value_or(0);
  queue.max_segments =
      ReadNumberAttr<uint32_t>(tree, dir + "/max_segments", 0,
                               std::numeric_limits<uint32_t>::max())
          .value_or(0);
  queue.rotational = ReadNumberAttr<int>(tree, dir + "/rotational", 0, 1).value_or(-1);
  queue.max_hw_sectors_kb = ReadOptionalCount(tree, dir + "/max_hw_sectors_kb");
  queue.optimal_io_bytes = ReadOptionalCount(tree, dir + "/optimal_io_size");
  if (const std::optional<std::string> iostats = tree.ReadAttr(dir + "/iostats")) {
    queue.iostats = ParseDecimal<int>(*iostats, 0, 1).value_or(-1);
    if (queue.iostats < 0) tree.Warn(dir + "/iostats", "malformed value \"" + *iostats + "\"");
  }
  queue.chunk_bytes = ReadOptionalCount(tree, disk_rel + "/md/chunk_size");
  if (queue.chunk_bytes == 0) queue.chunk_bytes = ReadOptionalCount(tree, dir + "/chunk_sectors") * 512;
  // One directory per hardware queue (mq/0, mq/1, ...): the count elevator_get_default() checks.
  if (tree.IsDir(disk_rel + "/mq")) queue.hw_queues = static_cast<int>(tree.ListRealSubdirs(disk_rel + "/mq").size());
  return queue;
}

namespace {

// A loop device without a backing file has no loop/ dir (checked on 6.18),
// yet it is still a loop device and may be attached at any moment.
bool IsUnattachedLoop(const std::string& disk_rel) {
  const std::string prefix = "devices/virtual/block/loop";
  if (!StartsWith(disk_rel, prefix) || disk_rel.size() == prefix.size()) return false;
  const std::string digits = disk_rel.substr(prefix.size());
  return digits.find_first_not_of("0123456789") == std::string::npos;
}

// Decided on the whole disk's directory: partitions share their disk's kind.
DeviceKind Classify(const SysfsTree& tree, const std::string& disk_rel) {
  const std::string path = "/" + disk_rel + "/";
  const auto contains = [&path](const char* needle) {
    return path.find(needle) != std::string::npos;
  };
  if (tree.IsDir(disk_rel + "/dm")) return DeviceKind::kDm;
  if (tree.IsDir(disk_rel + "/md")) return DeviceKind::kMd;
  if (tree.IsDir(disk_rel + "/loop") || IsUnattachedLoop(disk_rel)) return DeviceKind::kLoop;
  // Native NVMe multipath puts the head disk under virtual/nvme-subsystem/.
  if (contains("/nvme/") || contains("/nvme-subsystem/")) return DeviceKind::kNvme;
  // Checked before virtio: a virtio-scsi disk is a SCSI disk on a virtio bus.
  if (tree.IsDir(disk_rel + "/device/scsi_device") ||
      (contains("/host") && contains("/target"))) {
    return DeviceKind::kScsi;
  }
  if (contains("/virtio")) return DeviceKind::kVirtio;
  return DeviceKind::kOther;
}

void ReadDmInfo(const SysfsTree& tree, const std::string& rel, BlockDevice* device) {
  if (!tree.IsDir(rel + "/dm")) return;
  const std::optional<std::string> name = tree.ReadAttr(rel + "/dm/name");
  const std::optional<std::string> uuid = tree.ReadAttr(rel + "/dm/uuid");
  if (!name) tree.Warn(rel + "/dm/name", "missing");
  if (!uuid) tree.Warn(rel + "/dm/uuid", "missing");
  device->dm_name = name.value_or("");
  device->dm_uuid = uuid.value_or("");
  if (!StartsWith(device->dm_uuid, "LVM-")) return;
  const std::optional<LvmName> lvm = ParseLvmName(device->dm_name, device->dm_uuid);
  if (!lvm) {
    tree.Warn(rel + "/dm/name", "cannot split LVM name \"" + device->dm_name + "\"");
    return;
  }
  device->lvm_vg = lvm->vg;
  device->lvm_lv = lvm->lv;
  device->lvm_layer = lvm->layer;
}

// The MEDIUM ROTATION RATE of an sd disk's cached VPD page B1 (binary: page code 0xb1 in byte 1, the rate big-endian
// in bytes 4-5); -1 without the page.
int ReadScsiRotationRate(const SysfsTree& tree, const std::string& disk_rel) {
  const std::optional<std::string> page = tree.ReadAttr(disk_rel + "/device/vpd_pgb1");
  if (!page || page->size() < 6 || static_cast<unsigned char>((*page)[1]) != 0xb1) return -1;
  return static_cast<unsigned char>((*page)[4]) << 8 | static_cast<unsigned char>((*page)[5]);
}

}  // namespace

std::optional<BlockDevice> ReadDevice(const SysfsTree& tree, const std::string& rel,
                                      const QueueSettings* disk_queue) {
  const std::optional<std::string> dev_text = tree.ReadAttr(rel + "/dev");
  BlockDevice device;
  device.name = Basename(rel);
  if (!dev_text) {
    // A native NVMe multipath path disk has no dev_t in sysfs (measured on Debian 6.1): it is
    // hidden, and only its diskseq ties it to the BPF keys of the requests it runs.
    const std::optional<std::string> hidden = tree.ReadAttr(rel + "/hidden");
    device.multipath_head = MultipathHeadOf(device.name).value_or("");
    if (!hidden || *hidden != "1" || device.multipath_head.empty() || !tree.Exists(rel + "/diskseq")) {
      tree.Warn(rel, "no dev file, skipped");
      return std::nullopt;
    }
    device.hidden = true;
  } else {
    const auto dev_number = ParseDevNumber(*dev_text);
    if (!dev_number) {
      tree.Warn(rel + "/dev", "malformed value \"" + *dev_text + "\", device skipped");
      return std::nullopt;
    }
    device.major = dev_number->first;
    device.minor = dev_number->second;
  }
  device.is_partition = tree.Exists(rel + "/partition");
  device.request_based = tree.IsDir((device.is_partition ? Dirname(rel) : rel) + "/mq");
  if (!device.is_partition) {
    const std::optional<std::string> seq = tree.ReadAttr(rel + "/diskseq");
    if (seq) {
      const auto value = ParseDecimal<uint64_t>(*seq, 0, std::numeric_limits<uint64_t>::max());
      if (value) device.diskseq = *value;
      else tree.Warn(rel + "/diskseq", "malformed value \"" + *seq + "\"");
    }
  }
  const std::string disk_rel = device.is_partition ? Dirname(rel) : rel;
  device.disk = Basename(disk_rel);
  device.kind = Classify(tree, disk_rel);
  device.transport = ReadTransport([&tree](const std::string& r) -> std::optional<std::string> {
    const Lookup l = tree.Resolve(r);
    return l.ok() ? std::optional<std::string>(l.rel) : std::nullopt;
  }, disk_rel, device.kind == DeviceKind::kLoop);
  if (device.transport == "sd") device.scsi_rotation_rate = ReadScsiRotationRate(tree, disk_rel);
  ReadDmInfo(tree, rel, &device);
  device.slaves = tree.ListNames(rel + "/slaves");
  device.holders = tree.ListNames(rel + "/holders");
  device.queue = disk_queue != nullptr ? *disk_queue : ReadQueue(tree, disk_rel);
  if (device.kind == DeviceKind::kLoop && !device.is_partition) {
    const std::optional<std::string> dio = tree.ReadAttr(rel + "/loop/dio");  // absent while unattached
    if (dio && (*dio == "0" || *dio == "1")) device.loop_direct_io = *dio == "1" ? 1 : 0;
    else if (dio) tree.Warn(rel + "/loop/dio", "malformed value \"" + *dio + "\"");
  }
  if (device.hidden && device.diskseq == 0) {
    tree.Warn(rel, "hidden disk without a usable diskseq, skipped");
    return std::nullopt;
  }
  return device;
}

std::optional<std::string> ResolveDeviceDir(const SysfsTree& tree, const std::string& link) {
  const Lookup dir = tree.Resolve(link);
  if (!dir.ok()) {
    tree.Warn(link, dir.error);
    return std::nullopt;
  }
  if (!tree.IsDir(dir.rel)) {
    tree.Warn(link, "not a directory");
    return std::nullopt;
  }
  return dir.rel;
}

namespace {

// A disk and the partitions below its directory, in that order.
std::vector<BlockDevice> ReadDiskWithPartitions(const SysfsTree& tree, const std::string& rel,
                                                std::set<std::string>* seen_dirs) {
  std::vector<BlockDevice> found;
  std::optional<BlockDevice> disk = ReadDevice(tree, rel, nullptr);
  if (!disk) return found;
  found.push_back(*disk);
  for (const std::string& sub : tree.ListRealSubdirs(rel)) {
    const std::string part_rel = rel + "/" + sub;
    if (!tree.Exists(part_rel + "/partition")) continue;
    if (!seen_dirs->insert(part_rel).second) continue;
    std::optional<BlockDevice> part = ReadDevice(tree, part_rel, &disk->queue);
    if (part) found.push_back(std::move(*part));
  }
  return found;
}

}  // namespace
}  // namespace topology_internal

// ---------------------------------------------------------------------------
// The walks topology.h declares.

using topology_internal::DevNumberText;
using topology_internal::Lookup;
using topology_internal::ReadDevice;
using topology_internal::ReadDiskWithPartitions;
using topology_internal::ResolveDeviceDir;
using topology_internal::SysfsTree;

Topology Topology::Scan(const std::string& sysfs_root, std::vector<std::string>* warnings) {
  const SysfsTree tree(sysfs_root, warnings);
  if (!tree.IsDir("block")) tree.Warn("block", "missing, no disks found");
  std::vector<BlockDevice> found;
  std::set<std::string> seen_dirs;
  for (const std::string& name : tree.ListNames("block")) {
    const std::optional<std::string> rel = ResolveDeviceDir(tree, "block/" + name);
    if (!rel || !seen_dirs.insert(*rel).second) continue;
    for (BlockDevice& device : ReadDiskWithPartitions(tree, *rel, &seen_dirs)) {
      found.push_back(std::move(device));
    }
  }
  // dev/block also lists partitions and disks that block/ might miss.
  for (const std::string& name : tree.ListNames("dev/block")) {
    const std::optional<std::string> rel = ResolveDeviceDir(tree, "dev/block/" + name);
    if (!rel || !seen_dirs.insert(*rel).second) continue;
    std::optional<BlockDevice> device = ReadDevice(tree, *rel, nullptr);
    if (device) found.push_back(std::move(*device));
  }
  return Topology(std::move(found), warnings);
}

std::optional<BlockDevice> ResolveHiddenDisk(const std::string& sysfs_root, uint64_t diskseq,
                                             std::vector<std::string>* warnings) {
  if (diskseq == 0) return std::nullopt;
  const SysfsTree tree(sysfs_root, warnings);
  const std::string wanted = std::to_string(diskseq);
  for (const std::string& name : tree.ListNames("block")) {
    if (!MultipathHeadOf(name)) continue;  // only multipath path disks are hidden
    const std::optional<std::string> seq = tree.ReadAttr("block/" + name + "/diskseq");
    if (!seq || *seq != wanted) continue;
    const std::optional<std::string> rel = ResolveDeviceDir(tree, "block/" + name);
    if (!rel) return std::nullopt;
    std::optional<BlockDevice> device = ReadDevice(tree, *rel, nullptr);
    if (device && device->hidden && device->diskseq == diskseq) return device;
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<BlockDevice> ResolveDevice(const std::string& sysfs_root, uint32_t major,
                                         uint32_t minor, std::vector<std::string>* warnings) {
  const SysfsTree tree(sysfs_root, warnings);
  const std::string link = "dev/block/" + DevNumberText(major, minor);
  const Lookup dir = tree.Resolve(link);
  if (dir.ok()) {
    std::optional<BlockDevice> device = ReadDevice(tree, dir.rel, nullptr);
    if (device && device->major == major && device->minor == minor) return device;
    if (device) {
      tree.Warn(link, "leads to " + device->name + " with dev " +
                          DevNumberText(device->major, device->minor) + ", rescanning");
    }
  } else if (!dir.missing) {
    tree.Warn(link, dir.error + ", rescanning");
  }
  const Topology topology = Topology::Scan(sysfs_root, warnings);
  const BlockDevice* device = topology.Find(major, minor);
  if (device == nullptr) return std::nullopt;
  return *device;
}

}  // namespace mergewatch
