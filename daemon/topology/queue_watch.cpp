// SPDX-License-Identifier: Apache-2.0
#include "topology/queue_watch.h"

#include <unistd.h>

#include <charconv>
#include <optional>

#include "topology/sysfs_beneath.h"


namespace mergewatch {
namespace {

constexpr const char* kAttributeNames[] = {"nomerges", "scheduler", "max_sectors_kb", "rotational"};

std::string Trimmed(const char* buf, ssize_t n) {
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

QueueWatch::QueueWatch(std::string sysfs_root, std::function<bool(const std::string&)> watched)
    : sysfs_root_(std::move(sysfs_root)), watched_(std::move(watched)) {
  root_fd_ = OpenSysfsRoot(sysfs_root_);
}

QueueWatch::~QueueWatch() {
  CloseHeld();
  if (root_fd_ >= 0) close(root_fd_);
}

void QueueWatch::CloseHeld() {
  for (Watched& device : devices_)
    for (const int fd : device.fds)
      if (fd >= 0) close(fd);
  devices_.clear();
}

// block/<device>/queue/<attribute>, opened beneath the root (OpenBeneath). Where openat2 cannot be used
// (before Linux 5.6) nothing is read: a queue setting then shows at the periodic rescan.
std::optional<std::string> QueueWatch::Read(const std::string& device, Attribute attribute) const {
  bool unsupported = false;
  const int fd = OpenBeneath(root_fd_, "block/" + device + "/queue/" + kAttributeNames[attribute], &unsupported);
  if (fd < 0) return std::nullopt;
  char buf[512];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n < 0) return std::nullopt;
  return Trimmed(buf, n);
}

// A device deleted since Follow fails the pread (ENODEV): nullopt, and its uevent brings the rescan that
// re-opens. A device re-created under the same name between two scans keeps the old, failing descriptors
// until then too.
std::optional<std::string> QueueWatch::ReadHeld(const Watched& device, Attribute attribute) const {
  const int fd = device.fds[attribute];
  if (fd < 0) return Read(device.name, attribute);
  char buf[512];
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n < 0) return std::nullopt;
  return Trimmed(buf, n);
}

void QueueWatch::Follow(const Topology& topology) {
  CloseHeld();
  for (const BlockDevice& device : topology.devices()) {
    // Every device with a queue the scan could read (a partition shares its disk's).
    if (device.is_partition || device.queue.nomerges < 0 || device.name.find('/') != std::string::npos ||
        !watched_(device.name))
      continue;
    Watched watched{device.name};
    for (int a = 0; a < kAttributeCount; ++a) {
      bool unsupported = false;
      watched.fds[a] = OpenBeneath(root_fd_, "block/" + device.name + "/queue/" + kAttributeNames[a], &unsupported);
    }
    devices_.push_back(std::move(watched));
  }
}

std::string QueueWatch::Changed(const Topology& topology) {
  // nomerges, what the page and its remedy turn on, every call; the others every kSlowEvery-th (measured
  // with 100 disks and the files held open: the four every tick cost 0.74 ms of CPU a second, nomerges
  // and the scheduler 0.49 ms, against 1.64 ms for all the rest of the tick; BENCHMARKS.md).
  const bool slow_too = calls_++ % kSlowEvery == 0;
  if (root_fd_ < 0) return "";
  for (const Watched& watched : devices_) {
    const std::string& name = watched.name;
    const BlockDevice* device = topology.FindByName(name);
    if (device == nullptr) continue;
    const QueueSettings& q = device->queue;
    for (int a = 0; a < kAttributeCount; ++a) {
      if (!slow_too && a != kNomerges) continue;
      const std::optional<std::string> text = ReadHeld(watched, static_cast<Attribute>(a));
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

}  // namespace mergewatch
