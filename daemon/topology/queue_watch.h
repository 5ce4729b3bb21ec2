// SPDX-License-Identifier: Apache-2.0
// Writes to a disk's queue/ attributes send no uevent: a runtime `echo 2 > .../queue/nomerges` (a udev
// rule, a tuned profile, an operator) would show only at the next periodic scan
// (--topology.refresh-interval, a minute), and the collapse gauge, the remedy text, the queue gauges and
// the findings would say the old setting for as long. QueueWatch keeps the queue attributes the detector
// and the findings read (nomerges, scheduler, max_sectors_kb, rotational) of every device with a queue
// open, re-reads them with one pread each (nomerges every tick, the other three every fifth), and says when
// one differs from the last scan; the caller then rescans.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace mergewatch {

class QueueWatch {
 public:
  explicit QueueWatch(std::string sysfs_root);
  ~QueueWatch();
  QueueWatch(const QueueWatch&) = delete;
  QueueWatch& operator=(const QueueWatch&) = delete;

  // After a scan: watches the devices with a queue `topology` shows (opens what it did not hold, closes
  // what it no longer needs).
  void Follow(const Topology& topology);
  // The first watched device whose queue settings now read other than `topology` says ("" when none):
  // what changed, for the log ("nvme0n1 queue/nomerges 0 -> 2").
  std::string Changed(const Topology& topology);
  size_t watched_files() const;

 private:
  enum Attribute { kNomerges, kScheduler, kMaxSectorsKb, kRotational, kAttributeCount };
  struct Files {
    int fd[kAttributeCount] = {-1, -1, -1, -1};
  };
  int OpenAttribute(const std::string& device, const char* attribute) const;
  void Close(Files* files);
  std::string sysfs_root_;
  int root_fd_ = -1;  // O_PATH descriptor of the sysfs root, for openat2(RESOLVE_BENEATH)
  std::map<std::string, Files> files_;
  static constexpr unsigned kSlowEvery = 5;  // all but nomerges: every 5th call
  unsigned calls_ = 0;
};

}  // namespace mergewatch
