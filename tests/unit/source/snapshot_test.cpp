// SPDX-License-Identifier: Apache-2.0
// Walking BPF hash map keys while the daemon deletes some: each key must be summed once; the untimed figure
// and the in-flight counts it leaves out.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <map>
#include <vector>

#include "source/snapshot.h"

namespace {

using mergewatch::VisitEachKeyOnce;

// bpf_map_get_next_key() of a BPF hash map (kernel/bpf/hashtab.c htab_map_get_next_key):
// the key after `prev` in bucket order, and the first key when `prev` is no longer there.
struct FakeHashMap {
  std::vector<int> keys;  // bucket order
  bool NextKey(const int* prev, int* next) const {
    auto it = prev == nullptr ? keys.end() : std::find(keys.begin(), keys.end(), *prev);
    if (it == keys.end()) {
      if (keys.empty()) return false;
      *next = keys.front();  // restart: prev was deleted (or this is the first call)
      return true;
    }
    if (++it == keys.end()) return false;
    *next = *it;
    return true;
  }
};

TEST(VisitEachKeyOnce, KeyDeletedUnderTheWalkDoesNotDoubleTheKeysBeforeIt) {
  FakeHashMap map{{10, 20, 30, 40, 50}};
  std::map<int, int> visits;
  size_t repeated = VisitEachKeyOnce<int>([&](const int* prev, int* next) { return map.NextKey(prev, next); },
                                          [&](const int& key) {
                                            ++visits[key];
                                            // The device of key 30 goes away while the walk stands on it.
                                            if (key == 30) map.keys.erase(map.keys.begin() + 2);
                                          });
  EXPECT_EQ(repeated, 2u);  // 10 and 20 came round again after the restart
  for (int key : {10, 20, 30, 40, 50}) EXPECT_EQ(visits[key], 1) << key;
}

TEST(VisitEachKeyOnce, PlainWalkVisitsEveryKeyOnce) {
  FakeHashMap map{{1, 2, 3}};
  std::vector<int> order;
  EXPECT_EQ(VisitEachKeyOnce<int>([&](const int* prev, int* next) { return map.NextKey(prev, next); },
                                  [&](const int& key) { order.push_back(key); }),
            0u);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  FakeHashMap empty;
  EXPECT_EQ(VisitEachKeyOnce<int>([&](const int* prev, int* next) { return empty.NextKey(prev, next); },
                                  [&](const int&) { ADD_FAILURE() << "no key to visit"; }),
            0u);
}

}  // namespace

namespace mergewatch {
namespace {

// A sysfs root with <root>/dev/block/M:m/inflight holding `text` (the kernel writes "%8u %8u\n").
std::string InFlightRoot(const std::string& name, const std::string& text) {
  const std::string root = testing::TempDir() + "/inflight_" + name;
  std::filesystem::create_directories(root + "/dev/block/7:3");
  std::ofstream(root + "/dev/block/7:3/inflight") << text;
  return root;
}

TEST(ReadInFlight, ReadsAndWritesInFlight) {
  std::array<uint64_t, 2> got{};
  ASSERT_TRUE(ReadInFlight(InFlightRoot("ok", "       2        5\n"), 7, 3, &got));
  EXPECT_EQ(got[0], 2u);
  EXPECT_EQ(got[1], 5u);
}

TEST(ReadInFlight, AMissingOrMalformedFileIsNoCount) {
  std::array<uint64_t, 2> got{9, 9};
  EXPECT_FALSE(ReadInFlight(InFlightRoot("missing", "1 1\n"), 7, 4, &got));
  EXPECT_FALSE(ReadInFlight(InFlightRoot("short", "3\n"), 7, 3, &got));
  EXPECT_FALSE(ReadInFlight(InFlightRoot("junk", "x y\n"), 7, 3, &got));
  EXPECT_EQ(got[0], 9u);
}

// Counted less timed and lost by a reason; never below 0 (a read between a completion's two counts).
TEST(UntimedRequests, CountedLessTimedAndLost) {
  mw_dev_stats stats{};
  stats.size_slots[3] = 10;
  stats.latency_slots[5] = 6;
  stats.latency_lost_inflight_full = 1;
  stats.latency_lost_not_seen = 1;
  EXPECT_EQ(UntimedRequests(stats), 2u);
  stats.latency_slots[6] = 5;
  EXPECT_EQ(UntimedRequests(stats), 0u);
  Snapshot snap;
  snap.stats[DevOpKey{7, 3, 0, 11}] = stats;
  EXPECT_TRUE(InFlightGaps(snap).empty());
  snap.stats[DevOpKey{7, 4, 0, 12}].size_slots[0] = 1;
  const std::set<DiskKey> gaps = InFlightGaps(snap);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(*gaps.begin(), (DiskKey{7, 4, 12}));
}

}  // namespace
}  // namespace mergewatch
