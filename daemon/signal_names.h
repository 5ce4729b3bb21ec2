// SPDX-License-Identifier: Apache-2.0
// Signal abbreviations ("INT" for SIGINT), glibc's sigabbrev_np() without it: that needs glibc 2.32, and
// the release binaries run on 2.31 (Debian 11, Ubuntu 20.04).
#pragma once

namespace mergewatch {

// The abbreviation without "SIG" of a standard signal, as sigabbrev_np() gives it ("POLL" for SIGIO),
// or nullptr for 0, a real-time signal or no signal at all. Async-signal-safe (a switch over literals).
const char* SignalAbbrev(int signo);

}  // namespace mergewatch
