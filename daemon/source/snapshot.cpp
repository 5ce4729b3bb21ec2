// SPDX-License-Identifier: Apache-2.0
#include "source/snapshot.h"

#include <cstddef>
#include <fstream>

namespace mergewatch {

void AccumulateStats(const mw_dev_stats& from, mw_dev_stats* into) {
  // mw_dev_stats is nothing but u64 counters (asserted in abi.h), so add it word by word.
  constexpr size_t kWords = sizeof(mw_dev_stats) / sizeof(__u64);
  const auto* src = reinterpret_cast<const __u64*>(&from);
  auto* dst = reinterpret_cast<__u64*>(into);
  for (size_t i = 0; i < kWords; ++i) dst[i] += src[i];
}

void AccumulateOrigin(const mw_origin_stats& from, mw_origin_stats* into) {
  // As mw_dev_stats: nothing but u64 counters (asserted in abi.h).
  constexpr size_t kWords = sizeof(mw_origin_stats) / sizeof(__u64);
  const auto* src = reinterpret_cast<const __u64*>(&from);
  auto* dst = reinterpret_cast<__u64*>(into);
  for (size_t i = 0; i < kWords; ++i) dst[i] += src[i];
}

uint64_t UntimedRequests(const mw_dev_stats& stats) {
  uint64_t requests = 0, timed = 0;
  for (uint64_t v : stats.size_slots) requests += v;
  for (uint64_t v : stats.latency_slots) timed += v;
  const uint64_t accounted = timed + stats.latency_lost_inflight_full + stats.latency_lost_not_seen;
  return requests > accounted ? requests - accounted : 0;
}

std::set<DiskKey> InFlightGaps(const Snapshot& snapshot) {
  std::set<DiskKey> disks;
  for (const auto& [key, stats] : snapshot.stats)
    if (UntimedRequests(stats) > 0) disks.insert(DiskKey{key.major, key.minor, key.diskseq});
  return disks;
}

bool ReadInFlight(const std::string& sysfs_root, uint32_t major, uint32_t minor, std::array<uint64_t, 2>* out) {
  const std::string path =
      sysfs_root + "/dev/block/" + std::to_string(major) + ":" + std::to_string(minor) + "/inflight";
  std::ifstream file(path);
  uint64_t reads = 0, writes = 0;
  if (!(file >> reads >> writes)) return false;
  *out = {reads, writes};
  return true;
}

const DiskKey* HeadOfDepartedPath(const Snapshot& snapshot, uint32_t major, uint32_t minor, uint64_t diskseq) {
  const auto it = snapshot.path_heads.find(DiskKey{major, minor, diskseq});
  return it == snapshot.path_heads.end() ? nullptr : &it->second;
}

}  // namespace mergewatch
