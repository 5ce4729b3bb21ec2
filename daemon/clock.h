// SPDX-License-Identifier: Apache-2.0
// The daemon's time: monotonic nanoseconds since an arbitrary epoch. The pure cores take a
// TimePoint as a parameter, so tests drive them with a fake clock; only the edges read the clock.
#pragma once

#include <chrono>

namespace mergewatch {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::nanoseconds;  // monotonic time since an arbitrary epoch

// CLOCK_MONOTONIC now, as a TimePoint.
inline TimePoint MonotonicNow() { return std::chrono::steady_clock::now().time_since_epoch(); }

}  // namespace mergewatch
