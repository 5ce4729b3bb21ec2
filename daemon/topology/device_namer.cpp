// SPDX-License-Identifier: Apache-2.0
#include "topology/device_namer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <vector>

#include "topology/sysfs_beneath.h"
#include "topology/topology.h"


namespace mergewatch {
namespace {

std::optional<std::string> ReadLink(const std::string& path) {
  std::vector<char> buf(4096);
  ssize_t n = readlink(path.c_str(), buf.data(), buf.size());
  if (n <= 0 || static_cast<size_t>(n) >= buf.size()) return std::nullopt;
  return std::string(buf.data(), static_cast<size_t>(n));
}

// The diskseq file opened beneath the sysfs root in one system call (OpenBeneath): the kernel walks
// dev/block/M:m and its symlink itself, for half the cost of ReadSysfsAttribute's walk with one lstat per path
// component (17 against 34 us per device on 6.18; the walk was half of a scrape's CPU, BENCHMARKS.md "Scrape
// cost"). nullopt when openat2 cannot be used: the caller then takes the portable walk.
std::optional<uint64_t> ReadDiskseqBeneath(int root, const std::string& rel) {
  bool unsupported = false;
  const int fd = OpenBeneath(root, rel, &unsupported);
  if (fd < 0) return unsupported ? std::nullopt : std::optional<uint64_t>(0);  // missing or outside: unknown
  char buf[32];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  return strtoull(buf, nullptr, 10);
}

}  // namespace

SysfsDeviceNamer::SysfsDeviceNamer(std::string sysfs_root) : sysfs_root_(std::move(sysfs_root)) {
  root_fd_ = OpenSysfsRoot(sysfs_root_);
}

SysfsDeviceNamer::~SysfsDeviceNamer() {
  if (root_fd_ >= 0) close(root_fd_);
}

// The disk's diskseq, 0 when the file is missing (kernels before 5.15) or unreadable. Read
// with the topology reader's defences: this runs under the scrape, and a FIFO or a symlink
// out of the tree must not block or redirect it.
uint64_t SysfsDeviceNamer::DiskseqOf(const std::string& rel) {
  if (const std::optional<uint64_t> diskseq = ReadDiskseqBeneath(root_fd_, rel)) return *diskseq;
  const std::optional<std::string> text = ReadSysfsAttribute(sysfs_root_, rel);
  return text ? strtoull(text->c_str(), nullptr, 10) : 0;
}

// A key without a dev/block link may be a native NVMe multipath path disk (hidden, no dev_t
// in sysfs): its requests are named after the head namespace, found by the key's diskseq.
// The cache is checked against the path's diskseq file, one read, before it is trusted.
std::optional<std::string> SysfsDeviceNamer::HiddenPathHead(std::pair<uint32_t, uint32_t> key, uint64_t diskseq) {
  auto it = cache_.find(key);
  if (diskseq == 0) {
    if (it != cache_.end()) cache_.erase(it);
    return std::nullopt;
  }
  if (it != cache_.end() && it->second.hidden_diskseq == diskseq &&
      DiskseqOf("block/" + it->second.link_target + "/diskseq") == diskseq)
    return it->second.name;
  std::optional<BlockDevice> path = ResolveHiddenDisk(sysfs_root_, diskseq, nullptr);
  // The head must be a visible device of its own, or there is no series to count under.
  if (!path || access((sysfs_root_ + "/block/" + path->multipath_head + "/dev").c_str(), F_OK) != 0) {
    if (it != cache_.end()) cache_.erase(it);
    return std::nullopt;
  }
  cache_[key] = Entry{path->name, path->multipath_head, diskseq};
  return path->multipath_head;
}

std::optional<std::string> SysfsDeviceNamer::NameOf(uint32_t major, uint32_t minor, uint64_t diskseq) {
  const std::string rel = "dev/block/" + std::to_string(major) + ":" + std::to_string(minor);
  const auto key = std::make_pair(major, minor);
  uint64_t current = 0;
  if (diskseq != 0) {
    // 0 when the number has no device now (or only a hidden path disk): resolved below.
    current = DiskseqOf(rel + "/diskseq");
    if (current != 0 && current != diskseq) return std::nullopt;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (current != 0 && it != cache_.end() && it->second.hidden_diskseq == 0 && it->second.diskseq == current)
      return it->second.name;  // the disk the name was resolved for: no readlink
  }
  // readlink never opens its target: it cannot block.
  std::optional<std::string> target = ReadLink(sysfs_root_ + "/" + rel);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!target) return HiddenPathHead(key, diskseq);
  auto it = cache_.find(key);
  if (it != cache_.end() && it->second.hidden_diskseq == 0 && it->second.link_target == *target) {
    it->second.diskseq = current;
    return it->second.name;
  }

  std::optional<BlockDevice> device = ResolveDevice(sysfs_root_, major, minor, nullptr);
  if (!device) {
    cache_.erase(key);
    return std::nullopt;
  }
  cache_[key] = Entry{*target, device->name, 0, current};
  return device->name;
}

}  // namespace mergewatch
