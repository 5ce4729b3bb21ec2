// SPDX-License-Identifier: Apache-2.0
// The graph of the devices a scan found (reading them is device_reader.cpp's): indexes by name,
// dev_t and hidden diskseq, multipath heads and their paths, and the stacking walks over
// slaves/ and holders/. Pure: nothing here touches the file system.
#include "topology/topology.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "topology/sysfs_text.h"

namespace mergewatch {
namespace {

using topology_internal::AppendWarning;
using topology_internal::DevNumberText;

std::string JoinNames(const std::vector<std::string>& names) {
  std::string joined;
  for (const std::string& name : names) {
    if (!joined.empty()) joined += ',';
    joined += name;
  }
  return "[" + joined + "]";
}

std::string DumpLine(const BlockDevice& d) {
  std::ostringstream line;
  line << d.name << " dev=" << DevNumberText(d.major, d.minor)
       << " kind=" << DeviceKindName(d.kind) << " partition=" << (d.is_partition ? 1 : 0)
       << " disk=" << d.disk << " dm_name=\"" << d.dm_name << "\" dm_uuid=\"" << d.dm_uuid
       << "\" lvm_vg=\"" << d.lvm_vg << "\" lvm_lv=\"" << d.lvm_lv << "\" lvm_layer=\""
       << d.lvm_layer << "\" slaves=" << JoinNames(d.slaves)
       << " holders=" << JoinNames(d.holders) << " nomerges=" << d.queue.nomerges
       << " scheduler=\"" << d.queue.scheduler << "\" max_sectors_kb=" << d.queue.max_sectors_kb
       << " max_segments=" << d.queue.max_segments << " rotational=" << d.queue.rotational;
  // Only on multipath devices, so the golden dumps of every other tree stay as they were.
  if (d.hidden) line << " hidden=1 diskseq=" << d.diskseq;
  if (!d.multipath_head.empty()) line << " multipath_head=" << d.multipath_head;
  if (!d.multipath_paths.empty()) line << " multipath_paths=" << JoinNames(d.multipath_paths);
  return line.str();
}

}  // namespace

// ---------------------------------------------------------------------------
// Public functions.

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kNvme: return "nvme";
    case DeviceKind::kScsi: return "scsi";
    case DeviceKind::kVirtio: return "virtio";
    case DeviceKind::kLoop: return "loop";
    case DeviceKind::kDm: return "dm";
    case DeviceKind::kMd: return "md";
    case DeviceKind::kOther: return "other";
  }
  return "other";
}

Topology::Topology(std::vector<BlockDevice> devices, std::vector<std::string>* warnings) {
  std::stable_sort(devices.begin(), devices.end(),
                   [](const BlockDevice& a, const BlockDevice& b) { return a.name < b.name; });
  for (BlockDevice& device : devices) {
    const auto dev_key = std::make_pair(device.major, device.minor);
    // A hidden disk has no dev_t: it is told apart by its diskseq instead.
    const bool duplicate = index_by_name_.count(device.name) != 0 ||
                           (device.hidden ? hidden_by_diskseq_.count(device.diskseq) != 0
                                          : index_by_dev_.count(dev_key) != 0);
    if (duplicate) {
      AppendWarning(warnings, "duplicate device " + device.name + " (" +
                                  (device.hidden ? "diskseq " + std::to_string(device.diskseq)
                                                 : DevNumberText(device.major, device.minor)) +
                                  "), dropped");
      continue;
    }
    device.multipath_paths.clear();  // derived from the paths below, never taken as given
    index_by_name_[device.name] = devices_.size();
    if (device.hidden) {
      hidden_by_diskseq_[device.diskseq] = devices_.size();
    } else {
      index_by_dev_[dev_key] = devices_.size();
    }
    if (device.is_partition) partitions_by_disk_[device.disk].push_back(device.name);
    devices_.push_back(std::move(device));
  }
  for (const BlockDevice& path : devices_) {
    if (path.multipath_head.empty()) continue;
    const auto head = index_by_name_.find(path.multipath_head);
    if (head != index_by_name_.end()) devices_[head->second].multipath_paths.push_back(path.name);
  }
}

Topology Topology::FromDevices(std::vector<BlockDevice> devices) {
  return Topology(std::move(devices), nullptr);
}

std::vector<std::string> Topology::StackedBioBasedDevices() const {
  std::vector<std::string> names;
  for (const BlockDevice& d : devices_)
    if (!d.is_partition && !d.request_based && !d.slaves.empty()) names.push_back(d.name);
  return names;
}

const BlockDevice* Topology::Find(uint32_t major, uint32_t minor) const {
  const auto it = index_by_dev_.find(std::make_pair(major, minor));
  return it == index_by_dev_.end() ? nullptr : &devices_[it->second];
}

const BlockDevice* Topology::FindKey(uint32_t major, uint32_t minor, uint64_t diskseq) const {
  const BlockDevice* device = Find(major, minor);
  if (device != nullptr && (diskseq == 0 || device->diskseq == 0 || device->diskseq == diskseq)) return device;
  if (diskseq == 0) return nullptr;
  const auto hidden = hidden_by_diskseq_.find(diskseq);
  return hidden == hidden_by_diskseq_.end() ? nullptr : &devices_[hidden->second];
}

const BlockDevice* Topology::CountedUnder(uint32_t major, uint32_t minor, uint64_t diskseq) const {
  const BlockDevice* device = FindKey(major, minor, diskseq);
  if (device == nullptr || device->multipath_head.empty()) return device;
  return FindByName(device->multipath_head);
}

const BlockDevice* Topology::FindByName(const std::string& name) const {
  const auto it = index_by_name_.find(name);
  return it == index_by_name_.end() ? nullptr : &devices_[it->second];
}

std::vector<std::string> Topology::DirectHolders(const std::string& name) const {
  std::vector<std::string> holders;
  const BlockDevice* device = FindByName(name);
  if (device == nullptr) return holders;
  holders = device->holders;
  if (device->is_partition) return holders;
  const auto partitions = partitions_by_disk_.find(name);
  if (partitions == partitions_by_disk_.end()) return holders;
  for (const std::string& partition : partitions->second) {
    const std::vector<std::string>& above = FindByName(partition)->holders;
    holders.insert(holders.end(), above.begin(), above.end());
  }
  return holders;
}

std::vector<std::string> Topology::UpperDevices(const std::string& name) const {
  std::vector<std::string> result;
  std::set<std::string> visited{name};
  std::vector<std::string> level = DirectHolders(name);
  while (!level.empty()) {
    std::sort(level.begin(), level.end());
    std::vector<std::string> next_level;
    for (const std::string& upper : level) {
      if (!visited.insert(upper).second) continue;
      result.push_back(upper);
      const std::vector<std::string> above = DirectHolders(upper);
      next_level.insert(next_level.end(), above.begin(), above.end());
    }
    level = std::move(next_level);
  }
  return result;
}

std::string Topology::DiskOf(const std::string& name) const {
  const BlockDevice* device = FindByName(name);
  return device == nullptr ? name : device->disk;
}

std::vector<std::string> Topology::LowerDisks(const std::string& name) const {
  std::set<std::string> bottoms;
  const std::string start = DiskOf(name);
  std::set<std::string> visited{start};
  const BlockDevice* start_device = FindByName(start);
  std::vector<std::string> pending =
      start_device == nullptr ? std::vector<std::string>{} : start_device->slaves;
  while (!pending.empty()) {
    const std::string disk = DiskOf(pending.back());
    pending.pop_back();
    if (!visited.insert(disk).second) continue;
    const BlockDevice* device = FindByName(disk);
    // A slave missing from the topology is still a real device below us.
    if (device == nullptr || device->slaves.empty()) {
      bottoms.insert(disk);
      continue;
    }
    pending.insert(pending.end(), device->slaves.begin(), device->slaves.end());
  }
  return std::vector<std::string>(bottoms.begin(), bottoms.end());
}

std::string Topology::Dump() const {
  std::string dump;
  for (const BlockDevice& device : devices_) dump += DumpLine(device) + "\n";
  return dump;
}

}  // namespace mergewatch
