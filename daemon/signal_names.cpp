// SPDX-License-Identifier: Apache-2.0
#include "signal_names.h"

#include <signal.h>

namespace mergewatch {

// The names glibc's sigabbrev_np() returns (its siglist.h), by the signal's number on this architecture.
// Aliases (SIGIOT, SIGCLD, SIGIO) share a number with the name listed; tests/unit/signal_names_test.cpp
// compares every number with sigabbrev_np() where the C library has it.
const char* SignalAbbrev(int signo) {
  switch (signo) {
    case SIGHUP: return "HUP";
    case SIGINT: return "INT";
    case SIGQUIT: return "QUIT";
    case SIGILL: return "ILL";
    case SIGTRAP: return "TRAP";
    case SIGABRT: return "ABRT";
    case SIGBUS: return "BUS";
    case SIGFPE: return "FPE";
    case SIGKILL: return "KILL";
    case SIGUSR1: return "USR1";
    case SIGSEGV: return "SEGV";
    case SIGUSR2: return "USR2";
    case SIGPIPE: return "PIPE";
    case SIGALRM: return "ALRM";
    case SIGTERM: return "TERM";
#ifdef SIGSTKFLT
    case SIGSTKFLT: return "STKFLT";
#endif
    case SIGCHLD: return "CHLD";
    case SIGCONT: return "CONT";
    case SIGSTOP: return "STOP";
    case SIGTSTP: return "TSTP";
    case SIGTTIN: return "TTIN";
    case SIGTTOU: return "TTOU";
    case SIGURG: return "URG";
    case SIGXCPU: return "XCPU";
    case SIGXFSZ: return "XFSZ";
    case SIGVTALRM: return "VTALRM";
    case SIGPROF: return "PROF";
    case SIGWINCH: return "WINCH";
    case SIGPOLL: return "POLL";
#ifdef SIGPWR
    case SIGPWR: return "PWR";
#endif
    case SIGSYS: return "SYS";
    default: return nullptr;
  }
}

}  // namespace mergewatch
