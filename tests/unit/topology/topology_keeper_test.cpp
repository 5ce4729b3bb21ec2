// SPDX-License-Identifier: Apache-2.0
#include "topology/topology_keeper.h"

#include <gtest/gtest.h>

namespace mergewatch {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const std::string kLoops = std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/loop";

struct Scans {
  int count = 0;
  std::shared_ptr<const Topology> last;
};

TEST(TopologyKeeper, ScansAtStartAndHandsEveryScanOn) {
  TimePoint now{};
  TopologyKeeper keeper(kLoops, seconds(60), [&now] { return now; });
  ASSERT_NE(keeper.current()->FindByName("loop12"), nullptr);
  EXPECT_TRUE(keeper.Knows(7, 12, 0));
  EXPECT_FALSE(keeper.Knows(7, 13, 0));
  Scans scans;
  keeper.OnScan([&scans](std::shared_ptr<const Topology> t) {
    ++scans.count;
    scans.last = std::move(t);
  });
  EXPECT_EQ(scans.count, 1);  // the current one, at once
  keeper.Rescan();
  EXPECT_EQ(scans.count, 2);
  EXPECT_EQ(scans.last, keeper.current());
}

TEST(TopologyKeeper, RescansWhenTheIntervalHasPassed) {
  TimePoint now{};
  TopologyKeeper keeper(kLoops, seconds(60), [&now] { return now; });
  Scans scans;
  keeper.OnScan([&scans](std::shared_ptr<const Topology>) { ++scans.count; });
  now += seconds(59);
  keeper.RefreshIfDue(false);
  EXPECT_EQ(scans.count, 1);
  now += seconds(1);
  keeper.RefreshIfDue(false);
  EXPECT_EQ(scans.count, 2);
}

TEST(TopologyKeeper, AnUnknownDeviceRescansAtMostOnceASecond) {
  TimePoint now{};
  TopologyKeeper keeper(kLoops, seconds(60), [&now] { return now; });
  Scans scans;
  keeper.OnScan([&scans](std::shared_ptr<const Topology>) { ++scans.count; });
  now += milliseconds(999);
  keeper.RefreshIfDue(true);
  EXPECT_EQ(scans.count, 1);
  now += milliseconds(1);
  keeper.RefreshIfDue(true);
  EXPECT_EQ(scans.count, 2);
  now += milliseconds(500);
  keeper.RefreshIfDue(true);
  EXPECT_EQ(scans.count, 2);
}

}  // namespace
}  // namespace mergewatch
