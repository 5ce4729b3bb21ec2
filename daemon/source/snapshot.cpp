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

}  // namespace mergewatch
