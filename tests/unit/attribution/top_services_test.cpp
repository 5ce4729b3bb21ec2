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

// Ids name "/s<id>", writeback "writeback".
std::string Label(const CgroupRef& c) {
  return c.source == CgroupSource::kWriteback ? "writeback" : "/s" + std::to_string(c.id);
}

std::vector<PairServices> Top(const ServiceCounters& window, const std::set<DevicePair>& collapsed) {
  return TopServices(window, collapsed, Label);
}

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
  const std::vector<PairServices> top = Top(window, {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u) << "the origin pair is not collapsed: no series";
  const PairServices& p = top[0];
  EXPECT_EQ(p.pair, kSnapshotPair);
  ASSERT_EQ(p.services.size(), 4u);
  EXPECT_EQ(p.services[0].cgroup, "/s299");
  EXPECT_EQ(p.services[1].cgroup, "/s298");
  EXPECT_EQ(p.services[2].cgroup, "/s297");
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
  const std::vector<PairServices> top = Top(window, {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u);
  ASSERT_EQ(top[0].services.size(), 3u) << "two services and other";
  EXPECT_DOUBLE_EQ(top[0].services[0].share, 0.97);
  EXPECT_TRUE(top[0].services[2].other);
  EXPECT_EQ(top[0].services[2].requests, 0u);
  EXPECT_DOUBLE_EQ(top[0].services[2].share, 0.0);
}

TEST(TopServices, TiesGoToTheSmallerLabelWhateverTheInsertionOrder) {
  ServiceCounters window;
  for (uint64_t id : {uint64_t{9}, uint64_t{3}, uint64_t{7}, uint64_t{5}}) window[Key(kSnapshotPair, Task(id))] = 50;
  window[Key(kSnapshotPair, {2, CgroupSource::kWriteback})] = 50;  // "writeback" sorts after the paths
  const std::vector<PairServices> top = Top(window, {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u);
  ASSERT_EQ(top[0].services.size(), 4u);
  EXPECT_EQ(top[0].services[0].cgroup, "/s3");
  EXPECT_EQ(top[0].services[1].cgroup, "/s5");
  EXPECT_EQ(top[0].services[2].cgroup, "/s7");
  EXPECT_EQ(top[0].services[3].cgroup, "other");
  EXPECT_EQ(top[0].services[3].requests, 100u) << "/s9 and writeback in other";
}

// A service restarted into a new cgroup (the old id still named for its grace period), or id 0
// and an unknown id both "kernel": one name, one series, the requests summed.
TEST(TopServices, IdsSharingANameAreOneService) {
  auto same = [](const CgroupRef& c) { return c.id >= 100 ? std::string("/backup.slice") : "/s" + std::to_string(c.id); };
  const ServiceCounters window{{Key(kSnapshotPair, Task(100)), 40}, {Key(kSnapshotPair, Task(101)), 50},
                               {Key(kSnapshotPair, Task(5)), 60}};
  const std::vector<PairServices> top = TopServices(window, {kSnapshotPair}, same);
  ASSERT_EQ(top.size(), 1u);
  ASSERT_EQ(top[0].services.size(), 3u);
  EXPECT_EQ(top[0].services[0].cgroup, "/backup.slice");
  EXPECT_EQ(top[0].services[0].requests, 90u);
  EXPECT_EQ(top[0].services[1].cgroup, "/s5");
}

TEST(TopServices, OnlyCollapsedPairsAreNamed) {
  int calls = 0;
  auto counting = [&calls](const CgroupRef& c) {
    ++calls;
    return Label(c);
  };
  const ServiceCounters window{{Key(kSnapshotPair, Task(1)), 10}, {Key(kOriginPair, Task(2)), 20},
                               {Key(kOriginPair, Task(3)), 20}};
  EXPECT_EQ(TopServices(window, {kSnapshotPair}, counting).size(), 1u);
  EXPECT_EQ(calls, 1);
}

TEST(TopServices, PairsWithoutRequestsOrNotCollapsedAreAbsent) {
  EXPECT_TRUE(Top({}, {kSnapshotPair}).empty());
  EXPECT_TRUE(Top({{Key(kSnapshotPair, Task(1)), 0}}, {kSnapshotPair}).empty());
  EXPECT_TRUE(Top({{Key(kSnapshotPair, Task(1)), 10}}, {}).empty());
  const std::vector<PairServices> both =
      Top({{Key(kSnapshotPair, Task(1)), 10}, {Key(kOriginPair, Task(2)), 20}}, {kSnapshotPair, kOriginPair});
  ASSERT_EQ(both.size(), 2u);
  for (const PairServices& p : both) EXPECT_LE(p.services.size(), kTopServices + 1);
}

// Through the window: a cgroup that departs mid-collapse leaves the top, one that is reset
// counts only its requests since the reset.
TEST(TopServices, ACgroupDepartingLeavesTheTop) {
  ServiceWindow window;
  window.Advance({{Key(kSnapshotPair, Task(10)), 1000}, {Key(kSnapshotPair, Task(11)), 10}});
  std::vector<PairServices> top = Top(
      window.Advance({{Key(kSnapshotPair, Task(10)), 1900}, {Key(kSnapshotPair, Task(11)), 20}}), {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].services[0].cgroup, "/s10");
  EXPECT_EQ(top[0].services[0].requests, 900u);
  top = Top(window.Advance({{Key(kSnapshotPair, Task(11)), 60}}), {kSnapshotPair});
  ASSERT_EQ(top.size(), 1u);
  ASSERT_EQ(top[0].services.size(), 2u);
  EXPECT_EQ(top[0].services[0].cgroup, "/s11");
  EXPECT_DOUBLE_EQ(top[0].services[0].share, 1.0);
}

}  // namespace
}  // namespace mergewatch
