#include "device_namer.h"

#include <fcntl.h>
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

// The disk's diskseq, 0 when the file is missing (kernels before 5.15) or unreadable.
uint64_t ReadDiskseq(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[32];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  return strtoull(buf, nullptr, 10);
}

}  // namespace

std::optional<std::string> SysfsDeviceNamer::NameOf(uint32_t major, uint32_t minor, uint64_t diskseq) {
  std::string link = sysfs_root_ + "/dev/block/" + std::to_string(major) + ":" + std::to_string(minor);
  std::optional<std::string> target = ReadLink(link);
  if (target && diskseq != 0) {
    const uint64_t current = ReadDiskseq(link + "/diskseq");
    if (current != 0 && current != diskseq) return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto key = std::make_pair(major, minor);
  if (!target) {
    cache_.erase(key);
    return std::nullopt;
  }
  auto it = cache_.find(key);
  if (it != cache_.end() && it->second.link_target == *target) return it->second.name;

  std::optional<BlockDevice> device = ResolveDevice(sysfs_root_, major, minor, nullptr);
  if (!device) {
    cache_.erase(key);
    return std::nullopt;
  }
  cache_[key] = Entry{*target, device->name};
  return device->name;
}

}  // namespace mergewatch
