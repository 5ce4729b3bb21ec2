// SPDX-License-Identifier: Apache-2.0
#include "source/snapshot.h"

#include <cstddef>

namespace mergewatch {

void AccumulateStats(const mw_dev_stats& from, mw_dev_stats* into) {
  // mw_dev_stats is nothing but u64 counters (asserted in abi.h), so add it word by word.
  constexpr size_t kWords = sizeof(mw_dev_stats) / sizeof(__u64);
  const auto* src = reinterpret_cast<const __u64*>(&from);
  auto* dst = reinterpret_cast<__u64*>(into);
  for (size_t i = 0; i < kWords; ++i) dst[i] += src[i];
}

void AccumulateOrigin(const mw_origin_stats& from, mw_origin_stats* into) {
  into->requests += from.requests;
  into->missed_merges += from.missed_merges;
  into->request_bytes += from.request_bytes;
  into->missed_merge_runs += from.missed_merge_runs;
  into->missed_merge_run_bytes += from.missed_merge_run_bytes;
  into->merges += from.merges;
}

const DiskKey* HeadOfDepartedPath(const Snapshot& snapshot, uint32_t major, uint32_t minor, uint64_t diskseq) {
  const auto it = snapshot.path_heads.find(DiskKey{major, minor, diskseq});
  return it == snapshot.path_heads.end() ? nullptr : &it->second;
}

}  // namespace mergewatch
