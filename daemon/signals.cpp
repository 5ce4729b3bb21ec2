// SPDX-License-Identifier: Apache-2.0
#include "signals.h"

#include <pthread.h>

#include "log.h"
#include "signal_names.h"

namespace mergewatch {
namespace {

// The line a fault signal leaves before the process dies of it (LogFromSignalHandler: async-signal-safe,
// in the configured log format). It re-raises with the default action, so the exit status and a core dump
// are what they would have been.
void LogFaultAndDie(int signo) {
  const char* abbrev = SignalAbbrev(signo);
  const char* parts[] = {"fatal signal SIG", abbrev != nullptr ? abbrev : "?",
                         ": mergewatchd dies (BPF links are detached by the kernel as the process exits)"};
  LogFromSignalHandler(parts, 3);
  signal(signo, SIG_DFL);
  raise(signo);
}

}  // namespace

SignalAction ActionFor(int signo) {
  if (signo == SIGHUP) return SignalAction::kRescan;
  if (signo == SIGUSR1 || signo == SIGUSR2 || signo >= SIGRTMIN) return SignalAction::kIgnore;
  return SignalAction::kShutDown;
}

sigset_t DaemonSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGXCPU,
                    SIGXFSZ, SIGSTKFLT, SIGPWR})
    sigaddset(&set, signo);
  for (int signo = SIGRTMIN; signo <= SIGRTMAX; ++signo) sigaddset(&set, signo);
  return set;
}

std::string SignalName(int signo) {
  const char* abbrev = SignalAbbrev(signo);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

void BlockDaemonSignals() {
  const sigset_t set = DaemonSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A client that goes away mid-response must cost an EPIPE, not the process.
  signal(SIGPIPE, SIG_IGN);
  struct sigaction action {};
  action.sa_handler = LogFaultAndDie;
  action.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  for (int signo : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGSYS, SIGTRAP}) sigaction(signo, &action, nullptr);
}

}  // namespace mergewatch
