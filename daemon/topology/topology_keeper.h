// SPDX-License-Identifier: Apache-2.0
// The latest sysfs topology: rescanned periodically (--topology.refresh-interval), on SIGHUP,
// after device events, and when BPF reports a device the last scan did not show (a disk that
// appeared since). Each scan is handed to the OnScan callback (the scrapes' names, the findings).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "clock.h"
#include "topology/queue_watch.h"
#include "topology/topology.h"

namespace mergewatch {

class TopologyKeeper {
 public:
  using Clock = std::function<TimePoint()>;
  // Scans once at construction.
  // `queue_watched`: the devices whose queue settings are read each tick (QueueWatch); all by default.
  TopologyKeeper(std::string sysfs_root, Duration refresh, Clock clock = MonotonicNow,
                 std::function<bool(const std::string&)> queue_watched = [](const std::string&) { return true; });
  // Called with the current topology now and after every scan.
  void OnScan(std::function<void(std::shared_ptr<const Topology>)> on_scan);
  void Rescan();
  // Rescans when the refresh interval has passed, when a watched queue setting changed (QueueWatch: a
  // runtime nomerges change shows at the next tick), or (at most once a second: unknown devices may
  // also be ones gone for good) when a device key is one the last scan did not show.
  // `unknown_device_seen`: the evidence source reported such a key.
  void RefreshIfDue(bool unknown_device_seen);
  // The device at major:minor in the last scan, and the same incarnation of it. A multipath path
  // disk's key is known while its head is (its data counts under the head).
  bool Knows(uint32_t major, uint32_t minor, uint64_t diskseq) const {
    return current_->CountedUnder(major, minor, diskseq) != nullptr;
  }
  std::shared_ptr<const Topology> current() const { return current_; }

 private:
  std::string sysfs_root_;
  Duration refresh_;
  Clock clock_;
  std::shared_ptr<const Topology> current_;
  QueueWatch queue_watch_;
  std::function<void(std::shared_ptr<const Topology>)> on_scan_;
  TimePoint last_scan_{};
  std::set<std::string> reported_warnings_;  // each sysfs warning is logged once
  bool reported_empty_ = false;
};

}  // namespace mergewatch
