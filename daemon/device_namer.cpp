#include "device_namer.h"

#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "topology.h"

namespace mergewatch {
namespace {

std::optional<std::string> ReadLink(const std::string& path) {
  std::vector<char> buf(4096);
  ssize_t n = readlink(path.c_str(), buf.data(), buf.size());
  if (n <= 0 || static_cast<size_t>(n) >= buf.size()) return std::nullopt;
  return std::string(buf.data(), static_cast<size_t>(n));
}

// The disk's diskseq, 0 when the file is missing (kernels before 5.15) or unreadable. Read
// with the topology reader's defences: this runs under the scrape, and a FIFO or a symlink
// out of the tree must not block or redirect it.
uint64_t ReadDiskseq(const std::string& sysfs_root, const std::string& rel) {
  const std::optional<std::string> text = ReadSysfsAttribute(sysfs_root, rel);
  return text ? strtoull(text->c_str(), nullptr, 10) : 0;
}

}  // namespace

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
      ReadDiskseq(sysfs_root_, "block/" + it->second.link_target + "/diskseq") == diskseq)
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
  // readlink never opens its target: it cannot block.
  std::optional<std::string> target = ReadLink(sysfs_root_ + "/" + rel);
  if (target && diskseq != 0) {
    const uint64_t current = ReadDiskseq(sysfs_root_, rel + "/diskseq");
    if (current != 0 && current != diskseq) return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto key = std::make_pair(major, minor);
  if (!target) return HiddenPathHead(key, diskseq);
  auto it = cache_.find(key);
  if (it != cache_.end() && it->second.hidden_diskseq == 0 && it->second.link_target == *target)
    return it->second.name;

  std::optional<BlockDevice> device = ResolveDevice(sysfs_root_, major, minor, nullptr);
  if (!device) {
    cache_.erase(key);
    return std::nullopt;
  }
  cache_[key] = Entry{*target, device->name, 0};
  return device->name;
}

}  // namespace mergewatch
