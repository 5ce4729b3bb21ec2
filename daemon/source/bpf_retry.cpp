// SPDX-License-Identifier: Apache-2.0
#include "source/bpf_retry.h"

#include <algorithm>


namespace mergewatch {

bool BpfRetrySchedule::Failed(TimePoint now, const ProbeFailure& failure) {
  const bool timed_out = failure.kind == ProbeError::kTimeout;
  planned_ = BpfFailureCanPass(failure);
  if (!planned_) return false;
  timeouts_in_a_row_ = timed_out ? timeouts_in_a_row_ + 1 : 0;
  delay_ = interval_;
  for (unsigned i = 0; i < timeouts_in_a_row_ && delay_ < kMaxBpfRetryDelay; ++i) delay_ *= 2;
  delay_ = std::max(interval_, std::min(delay_, kMaxBpfRetryDelay));
  next_ = now + delay_;
  return true;
}

void BpfRetrySchedule::Succeeded() {
  planned_ = false;
  timeouts_in_a_row_ = 0;
}

}  // namespace mergewatch
