// SPDX-License-Identifier: Apache-2.0
// Block device add/remove/change events from the kernel's uevent netlink socket
// (NETLINK_KOBJECT_UEVENT, multicast group 1: the kernel's own messages).
//
// Kernel-level rather than libsystemd's sd_device_monitor: its public constructor listens
// to udevd's re-broadcast (group 2), which is silent where no udevd runs (containers, the
// test VM's initramfs, this project's CI host); the topology is read from sysfs, which the
// kernel has updated before it sends the event, so nothing udev adds is needed.
//
// An event carries no data the daemon trusts: it only makes a rescan of sysfs due. Bursts
// (100 loop devices attached by a script) are folded into few rescans by RescanDebouncer.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "clock.h"

namespace mergewatch {

struct Uevent {
  std::string action;     // add, remove, change, move, online, offline, bind, unbind
  std::string devpath;    // /devices/virtual/block/loop3
  std::string subsystem;  // block, bdi, ...
  std::string devname;    // loop3 (may be empty)
};

// Parses one kernel uevent datagram: "ACTION@DEVPATH\0KEY=VALUE\0...". nullopt for anything
// else, including libudev's re-broadcasts ("libudev\0" header) and truncated headers.
std::optional<Uevent> ParseKernelUevent(const char* data, size_t size);

// Folds a burst of events into few rescans: a rescan is due `quiet` after the last event,
// but never later than `max_delay` after the first one not yet rescanned (so a steady
// trickle still gets rescans). Pure: the caller passes the time.
class RescanDebouncer {
 public:
  RescanDebouncer(Duration quiet, Duration max_delay) : quiet_(quiet), max_delay_(max_delay) {}
  void OnEvent(TimePoint now);
  // A rescan as soon as possible (the event stream lost messages).
  void Urgent(TimePoint now);
  bool pending() const { return pending_; }
  // When the pending rescan is due; meaningful only while pending().
  TimePoint due() const;
  bool Due(TimePoint now) const { return pending_ && now >= due(); }
  // The rescan ran: events after this point need another one.
  void Done() { pending_ = false; }

 private:
  Duration quiet_;
  Duration max_delay_;
  bool pending_ = false;
  TimePoint first_{};
  TimePoint last_{};
};

// What one Drain() found on the socket.
struct DrainResult {
  int block_events = 0;   // SUBSYSTEM=block messages from the kernel
  int other_events = 0;   // other subsystems, or not from the kernel: ignored
  bool overrun = false;   // ENOBUFS: the kernel dropped messages; only a full rescan is safe
  // "add loop3", "change loop0": the distinct block events, in order, at most kMaxListed, for the log
  std::vector<std::string> seen;
  static constexpr size_t kMaxListed = 8;
};

// What the main loop does with drained events: block events make a debounced rescan due, lost
// events (ENOBUFS) one at once. Pure: the caller passes the time.
class RescanPlanner {
 public:
  RescanPlanner(Duration quiet, Duration max_delay) : debouncer_(quiet, max_delay) {}
  void Add(const DrainResult& drained, TimePoint now);
  bool pending() const { return debouncer_.pending(); }
  TimePoint due() const { return debouncer_.due(); }
  // When a rescan is due now: what led to it, for the log ("3 block device events: add loop7,
  // ...", "...; events were lost"), and whether events were lost; the caller rescans.
  std::optional<std::string> TakeDue(TimePoint now, bool* events_lost);

 private:
  RescanDebouncer debouncer_;
  int events_ = 0;
  std::vector<std::string> seen_;
  bool lost_ = false;
};

class DeviceEventSource {
 public:
  // nullptr with a reason when the socket cannot be opened (no AF_NETLINK in a sandbox).
  static std::unique_ptr<DeviceEventSource> Open(std::string* error);
  ~DeviceEventSource();
  DeviceEventSource(const DeviceEventSource&) = delete;
  DeviceEventSource& operator=(const DeviceEventSource&) = delete;

  int fd() const { return fd_; }
  // The receive buffer the kernel granted, in bytes (after its doubling).
  int receive_buffer_bytes() const { return rcvbuf_; }
  // Reads every queued message without blocking.
  DrainResult Drain();

 private:
  DeviceEventSource(int fd, int rcvbuf) : fd_(fd), rcvbuf_(rcvbuf) {}
  int fd_;
  int rcvbuf_;
};

}  // namespace mergewatch
