// SPDX-License-Identifier: Apache-2.0
// Device events make a rescan due (debounced, device_events.h); without them (no AF_NETLINK in a
// sandbox) the periodic --topology.refresh-interval is all there is, and the log says so.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "clock.h"
#include "topology/device_events.h"
#include "topology/topology_keeper.h"
#include "topology/topology_namer.h"

namespace mergewatch {

// A device attach sends its events within a few ms of each other (block, bdi, partitions); a
// script attaching 100 loop devices sends them 2-20 ms apart. 100 ms of quiet folds either into
// one rescan, and 500 ms at most keeps a device added during steady churn within the 1 s the
// /metrics contract allows (a rescan of 135 devices here: 20-40 ms).
constexpr Duration kEventQuiet = std::chrono::milliseconds(100);
constexpr Duration kEventMaxDelay = std::chrono::milliseconds(500);

class DeviceWatch {
 public:
  // Opens the uevent socket, or logs why there is none.
  DeviceWatch();
  // The socket the main loop polls; -1 without device events.
  int fd() const { return source_ ? source_->fd() : -1; }
  // Whether the socket holds messages not yet read, or an error (ENOBUFS): one poll(), from any
  // thread. Only the main loop reads the socket.
  bool Unread() const;
  // `names` is distrusted before the read (topology_namer.cpp says why that order) and published
  // again after it: trusted unless the events make a rescan pending.
  void OnReadable(TimePoint now, TopologyNames* names, const TopologyKeeper& topology);
  bool pending() const { return planner_.pending(); }
  TimePoint due() const { return planner_.due(); }
  std::optional<std::string> TakeDue(TimePoint now, bool* events_lost) { return planner_.TakeDue(now, events_lost); }

 private:
  std::unique_ptr<DeviceEventSource> source_;
  RescanPlanner planner_;
};

}  // namespace mergewatch
