// SPDX-License-Identifier: Apache-2.0
// When the daemon tries to load BPF again after a load that failed for a cause that can pass
// (ENOMEM while a memory cgroup is full, EBUSY, a loader that did not answer in time). Pure: the
// time is a parameter.
#pragma once

#include <string>

#include "clock.h"
#include "source/bpf_loader.h"

namespace mergewatch {

// The longest wait between two tries after loads that timed out: a loader that hangs (a verifier
// stuck on a sick kernel, a frozen cgroup) is not started every minute for ever.
constexpr Duration kMaxBpfRetryDelay = std::chrono::hours(1);

class BpfRetrySchedule {
 public:
  // `interval`: --topology.refresh-interval, the wait after a failure that can pass.
  explicit BpfRetrySchedule(Duration interval) : interval_(interval) {}
  // A load failed at `now`. Plans the next try if the cause can pass (BpfFailureCanPass, or
  // kTimeout): after the interval, doubled for each timeout in a row (up to kMaxBpfRetryDelay).
  // Returns whether a try is planned.
  bool Failed(TimePoint now, const ProbeFailure& failure);
  // A load succeeded: nothing is planned, and the timeouts are forgotten.
  void Succeeded();
  bool planned() const { return planned_; }
  // A planned try is due; false when none is planned.
  bool Due(TimePoint now) const { return planned_ && now >= next_; }
  // How long after the last failure the planned try comes.
  Duration delay() const { return delay_; }

 private:
  Duration interval_;
  bool planned_ = false;
  TimePoint next_{};
  Duration delay_{};
  unsigned timeouts_in_a_row_ = 0;
};

}  // namespace mergewatch
