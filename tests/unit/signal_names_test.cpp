// SPDX-License-Identifier: Apache-2.0
// SignalAbbrev() stands in for glibc's sigabbrev_np() (glibc >= 2.32) in the daemon: the same answer for
// every number, so log lines read the same whichever glibc the binary was built against.
#include "signal_names.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <string.h>

#include <string>

namespace {

TEST(SignalAbbrev, NamesTheSignalsTheDaemonHandles) {
  EXPECT_STREQ(mergewatch::SignalAbbrev(SIGINT), "INT");
  EXPECT_STREQ(mergewatch::SignalAbbrev(SIGTERM), "TERM");
  EXPECT_STREQ(mergewatch::SignalAbbrev(SIGHUP), "HUP");
  EXPECT_STREQ(mergewatch::SignalAbbrev(SIGSEGV), "SEGV");
  EXPECT_STREQ(mergewatch::SignalAbbrev(SIGABRT), "ABRT");
  EXPECT_STREQ(mergewatch::SignalAbbrev(SIGPWR), "PWR");
}

TEST(SignalAbbrev, NoNameForZeroRealTimeOrOutOfRange) {
  EXPECT_EQ(mergewatch::SignalAbbrev(0), nullptr);
  EXPECT_EQ(mergewatch::SignalAbbrev(-1), nullptr);
  EXPECT_EQ(mergewatch::SignalAbbrev(SIGRTMIN), nullptr);
  EXPECT_EQ(mergewatch::SignalAbbrev(SIGRTMAX), nullptr);
  EXPECT_EQ(mergewatch::SignalAbbrev(NSIG), nullptr);
}

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
TEST(SignalAbbrev, AgreesWithSigabbrevNpForEveryNumber) {
  for (int signo = -1; signo <= NSIG + 1; ++signo) {
    const char* ours = mergewatch::SignalAbbrev(signo);
    const char* glibc = sigabbrev_np(signo);
    EXPECT_EQ(ours == nullptr, glibc == nullptr) << "signal " << signo;
    if (ours != nullptr && glibc != nullptr) {
      EXPECT_STREQ(ours, glibc) << "signal " << signo;
    }
  }
}
#endif

}  // namespace
