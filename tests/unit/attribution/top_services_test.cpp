// SPDX-License-Identifier: Apache-2.0
// The window's deltas of cumulative per-(pair, cgroup) counters, and the top 3 plus "other" of
// each collapsed pair: the bound, the bucket, ties, resets, departures.
#include "attribution/top_services.h"

#include <gtest/gtest.h>

namespace mergewatch {
namespace {

const DevicePair kSnapshotPair{259, 0, 253, 4};  // nvme0n1 <- dm-4, the snapshot
const DevicePair kOriginPair{259, 0, 253, 1};

CgroupRef Task(uint64_t id) { return {id, CgroupSource::kTask}; }

ServiceCounterKey Key(const DevicePair& pair, CgroupRef cgroup) { return {pair, cgroup}; }

uint64_t Sum(const PairServices& p) {
  uint64_t sum = 0;
  for (const ServiceShare& s : p.services) sum += s.requests;
  return sum;
}

TEST(ServiceWindow, TheFirstSnapshotIsOnlyTheBaseline) {
  ServiceWindow window;
  EXPECT_TRUE(window.Advance({{Key(kSnapshotPair, Task(10)), 5000}}).empty());
  const ServiceCounters second = window.Advance({{Key(kSnapshotPair, Task(10)), 5300}});
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second.at(Key(kSnapshotPair, Task(10))), 300u);
}

TEST(ServiceWindow, ResetsNewKeysAndDepartures) {
  ServiceWindow window;
  window.Advance({{Key(kSnapshotPair, Task(10)), 5000}, {Key(kSnapshotPair, Task(11)), 70}});
  // 10 was reset (its entry evicted and made again: 40 since), 11 departed, 12 is new.
  ServiceCounters w = window.Advance({{Key(kSnapshotPair, Task(10)), 40}, {Key(kSnapshotPair, Task(12)), 9}});
  EXPECT_EQ(w, (ServiceCounters{{Key(kSnapshotPair, Task(10)), 40}, {Key(kSnapshotPair, Task(12)), 9}}));
  // 11 comes back: its old value was forgotten, so all 3 are this window's.
  w = window.Advance({{Key(kSnapshotPair, Task(10)), 40}, {Key(kSnapshotPair, Task(11)), 3}});
  EXPECT_EQ(w, (ServiceCounters{{Key(kSnapshotPair, Task(11)), 3}})) << "unchanged counters have no delta";
}

TEST(TopServices, TwoHundredCgroupsMakeFourSeriesPerCollapsedPair) {
  ServiceCounters window;
  for (uint64_t id = 100; id < 300; ++id) {
    window[Key(kSnapshotPair, Task(id))] = id;  // 299, 298 and 297 the most
    window[Key(kOriginPair, Task(id))] = 1;
  }
  const std::vector<PairServices> top = TopServices(window, {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u) << "the origin pair is not collapsed: no series";
  const PairServices& p = top[0];
  EXPECT_EQ(p.pair, kSnapshotPair);
  ASSERT_EQ(p.services.size(), 4u);
  EXPECT_EQ(p.services[0].cgroup, Task(299));
  EXPECT_EQ(p.services[1].cgroup, Task(298));
  EXPECT_EQ(p.services[2].cgroup, Task(297));
  EXPECT_TRUE(p.services[3].other);
  const uint64_t total = (100 + 299) * 200 / 2;
  EXPECT_EQ(p.requests, total);
  EXPECT_EQ(p.services[3].requests, total - 299 - 298 - 297);
  EXPECT_EQ(Sum(p), total);
  double shares = 0;
  for (const ServiceShare& s : p.services) shares += s.share;
  EXPECT_DOUBLE_EQ(shares, 1.0);
  EXPECT_DOUBLE_EQ(p.services[0].share, 299.0 / total);
}

TEST(TopServices, OneServiceIsItsWholeShareAndOtherIsZero) {
  const ServiceCounters window{{Key(kSnapshotPair, Task(11)), 970}, {Key(kSnapshotPair, Task(12)), 30}};
  const std::vector<PairServices> top = TopServices(window, {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u);
  ASSERT_EQ(top[0].services.size(), 3u) << "two services and other";
  EXPECT_DOUBLE_EQ(top[0].services[0].share, 0.97);
  EXPECT_TRUE(top[0].services[2].other);
  EXPECT_EQ(top[0].services[2].requests, 0u);
  EXPECT_DOUBLE_EQ(top[0].services[2].share, 0.0);
}

TEST(TopServices, TiesGoToTheSmallerCgroupWhateverTheInsertionOrder) {
  ServiceCounters window;
  for (uint64_t id : {uint64_t{9}, uint64_t{3}, uint64_t{7}, uint64_t{5}}) window[Key(kSnapshotPair, Task(id))] = 50;
  window[Key(kSnapshotPair, {3, CgroupSource::kWriteback})] = 50;  // same id, another source: its own cgroup
  const std::vector<PairServices> top = TopServices(window, {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].services[0].cgroup, Task(3));
  EXPECT_EQ(top[0].services[1].cgroup, (CgroupRef{3, CgroupSource::kWriteback}));
  EXPECT_EQ(top[0].services[2].cgroup, Task(5));
  EXPECT_EQ(top[0].services[3].requests, 100u) << "7 and 9 in other";
}

TEST(TopServices, PairsWithoutRequestsOrNotCollapsedAreAbsent) {
  EXPECT_TRUE(TopServices({}, {kSnapshotPair}).empty());
  EXPECT_TRUE(TopServices({{Key(kSnapshotPair, Task(1)), 0}}, {kSnapshotPair}).empty());
  EXPECT_TRUE(TopServices({{Key(kSnapshotPair, Task(1)), 10}}, {}).empty());
  const std::vector<PairServices> both =
      TopServices({{Key(kSnapshotPair, Task(1)), 10}, {Key(kOriginPair, Task(2)), 20}}, {kSnapshotPair, kOriginPair});
  ASSERT_EQ(both.size(), 2u);
  for (const PairServices& p : both) EXPECT_LE(p.services.size(), kTopServices + 1);
}

// Through the window: a cgroup that departs mid-collapse leaves the top, one that is reset
// counts only its requests since the reset.
TEST(TopServices, ACgroupDepartingLeavesTheTop) {
  ServiceWindow window;
  window.Advance({{Key(kSnapshotPair, Task(10)), 1000}, {Key(kSnapshotPair, Task(11)), 10}});
  std::vector<PairServices> top = TopServices(
      window.Advance({{Key(kSnapshotPair, Task(10)), 1900}, {Key(kSnapshotPair, Task(11)), 20}}), {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].services[0].cgroup, Task(10));
  EXPECT_EQ(top[0].services[0].requests, 900u);
  top = TopServices(window.Advance({{Key(kSnapshotPair, Task(11)), 60}}), {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u);
  ASSERT_EQ(top[0].services.size(), 2u);
  EXPECT_EQ(top[0].services[0].cgroup, Task(11));
  EXPECT_DOUBLE_EQ(top[0].services[0].share, 1.0);
}

}  // namespace
}  // namespace mergewatch
