// SPDX-License-Identifier: Apache-2.0
#include "topology/queue_watch.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <optional>

#include "topology/sysfs_beneath.h"


namespace mergewatch {
namespace {

constexpr const char* kAttributeNames[] = {"nomerges", "scheduler", "max_sectors_kb", "rotational"};

// The attribute's text now: sysfs makes it afresh for each read at offset 0. nullopt when it cannot be read.
std::optional<std::string> ReadAgain(int fd) {
  char buf[512];
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n < 0) return std::nullopt;
  std::string text(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::optional<uint64_t> Number(const std::string& text) {
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

QueueWatch::QueueWatch(std::string sysfs_root) : sysfs_root_(std::move(sysfs_root)) {
  root_fd_ = OpenSysfsRoot(sysfs_root_);
}

QueueWatch::~QueueWatch() {
  for (auto& [name, files] : files_) Close(&files);
  if (root_fd_ >= 0) close(root_fd_);
}

void QueueWatch::Close(Files* files) {
  for (int& fd : files->fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

// block/<device>/queue/<attribute>, opened beneath the root (OpenBeneath). Where openat2 cannot be used
// (before Linux 5.6) nothing is watched: a queue setting then shows at the periodic rescan.
int QueueWatch::OpenAttribute(const std::string& device, const char* attribute) const {
  bool unsupported = false;
  return OpenBeneath(root_fd_, "block/" + device + "/queue/" + attribute, &unsupported);
}

void QueueWatch::Follow(const Topology& topology) {
  std::map<std::string, Files> next;
  for (const BlockDevice& device : topology.devices()) {
    // Every device with a queue the scan could read (a partition shares its disk's).
    if (device.is_partition || device.queue.nomerges < 0 || device.name.find('/') != std::string::npos) continue;
    auto it = files_.find(device.name);
    if (it != files_.end()) {
      next[device.name] = it->second;
      files_.erase(it);
      continue;
    }
    Files& files = next[device.name];
    for (int a = 0; a < kAttributeCount; ++a) files.fd[a] = OpenAttribute(device.name, kAttributeNames[a]);
  }
  for (auto& [name, files] : files_) Close(&files);  // devices the scan no longer shows
  files_ = std::move(next);
}

std::string QueueWatch::Changed(const Topology& topology) {
  // nomerges, what the page and its remedy turn on, every call; the others every kSlowEvery-th (measured
  // with 100 disks: the four every tick cost 0.74 ms of CPU a second, nomerges and the scheduler 0.49 ms,
  // against 1.64 ms for all the rest of the tick; BENCHMARKS.md).
  const bool slow_too = calls_++ % kSlowEvery == 0;
  for (const auto& [name, files] : files_) {
    const BlockDevice* device = topology.FindByName(name);
    if (device == nullptr) continue;
    const QueueSettings& q = device->queue;
    for (int a = 0; a < kAttributeCount; ++a) {
      if (files.fd[a] < 0 || (!slow_too && a != kNomerges)) continue;
      const std::optional<std::string> text = ReadAgain(files.fd[a]);
      if (!text) continue;  // the device is going: its uevent brings the rescan
      std::string was, now = *text;
      bool same = true;
      switch (a) {  // a setting the scan could not read is not compared: it would rescan every tick
        case kNomerges:
          if (q.nomerges < 0) continue;
          was = std::to_string(q.nomerges);
          same = Number(now) == std::optional<uint64_t>(static_cast<uint64_t>(q.nomerges));
          break;
        case kScheduler:
          if (q.scheduler.empty()) continue;
          was = q.scheduler;
          now = ParseScheduler(*text).value_or(*text);
          same = now == q.scheduler;
          break;
        case kMaxSectorsKb:
          if (q.max_sectors_kb == 0) continue;
          was = std::to_string(q.max_sectors_kb);
          same = Number(now) == std::optional<uint64_t>(q.max_sectors_kb);
          break;
        case kRotational:
          if (q.rotational < 0) continue;
          was = std::to_string(q.rotational);
          same = Number(now) == std::optional<uint64_t>(static_cast<uint64_t>(q.rotational));
          break;
      }
      if (!same) return name + " queue/" + kAttributeNames[a] + " " + was + " -> " + now;
    }
  }
  return "";
}

size_t QueueWatch::watched_files() const {
  size_t n = 0;
  for (const auto& [name, files] : files_)
    for (int fd : files.fd) n += fd >= 0;
  return n;
}

}  // namespace mergewatch
