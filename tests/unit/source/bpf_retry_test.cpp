// SPDX-License-Identifier: Apache-2.0
#include "source/bpf_retry.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

namespace mergewatch {
namespace {

using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;

TEST(BpfRetrySchedule, AFailureThatCanPassIsTriedAgainAfterTheInterval) {
  BpfRetrySchedule retry(minutes(1));
  EXPECT_FALSE(retry.planned());
  EXPECT_FALSE(retry.Due(hours(5)));
  ASSERT_TRUE(retry.Failed(seconds(100), {ProbeError::kLoad, ENOMEM, std::string("tp_btf: ") + strerror(ENOMEM)}));
  EXPECT_EQ(retry.delay(), minutes(1));
  EXPECT_FALSE(retry.Due(seconds(159)));
  EXPECT_TRUE(retry.Due(seconds(160)));
}

TEST(BpfRetrySchedule, ACauseThatNeedsAnOperatorIsNotTriedAgain) {
  BpfRetrySchedule retry(minutes(1));
  EXPECT_FALSE(retry.Failed(seconds(0), {ProbeError::kNoPrivilege, EPERM, strerror(EPERM)}));
  EXPECT_FALSE(retry.Failed(seconds(0), {ProbeError::kLockdown, EINVAL, "lockdown"}));
  EXPECT_FALSE(retry.Failed(seconds(0), {ProbeError::kLoad, EINVAL, "the verifier said no"}));
  EXPECT_FALSE(retry.planned());
  EXPECT_FALSE(retry.Due(hours(100)));
}

TEST(BpfRetrySchedule, TimeoutsInARowDoubleTheWaitUpToAnHour) {
  BpfRetrySchedule retry(minutes(1));
  TimePoint now{};
  const Duration expected[] = {minutes(2), minutes(4), minutes(8), minutes(16), minutes(32), hours(1), hours(1)};
  for (Duration want : expected) {
    ASSERT_TRUE(retry.Failed(now, {ProbeError::kTimeout, 0, "no answer"}));
    EXPECT_EQ(retry.delay(), want);
    EXPECT_FALSE(retry.Due(now + want - seconds(1)));
    now += want;
    EXPECT_TRUE(retry.Due(now));
  }
}

TEST(BpfRetrySchedule, AnotherFailureOrASuccessEndsTheBackOff) {
  BpfRetrySchedule retry(seconds(10));
  retry.Failed(seconds(0), {ProbeError::kTimeout, 0, "no answer"});
  retry.Failed(seconds(20), {ProbeError::kTimeout, 0, "no answer"});
  EXPECT_EQ(retry.delay(), seconds(40));
  retry.Failed(seconds(60), {ProbeError::kLoad, EBUSY, strerror(EBUSY)});
  EXPECT_EQ(retry.delay(), seconds(10));
  retry.Failed(seconds(70), {ProbeError::kTimeout, 0, "no answer"});
  EXPECT_EQ(retry.delay(), seconds(20));
  retry.Succeeded();
  EXPECT_FALSE(retry.planned());
  retry.Failed(seconds(500), {ProbeError::kTimeout, 0, "no answer"});
  EXPECT_EQ(retry.delay(), seconds(20));
}

TEST(BpfRetrySchedule, AnIntervalLongerThanTheCapIsKept) {
  BpfRetrySchedule retry(hours(2));
  retry.Failed(seconds(0), {ProbeError::kTimeout, 0, "no answer"});
  EXPECT_EQ(retry.delay(), hours(2));
}

}  // namespace
}  // namespace mergewatch
