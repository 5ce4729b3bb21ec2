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
  // As mw_dev_stats: nothing but u64 counters (asserted in abi.h).
  constexpr size_t kWords = sizeof(mw_origin_stats) / sizeof(__u64);
  const auto* src = reinterpret_cast<const __u64*>(&from);
  auto* dst = reinterpret_cast<__u64*>(into);
  for (size_t i = 0; i < kWords; ++i) dst[i] += src[i];
}

const DiskKey* HeadOfDepartedPath(const Snapshot& snapshot, uint32_t major, uint32_t minor, uint64_t diskseq) {
  const auto it = snapshot.path_heads.find(DiskKey{major, minor, diskseq});
  return it == snapshot.path_heads.end() ? nullptr : &it->second;
}

}  // namespace mergewatch
