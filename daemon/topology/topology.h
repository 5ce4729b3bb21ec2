// SPDX-License-Identifier: Apache-2.0
// Block-device topology read from sysfs: which dev_t is which device, which
// devices are partitions of which disk, and how dm/md devices stack on disks.
//
// Every function takes the sysfs root ("/sys" in production, a fixture tree in
// tests). Symlinks are followed by reading them and resolving the target
// relative to that root; absolute targets and targets that climb out of the
// root are refused with a warning, so a fixture can never read the host /sys.
//
// Nothing here throws for a malformed tree: unreadable or malformed entries
// are reported as human-readable strings appended to `warnings` (which may be
// nullptr), and the well-formed rest of the tree is still returned.
//
// This header is the reader's whole interface; its implementation, from the file system up:
//   sysfs_tree.*     the contained walk every read goes through (and ReadSysfsAttribute);
//   sysfs_text.*     pure parsers of attribute text and device names (ParseScheduler,
//                    ParseLvmName, MultipathHeadOf, dev numbers);
//   device_reader.*  one device's directory into a BlockDevice, and the walks built on it:
//                    Topology::Scan, ResolveDevice, ResolveHiddenDisk;
//   topology.cpp     the graph, pure: indexes, multipath heads, UpperDevices, LowerDisks, Dump.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mergewatch {

enum class DeviceKind { kNvme, kScsi, kVirtio, kLoop, kDm, kMd, kOther };

// "nvme", "scsi", "virtio", "loop", "dm", "md", "other".
const char* DeviceKindName(DeviceKind kind);

// From <disk>/queue/. Fields keep their "unknown" value (-1, "", 0) when the
// file is missing or malformed.
struct QueueSettings {
  int nomerges = -1;  // 0, 1 or 2
  // The active scheduler: the bracketed word of "[none] mq-deadline", or
  // "none" when the file holds just "none" (bio-based devices on newer
  // kernels). Empty when the file is absent (bio-based devices elsewhere).
  std::string scheduler;
  uint64_t max_sectors_kb = 0;
  uint32_t max_segments = 0;
  int rotational = -1;  // 0 or 1
  // What the queue findings (findings/queue_findings.h) compare against; not part of Dump().
  // Every scheduler queue/scheduler lists (built in or loaded), the active one included.
  std::vector<std::string> available_schedulers;
  uint64_t max_hw_sectors_kb = 0;  // queue/max_hw_sectors_kb: the driver's limit
  uint64_t optimal_io_bytes = 0;   // queue/optimal_io_size (0: the device reports none)
  int hw_queues = -1;              // entries of <disk>/mq/ (request-based disks only)
  // queue/iostats: 0 when the kernel keeps no I/O statistics for the disk (/proc/diskstats and
  // /sys/block/X/stat stay still: what the diskstats source reads); -1 where there is no file.
  int iostats = -1;
  // The size a stacked device cuts its bios into, for the split ticket's cause (not part of Dump()):
  // md/chunk_size of an md array, else queue/chunk_sectors in bytes where the driver sets it. 0 when
  // neither gives one: a dm snapshot's queue/chunk_sectors is 0 (measured on Debian's 6.1), and its
  // chunk size is in its table only (a dm ioctl), so the detector names the piece size it saw instead.
  uint64_t chunk_bytes = 0;
};

struct BlockDevice {
  uint32_t major = 0;
  uint32_t minor = 0;
  std::string name;  // kernel name: nvme1n1, nvme1n1p2, dm-3, loop0, sda, md0
  bool is_partition = false;
  // The disk's diskseq (v5.15+): which incarnation of this major:minor. 0 for partitions
  // and on kernels without it. Not part of Dump(): it changes on every loop attach.
  uint64_t diskseq = 0;
  // blk-mq (has an mq/ directory): requests of its own. dm, md, zram, NVMe multipath
  // heads are bio-based: their I/O shows as bios only (block_bio_queue).
  bool request_based = false;
  std::string disk;  // whole-disk name; == name unless is_partition
  // Decided from sysfs shape (resolved path, dm/ md/ loop/ dirs,
  // device/scsi_device), never from the major: 259 is shared by many drivers
  // and the dm major is dynamic.
  DeviceKind kind = DeviceKind::kOther;
  std::string dm_name;  // dm/name
  std::string dm_uuid;  // dm/uuid
  // Set only when dm_uuid starts with "LVM-". lvm_layer is the uuid suffix
  // after "LVM-" + 64 id chars: "real", "cow", "tdata", ... or "" for a
  // top-level LV.
  std::string lvm_vg;
  std::string lvm_lv;
  std::string lvm_layer;
  // Entry names of this device's own slaves/ and holders/ dirs, sorted. For a
  // partition these are the partition's own dirs (a dm on nvme0n1p2 appears
  // in nvme0n1p2's holders, not in nvme0n1's); see Topology::UpperDevices
  // for the disk-level view.
  std::vector<std::string> slaves;
  std::vector<std::string> holders;
  QueueSettings queue;  // of the whole disk; partitions carry a copy
  // Native NVMe multipath (nvme_core.multipath=Y): a path disk nvme<S>c<C>n<N> is hidden
  // (sysfs "hidden" 1, no dev file; major/minor stay 0 here) and is known only by its
  // diskseq, which the BPF keys of its requests carry. multipath_head names the head
  // namespace nvme<S>n<N> its requests are counted under. Empty for every other device.
  bool hidden = false;
  std::string multipath_head;
  // For a multipath head: its path disks, sorted. Filled by Topology from the paths.
  std::vector<std::string> multipath_paths;
  // loop/dio of an attached loop device: 1 in direct I/O mode, 0 buffered, -1 not a loop
  // device or not attached. Before 6.11 the loop driver itself sets nomerges while buffered.
  int loop_direct_io = -1;
  // The disk's driver as sysfs names it ("sd", "virtio_blk", "vbd", "nvme", "loop"; "" unknown): see
  // topology/transport.h. Partitions carry their disk's. Not part of Dump().
  std::string transport;
  // An sd disk's MEDIUM ROTATION RATE from its cached VPD Block Device Characteristics page
  // (<disk>/device/vpd_pgb1, bytes 4-5; the kernel caches and shows page B1 since "scsi: core: Cache VPD
  // pages b0, b1, b2", v5.18): 0 the device does not say, 1 non-rotating, 0x401-0xfffe its rpm. -1 when there
  // is no such page to read (not sd, an older kernel, a device without the page). Not part of Dump().
  int scsi_rotation_rate = -1;
};

// An LVM dm name split into its parts, '--' unescaped to '-'.
struct LvmName {
  std::string vg;
  std::string lv;
  std::string layer;
};

// Splits an LVM dm name "<vg>-<lv>[-<layer>]" (a '-' inside a part is written
// "--"). The layer is taken from `dm_uuid` ("LVM-" + 64 id chars + "-layer")
// because that is what LVM itself uses to tell layers apart. nullopt when
// dm_uuid is not an LVM uuid or dm_name does not split into 2 or 3 parts.
std::optional<LvmName> ParseLvmName(const std::string& dm_name,
                                    const std::string& dm_uuid);

// Parses the content of queue/scheduler as described on
// QueueSettings::scheduler. nullopt for content that is neither bracketed nor
// "none".
std::optional<std::string> ParseScheduler(const std::string& content);

// Every scheduler named in the content of queue/scheduler, brackets dropped, in file order:
// "[none] mq-deadline kyber" -> {none, mq-deadline, kyber}. Empty for empty content.
std::vector<std::string> ParseSchedulerList(const std::string& content);

class Topology {
 public:
  Topology() = default;

  // Scans <root>/block/* (whole disks) and their partitions (subdirs holding
  // a "partition" file), then <root>/dev/block/* for anything not yet seen.
  // Devices without a readable "dev" file are skipped with a warning.
  static Topology Scan(const std::string& sysfs_root,
                       std::vector<std::string>* warnings);

  // Builds a topology from already-parsed devices (for tests of code that
  // consumes a topology). Later duplicates of a name or dev_t are dropped.
  static Topology FromDevices(std::vector<BlockDevice> devices);

  const BlockDevice* Find(uint32_t major, uint32_t minor) const;
  const BlockDevice* FindByName(const std::string& name) const;
  // The device a BPF key (major, minor, diskseq) names: the visible device at major:minor if
  // its diskseq matches (or either is 0), else a hidden multipath path disk with that
  // diskseq (its major:minor is in no sysfs file). nullptr when neither.
  const BlockDevice* FindKey(uint32_t major, uint32_t minor, uint64_t diskseq) const;
  // The device whose series a key's data belongs to: FindKey's device, or for a multipath
  // path disk its head namespace (nullptr while the head is not in the topology).
  const BlockDevice* CountedUnder(uint32_t major, uint32_t minor, uint64_t diskseq) const;
  const std::vector<BlockDevice>& devices() const { return devices_; }  // sorted by name
  // Bio-based devices stacked on other devices (dm, md over disks), sorted: the ones whose
  // bio sizes the detector compares with the disk below.
  std::vector<std::string> StackedBioBasedDevices() const;

  // Devices above `name`, transitively, nearest first (breadth-first, ties by
  // name). For a whole disk this includes what sits on its partitions,
  // because block_rq_* events name the whole disk even for partition I/O:
  // UpperDevices("nvme1n1") finds the dm device on nvme1n1p2.
  std::vector<std::string> UpperDevices(const std::string& name) const;

  // Whole disks at the bottom of the stack below `name` (devices reached
  // through slaves/ that have no slaves themselves), sorted; a partition
  // counts as its disk. LowerDisks("dm-3") == {"nvme1n1"} for
  // dm-3 -> dm-0 -> nvme1n1. Empty for a device with nothing below it.
  std::vector<std::string> LowerDisks(const std::string& name) const;

  // One line per device, every field, sorted by name: for golden files.
  std::string Dump() const;

 private:
  // Sorts by name and indexes; duplicates of a name or dev_t are dropped
  // with a warning (warnings may be nullptr).
  Topology(std::vector<BlockDevice> devices, std::vector<std::string>* warnings);

  // Holders of `name`; for a whole disk also the holders of its partitions.
  std::vector<std::string> DirectHolders(const std::string& name) const;
  // The whole disk of a partition, else `name` itself (also when unknown).
  std::string DiskOf(const std::string& name) const;

  std::vector<BlockDevice> devices_;
  std::map<std::pair<uint32_t, uint32_t>, size_t> index_by_dev_;
  std::map<std::string, size_t> index_by_name_;
  std::map<uint64_t, size_t> hidden_by_diskseq_;
  std::map<std::string, std::vector<std::string>> partitions_by_disk_;
};

// "nvme2c1n1" -> "nvme2n1": the head namespace of a native NVMe multipath path disk, by the
// kernel's naming (nvme_set_disk_name, drivers/nvme/host/multipath.c: "nvme%dc%dn%d" from
// subsystem, controller and namespace instance); nullopt for any other name.
std::optional<std::string> MultipathHeadOf(const std::string& path_disk_name);

// The hidden multipath path disk with this diskseq under <root>/block, read without a full
// scan (one directory listing and one diskseq read per disk); nullopt when none.
std::optional<BlockDevice> ResolveHiddenDisk(const std::string& sysfs_root, uint64_t diskseq,
                                             std::vector<std::string>* warnings);

// Resolves one device without a full scan, for a major:minor that BPF
// reported but the current topology lacks: follows <root>/dev/block/M:m and
// falls back to Topology::Scan when that link is missing or broken. nullopt
// when no such device exists.
std::optional<BlockDevice> ResolveDevice(const std::string& sysfs_root,
                                         uint32_t major, uint32_t minor,
                                         std::vector<std::string>* warnings);

// One attribute, read with the scan's defences: symlinks resolved inside the root only, the
// file opened with O_NOFOLLOW | O_NONBLOCK and read only if it is a regular file (a FIFO or
// device node in the tree never blocks the caller). Trimmed; nullopt when missing or unreadable.
std::optional<std::string> ReadSysfsAttribute(const std::string& sysfs_root, const std::string& rel);

}  // namespace mergewatch
