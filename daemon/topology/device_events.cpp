// SPDX-License-Identifier: Apache-2.0
#include "topology/device_events.h"

#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mergewatch {
namespace {

// A burst of events is read between two rescans; udevd asks for 128 MiB for the same reason.
// Without CAP_NET_ADMIN (the systemd unit) the kernel caps it at net.core.rmem_max.
constexpr int kReceiveBufferBytes = 1 << 20;
// The kernel builds a uevent in a 2 KiB buffer (UEVENT_BUFFER_SIZE) plus the "ACTION@DEVPATH" header.
constexpr size_t kMessageBytes = 8192;

}  // namespace

std::optional<Uevent> ParseKernelUevent(const char* data, size_t size) {
  if (size == 0) return std::nullopt;
  const char* end = data + size;
  const char* header_end = static_cast<const char*>(memchr(data, '\0', size));
  if (header_end == nullptr) return std::nullopt;
  const std::string header(data, header_end);
  const size_t at = header.find('@');
  // libudev's messages start with "libudev\0"; a kernel header always has ACTION@DEVPATH.
  if (at == std::string::npos || at == 0 || at + 1 >= header.size() || header[at + 1] != '/') return std::nullopt;
  Uevent event;
  event.action = header.substr(0, at);
  event.devpath = header.substr(at + 1);
  for (const char* p = header_end + 1; p < end;) {
    const char* field_end = static_cast<const char*>(memchr(p, '\0', end - p));
    if (field_end == nullptr) field_end = end;
    const std::string field(p, field_end);
    const size_t eq = field.find('=');
    if (eq != std::string::npos) {
      const std::string key = field.substr(0, eq);
      if (key == "SUBSYSTEM") event.subsystem = field.substr(eq + 1);
      else if (key == "DEVNAME") event.devname = field.substr(eq + 1);
      else if (key == "ACTION") event.action = field.substr(eq + 1);
    }
    p = field_end + 1;
  }
  return event;
}

void RescanDebouncer::OnEvent(TimePoint now) {
  if (!pending_) first_ = now;
  pending_ = true;
  last_ = now;
}

void RescanDebouncer::Urgent(TimePoint now) {
  pending_ = true;
  first_ = now - max_delay_;
  last_ = now - quiet_;
}

TimePoint RescanDebouncer::due() const { return std::min(last_ + quiet_, first_ + max_delay_); }

void RescanPlanner::Add(const DrainResult& drained, TimePoint now) {
  if (drained.overrun) {
    debouncer_.Urgent(now);
    lost_ = true;
  }
  if (drained.block_events == 0) return;
  events_ += drained.block_events;
  for (const std::string& what : drained.seen)
    if (seen_.size() < DrainResult::kMaxListed && std::find(seen_.begin(), seen_.end(), what) == seen_.end())
      seen_.push_back(what);
  debouncer_.OnEvent(now);
}

std::optional<std::string> RescanPlanner::TakeDue(TimePoint now, bool* events_lost) {
  if (!debouncer_.Due(now)) return std::nullopt;
  std::string why = std::to_string(events_) + " block device events";
  for (size_t i = 0; i < seen_.size(); ++i) why += (i == 0 ? ": " : ", ") + seen_[i];
  if (events_ > static_cast<int>(seen_.size())) why += ", ...";
  if (lost_) why += "; events were lost";
  *events_lost = lost_;
  events_ = 0;
  seen_.clear();
  lost_ = false;
  debouncer_.Done();
  return why;
}

std::unique_ptr<DeviceEventSource> DeviceEventSource::Open(std::string* error) {
  const int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_KOBJECT_UEVENT);
  if (fd < 0) {
    *error = std::string("socket(AF_NETLINK, NETLINK_KOBJECT_UEVENT): ") + strerror(errno);
    return nullptr;
  }
  const int want = kReceiveBufferBytes;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &want, sizeof want) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof want);  // capped at rmem_max; still works
  sockaddr_nl address{};
  address.nl_family = AF_NETLINK;
  address.nl_groups = 1;  // the kernel's group; 2 is udevd's re-broadcast
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    *error = std::string("bind(NETLINK_KOBJECT_UEVENT, group 1): ") + strerror(errno);
    close(fd);
    return nullptr;
  }
  int granted = 0;
  socklen_t length = sizeof granted;
  getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &granted, &length);
  return std::unique_ptr<DeviceEventSource>(new DeviceEventSource(fd, granted));
}

DeviceEventSource::~DeviceEventSource() { close(fd_); }

DrainResult DeviceEventSource::Drain() {
  DrainResult result;
  char buffer[kMessageBytes];
  for (;;) {
    sockaddr_nl sender{};
    iovec iov{buffer, sizeof buffer};
    msghdr message{};
    message.msg_name = &sender;
    message.msg_namelen = sizeof sender;
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    const ssize_t n = recvmsg(fd_, &message, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      // ENOBUFS is reported once, then the socket delivers again: keep reading what is left.
      if (errno == ENOBUFS) {
        result.overrun = true;
        continue;
      }
      break;  // EAGAIN: nothing more queued
    }
    // Only the kernel (port 0) sends on group 1 (userspace needs CAP_NET_ADMIN); checked anyway.
    if (sender.nl_pid != 0) {
      ++result.other_events;
      continue;
    }
    if (message.msg_flags & MSG_TRUNC) {  // cannot tell what it was: rescan to be safe
      ++result.block_events;
      continue;
    }
    const std::optional<Uevent> event = ParseKernelUevent(buffer, static_cast<size_t>(n));
    if (!event || event->subsystem != "block") {
      ++result.other_events;
      continue;
    }
    ++result.block_events;
    const std::string what = event->action + " " + (event->devname.empty() ? event->devpath : event->devname);
    if (result.seen.size() < DrainResult::kMaxListed &&
        std::find(result.seen.begin(), result.seen.end(), what) == result.seen.end())
      result.seen.push_back(what);
  }
  return result;
}

}  // namespace mergewatch
