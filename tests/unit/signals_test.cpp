// SPDX-License-Identifier: Apache-2.0
#include "signals.h"

#include <gtest/gtest.h>

namespace mergewatch {
namespace {

TEST(Signals, EachSignalTheDaemonTakesHasAnAction) {
  EXPECT_EQ(ActionFor(SIGTERM), SignalAction::kShutDown);
  EXPECT_EQ(ActionFor(SIGINT), SignalAction::kShutDown);
  EXPECT_EQ(ActionFor(SIGQUIT), SignalAction::kShutDown);
  EXPECT_EQ(ActionFor(SIGPWR), SignalAction::kShutDown);
  EXPECT_EQ(ActionFor(SIGHUP), SignalAction::kRescan);
  EXPECT_EQ(ActionFor(SIGUSR1), SignalAction::kIgnore);
  EXPECT_EQ(ActionFor(SIGUSR2), SignalAction::kIgnore);
  EXPECT_EQ(ActionFor(SIGRTMIN + 3), SignalAction::kIgnore);
  const sigset_t set = DaemonSignals();
  for (int signo : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGXCPU, SIGRTMAX}) EXPECT_EQ(sigismember(&set, signo), 1) << signo;
  // Never blocked: the kernel's fault signals and the ones nobody can catch.
  for (int signo : {SIGSEGV, SIGKILL, SIGSTOP, SIGCHLD}) EXPECT_EQ(sigismember(&set, signo), 0) << signo;
}

TEST(Signals, NamesAsTheLogSaysThem) {
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGHUP), "SIGHUP");
  EXPECT_EQ(SignalName(SIGRTMIN + 1), "signal " + std::to_string(SIGRTMIN + 1));
}

}  // namespace
}  // namespace mergewatch
