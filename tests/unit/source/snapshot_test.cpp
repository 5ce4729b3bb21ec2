// SPDX-License-Identifier: Apache-2.0
// Walking BPF hash map keys while the daemon deletes some: each key must be summed once.
#include <gtest/gtest.h>

#include <algorithm>
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
