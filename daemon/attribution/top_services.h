// SPDX-License-Identifier: Apache-2.0
// The services behind a collapsed (disk, upper device) pair: from cumulative per-(pair, cgroup)
// request counters, as a map snapshot will give them, each window's per-cgroup requests and
// shares, and the top 3 plus an "other" bucket for the rest. The bound: at most 4 series per
// pair, and only for the pairs the caller says are collapsed; on a host with 200 cgroups writing
// to a collapsed pair that is still 4 series. Pure: counters in, shares out; the caller names
// the cgroups (CgroupNames) and the devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "attribution/cgroup_names.h"

namespace mergewatch {

// A (disk, upper device) pair, as the remap chain attributes a request: the disk the request was
// issued to and the device its first bio was submitted to.
struct DevicePair {
  uint32_t disk_major = 0, disk_minor = 0;
  uint32_t upper_major = 0, upper_minor = 0;
  uint64_t disk_diskseq = 0;  // as every snapshot key (DiskKey): a reused major:minor is another disk

  auto Tied() const { return std::tie(disk_major, disk_minor, upper_major, upper_minor, disk_diskseq); }
  bool operator<(const DevicePair& o) const { return Tied() < o.Tied(); }
  bool operator==(const DevicePair& o) const { return Tied() == o.Tied(); }
};

// A cgroup as the BPF side records it: the id and how it came by it (the same id is a service
// or "writeback" depending on the source).
struct CgroupRef {
  uint64_t id = 0;
  CgroupSource source = CgroupSource::kTask;

  bool operator<(const CgroupRef& o) const { return std::tie(id, source) < std::tie(o.id, o.source); }
  bool operator==(const CgroupRef& o) const { return id == o.id && source == o.source; }
};

struct ServiceCounterKey {
  DevicePair pair;
  CgroupRef cgroup;

  bool operator<(const ServiceCounterKey& o) const { return std::tie(pair, cgroup) < std::tie(o.pair, o.cgroup); }
  bool operator==(const ServiceCounterKey& o) const { return pair == o.pair && cgroup == o.cgroup; }
};

// Cumulative requests per (pair, cgroup) since the map entry was made. An entry may vanish (its
// device departed, or the map evicted it) and come back from zero.
using ServiceCounters = std::map<ServiceCounterKey, uint64_t>;

inline constexpr size_t kTopServices = 3;  // named per collapsed pair, beside "other"

struct ServiceShare {
  bool other = false;  // the bucket of every cgroup below the top 3, cgroup "other"
  std::string cgroup;  // the label: a path, "kernel", "writeback", "" (v1 host) or "other"
  uint64_t requests = 0;  // in the window
  double share = 0;       // of the pair's requests in the window, 0..1
};

struct PairServices {
  DevicePair pair;
  uint64_t requests = 0;                // the pair's requests in the window, all cgroups
  std::vector<ServiceShare> services;  // the top ones by requests, then "other": at most 4
};

// The window's deltas of a set of cumulative counters. A counter smaller than the last one was
// reset (a new map entry for a key that departed): its delta is its whole value, the requests
// since the reset. A key seen for the first time after the first window counts whole too: its
// entry was made during the window. The first call only sets the baseline: the counters then
// hold everything since the daemon (or the BPF side) started, not one window.
class ServiceWindow {
 public:
  // Deltas of every key with requests in the window, and the counters remembered as the baseline
  // of the next one (departed keys forgotten, so nothing grows past the map's own size).
  ServiceCounters Advance(const ServiceCounters& now);

 private:
  ServiceCounters last_;
  bool primed_ = false;
};

// The label of a cgroup: LabelOf(CgroupNames::Name(...)) in the daemon.
using CgroupLabeler = std::function<std::string(const CgroupRef&)>;

inline constexpr char kOtherCgroup[] = "other";  // never a path: paths start with '/'

// The top services of each collapsed pair in one window's deltas. Ranked by label, not by id:
// ids that share a name (a service restarted into a new cgroup while the old one is named for
// its grace period, id 0 and unknown ids as "kernel", every id on a v1 host) are one service
// and must be one series, or the scrape would hold the same series twice. Per pair with
// requests: the kTopServices labels with the most requests, in descending order (ties: the
// smaller label first, so equal services do not swap between scrapes), then "other", always
// present (0 when there is no rest), so a pair's shares sum to 1 and the bucket's series does
// not come and go. Pairs not in `collapsed`, or without requests, are absent, and their
// cgroups are not named (label is called for collapsed pairs only).
std::vector<PairServices> TopServices(const ServiceCounters& window, const std::set<DevicePair>& collapsed,
                                      const CgroupLabeler& label);

}  // namespace mergewatch
