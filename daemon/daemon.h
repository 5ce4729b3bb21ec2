// SPDX-License-Identifier: Apache-2.0
// The daemon's lifecycle: listen, load and attach BPF, notify systemd, serve scrapes
// until SIGINT/SIGTERM, then detach everything.
#pragma once

#include "config.h"

namespace mergewatch {

// Returns the process exit code (exit_codes.h). Expects SIGINT, SIGTERM and SIGHUP to be
// blocked in every thread already (BlockDaemonSignals, signals.h), so that they are only ever
// received by the main loop's sigtimedwait.
int RunDaemon(const Config& config);

}  // namespace mergewatch
