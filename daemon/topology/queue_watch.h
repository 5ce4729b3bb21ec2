// SPDX-License-Identifier: Apache-2.0
// Writes to a disk's queue/ attributes send no uevent: a runtime `echo 2 > .../queue/nomerges` (a udev
// rule, a tuned profile, an operator) would show only at the next periodic scan
// (--topology.refresh-interval, a minute), and the collapse gauge, the remedy text, the queue gauges and
// the findings would say the old setting for as long. QueueWatch reads the queue attributes the detector
// and the findings use (nomerges every tick; scheduler, max_sectors_kb and rotational every fifth) of every
// watched device again (the detector's disks, in the daemon), and says when one differs from the last scan;
// the caller then rescans. Other devices' settings (the findings') show at the periodic rescan. The four
// files of each watched disk are held open and re-read with pread at offset 0 (sysfs shows the value anew):
// opening them each time cost about 7 times as much (2.87 ms of CPU a second with 100 watched disks against
// 1.82 without the watch; BENCHMARKS.md). That is four descriptors per watched disk, the detector's only
// (a few NVMe disks by default; main raises the soft descriptor limit to the hard one). A file that cannot
// be held (EMFILE) is opened at each read instead.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace mergewatch {

class QueueWatch {
 public:
  // `watched`: which devices (by kernel name) to read; all by default. The daemon passes the detector's
  // disks (--collapse.lower-devices): what a page and its remedy read, at a cost in proportion to them.
  explicit QueueWatch(std::string sysfs_root,
                      std::function<bool(const std::string&)> watched = [](const std::string&) { return true; });
  ~QueueWatch();
  QueueWatch(const QueueWatch&) = delete;
  QueueWatch& operator=(const QueueWatch&) = delete;

  // After a scan: watches the devices with a queue `topology` shows.
  void Follow(const Topology& topology);
  // The first watched device whose queue settings now read other than `topology` says ("" when none):
  // what changed, for the log ("nvme0n1 queue/nomerges 0 -> 2").
  std::string Changed(const Topology& topology);
  size_t watched_devices() const { return devices_.size(); }

 private:
  enum Attribute { kNomerges, kScheduler, kMaxSectorsKb, kRotational, kAttributeCount };
  // The attribute's text now, or nullopt (missing, not a regular file, outside the root, unreadable).
  std::optional<std::string> Read(const std::string& device, Attribute attribute) const;
  std::string sysfs_root_;
  int root_fd_ = -1;  // O_PATH descriptor of the sysfs root, for openat2(RESOLVE_BENEATH)
  std::function<bool(const std::string&)> watched_;
  // A watched device and its held queue/ descriptors by Attribute (-1: opened per read).
  struct Watched {
    std::string name;
    int fds[kAttributeCount] = {-1, -1, -1, -1};
  };
  std::optional<std::string> ReadHeld(const Watched& device, Attribute attribute) const;
  void CloseHeld();
  std::vector<Watched> devices_;
  static constexpr unsigned kSlowEvery = 5;  // all but nomerges: every 5th call
  unsigned calls_ = 0;
};

}  // namespace mergewatch
