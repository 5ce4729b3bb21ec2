// SPDX-License-Identifier: Apache-2.0
// The signals the daemon takes, and what each does. The main loop reads them from a signalfd;
// every thread has them blocked (BlockDaemonSignals, called before the first thread starts).
#pragma once

#include <signal.h>

#include <string>

namespace mergewatch {

// Shut down cleanly: SIGINT, SIGTERM, SIGQUIT (no core dump: there is nothing to debug in a stop
// request) and the default-fatal signals nobody sends a daemon on purpose (timers, SIGXCPU/SIGXFSZ
// limits, SIGPWR...). SIGHUP: rescan. SIGUSR1, SIGUSR2 and the real-time signals: logged and
// ignored (by default they would kill the daemon without a word).
enum class SignalAction { kShutDown, kRescan, kIgnore };
SignalAction ActionFor(int signo);

// Every signal ActionFor decides: what the signalfd reads and BlockDaemonSignals blocks.
sigset_t DaemonSignals();

// "SIGTERM", or "signal 40" for one without a name (the real-time ones).
std::string SignalName(int signo);

// Blocks DaemonSignals() in the calling thread (and so in every thread it starts), ignores
// SIGPIPE, and makes the fault signals (SIGSEGV, SIGABRT...) leave a log line before the process
// dies of them.
void BlockDaemonSignals();

}  // namespace mergewatch
