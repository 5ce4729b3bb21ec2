// SPDX-License-Identifier: Apache-2.0
// A (disk, upper device) pair's evidence counters for fixtures, in mw_origin_stats' order; the
// per-volume view (dispatched requests, bytes, latency) left at 0.
#pragma once

#include <linux/types.h>

#include <cstdint>

#include "mergewatch/abi.h"

namespace mergewatch {

inline mw_origin_stats PairStats(uint64_t requests, uint64_t missed_merges, uint64_t request_bytes,
                                 uint64_t missed_merge_runs, uint64_t missed_merge_run_bytes, uint64_t merges) {
  mw_origin_stats stats{};
  stats.requests = requests;
  stats.missed_merges = missed_merges;
  stats.request_bytes = request_bytes;
  stats.missed_merge_runs = missed_merge_runs;
  stats.missed_merge_run_bytes = missed_merge_run_bytes;
  stats.merges = merges;
  return stats;
}

}  // namespace mergewatch
