// SPDX-License-Identifier: Apache-2.0
// Kernel names for the major:minor pairs BPF reports, resolved through sysfs.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace mergewatch {

class DeviceNamer {
 public:
  virtual ~DeviceNamer() = default;
  // The kernel name (nvme0n1, dm-3, loop0), or nullopt if no such device exists now:
  // series of a removed device must disappear. A non-zero diskseq must also match the
  // device's current one: a loop device detached and attached again (or a minor reused
  // by a new disk) is another device, whose predecessor's data must not show.
  virtual std::optional<std::string> NameOf(uint32_t major, uint32_t minor, uint64_t diskseq = 0) = 0;
};

// Resolves through <sysfs>/dev/block/M:m. A device seen for the first time is resolved
// then; each lookup re-reads the symlink (one syscall) and, for a diskseq, the disk's
// diskseq file, so a major:minor reused by another device gets the new name at once and
// its predecessor's data is dropped. A key of a native NVMe multipath path disk (hidden, no
// dev/block link) is named after its head namespace: path requests count under the head.
// Thread-safe.
class SysfsDeviceNamer final : public DeviceNamer {
 public:
  explicit SysfsDeviceNamer(std::string sysfs_root);
  ~SysfsDeviceNamer() override;
  SysfsDeviceNamer(const SysfsDeviceNamer&) = delete;
  SysfsDeviceNamer& operator=(const SysfsDeviceNamer&) = delete;
  std::optional<std::string> NameOf(uint32_t major, uint32_t minor, uint64_t diskseq = 0) override;

 private:
  struct Entry {
    std::string link_target;  // for a hidden path disk: its name under block/
    std::string name;
    uint64_t hidden_diskseq = 0;  // non-zero: a hidden path disk's entry
    // Non-zero: the diskseq the name was resolved under. A disk keeps its kernel name for
    // its life and a diskseq is never reused, so while dev/block/M:m/diskseq reads this
    // value the name needs no readlink.
    uint64_t diskseq = 0;
  };
  uint64_t DiskseqOf(const std::string& rel);
  std::optional<std::string> HiddenPathHead(std::pair<uint32_t, uint32_t> key, uint64_t diskseq);
  std::string sysfs_root_;
  int root_fd_ = -1;  // O_PATH descriptor of sysfs_root_ for openat2; -1: not usable, the portable walk
  std::mutex mutex_;
  std::map<std::pair<uint32_t, uint32_t>, Entry> cache_;
};

}  // namespace mergewatch
