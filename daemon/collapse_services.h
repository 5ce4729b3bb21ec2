// SPDX-License-Identifier: Apache-2.0
// The services behind each collapsed pair, once per tick: the BPF side's cumulative requests per
// (disk, upper device, cgroup) (SnapshotSource::ReadServices) as deltas over the detector's window,
// the pairs whose collapse condition holds picked out by the verdicts' names, and their top
// services named (CgroupNames, TopServices). The glue between the source, the detector's verdicts
// and the attribution core; the parts it joins are pure and tested on their own.
#pragma once

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "attribution/cgroup_names.h"
#include "attribution/top_services.h"
#include "clock.h"
#include "detector/detector.h"
#include "topology/topology.h"

namespace mergewatch {

// What the BPF programs need to know of the host's cgroups (ProbeOptions), and where names come from.
struct CgroupHost {
  std::optional<std::string> mount;  // the cgroup2 mount point; nullopt on a cgroup v1-only host
  uint64_t root_id = 1;              // the cgroup2 root's id (the mount root's KernfsIdOf)
  bool io_on_v1 = false;             // blkio bound to a v1 hierarchy: blkcg ids are not cgroup2's
};
// From a /proc/self/mountinfo text; the root id read from the mount (kept 1 if it cannot be read).
CgroupHost ReadCgroupHost(const std::string& mountinfo);
// From <procfs_root>/self/mountinfo (no file: no cgroup2 mount).
CgroupHost ReadCgroupHostAt(const std::string& procfs_root);

class CollapseServices {
 public:
  CollapseServices(CgroupNames names, Duration window);
  // Named from this host's cgroup2 tree (ReadCgroupHostAt); the log says which, or that there is none.
  static CollapseServices ForHost(const std::string& procfs_root, Duration window);

  // Sets the services of each verdict whose condition holds and that has an upper device;
  // clears them on every other verdict.
  void Update(TimePoint now, const ServiceCounters& counters, const Topology& topology,
              std::vector<DiskVerdict>* verdicts);

 private:
  CgroupNames names_;
  Duration window_;
  ServiceWindow deltas_;
  std::deque<std::pair<TimePoint, ServiceCounters>> recent_;  // each tick's deltas, within window_
};

// "97% /system.slice/backup.service, 3% /db.slice" (the "other" bucket only when it has requests;
// the v1 host's "" as "unattributed (cgroup v1)"); "" when there are none.
std::string ServicesText(const std::vector<ServiceShare>& services);

}  // namespace mergewatch
