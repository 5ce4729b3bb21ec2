// SPDX-License-Identifier: Apache-2.0
// A multipath head's counters never go backwards while the head lives: a path
// controller deleted (delete_controller, ctrl_loss_tmo) takes its path disk's BPF keys, and what
// that path counted stays under the head's key.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/unit/source/pair_stats.h"
#include "source/departed_paths.h"
#include "source/source.h"
#include "topology/topology.h"

namespace {

using namespace mergewatch;

constexpr uint32_t kNvmeMajor = 259, kDmMajor = 253;
constexpr uint32_t kRead = 0, kWrite = 1;
// The head nvme2n1 at 259:2 (diskseq 5); its paths nvme2c1n1 (key 259:1, diskseq 11) and nvme2c2n1
// (key 259:4, diskseq 12) are hidden: no dev_t in sysfs, known by diskseq only; dm-0 (an LV) on the head.
const DevOpKey kPath1Read{kNvmeMajor, 1, kRead, 11}, kPath1Write{kNvmeMajor, 1, kWrite, 11};
const DevOpKey kPath2Read{kNvmeMajor, 4, kRead, 12};
const DevOpKey kHeadRead{kNvmeMajor, 2, kRead, 5}, kHeadWrite{kNvmeMajor, 2, kWrite, 5};

BlockDevice Device(const std::string& name, uint32_t major, uint32_t minor, uint64_t diskseq) {
  BlockDevice d;
  d.name = d.disk = name;
  d.kind = DeviceKind::kNvme;
  d.major = major;
  d.minor = minor;
  d.diskseq = diskseq;
  return d;
}

BlockDevice Path(int controller, uint64_t diskseq) {
  BlockDevice p = Device("nvme2c" + std::to_string(controller) + "n1", 0, 0, diskseq);
  p.hidden = true;
  p.multipath_head = "nvme2n1";
  return p;
}

// The topology with the given paths still present (and the head, unless `head` is false).
Topology Stack(std::vector<int> controllers, bool head = true, uint64_t head_diskseq = 5) {
  std::vector<BlockDevice> devices;
  if (head) devices.push_back(Device("nvme2n1", kNvmeMajor, 2, head_diskseq));
  BlockDevice lv = Device("dm-0", kDmMajor, 0, 0);
  lv.kind = DeviceKind::kDm;
  devices.push_back(lv);
  for (int c : controllers) devices.push_back(Path(c, static_cast<uint64_t>(10 + c)));
  return Topology::FromDevices(devices);
}

mw_dev_stats Requests(uint64_t n, uint64_t missed = 0) {
  mw_dev_stats s{};
  s.size_slots[mw_hist_slot(4096, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS)] = n;
  s.size_sum_bytes = n * 4096;
  s.missed_merges = missed;
  s.latency_slots[3] = n;
  s.latency_sum_ns = n * 1000;
  return s;
}

uint64_t RequestCount(const mw_dev_stats& s) {
  uint64_t n = 0;
  for (uint64_t v : s.size_slots) n += v;
  return n;
}

// What the exporter and the detector see as the head's: every key counted under nvme2n1.
struct HeadSums {
  uint64_t requests = 0, bytes = 0, missed = 0, latency_count = 0, remapped = 0;
};
HeadSums SumsOfHead(const Snapshot& s, const Topology& t) {
  HeadSums sums;
  for (const auto& [key, stats] : s.stats) {
    const BlockDevice* d = DeviceCountingKey(s, t, key.major, key.minor, key.diskseq);
    if (d == nullptr || d->name != "nvme2n1") continue;
    sums.requests += RequestCount(stats);
    sums.bytes += stats.size_sum_bytes;
    sums.missed += stats.missed_merges;
    for (uint64_t v : stats.latency_slots) sums.latency_count += v;
  }
  for (const auto& [key, stats] : s.origins) {
    const BlockDevice* d = DeviceCountingKey(s, t, key.major, key.minor, key.diskseq);
    if (d != nullptr && d->name == "nvme2n1") sums.remapped += stats.requests;
  }
  return sums;
}

TEST(DepartedPaths, WhatADeletedPathCountedStaysUnderItsHead) {
  Snapshot maps;  // the BPF maps
  maps.stats[kPath1Read] = Requests(700, 650);
  maps.stats[kPath1Write] = Requests(30);
  maps.stats[kPath2Read] = Requests(500, 450);
  maps.origins[{kNvmeMajor, 1, kDmMajor, 0, kRead, 11}] = PairStats(700, 650, 700 * 4096, 10, 10 * 262144, 0);
  DepartedPaths departed;
  departed.Learn(maps, Stack({1, 2}));  // while both paths were there
  const HeadSums before = SumsOfHead(maps, Stack({1, 2}));
  EXPECT_EQ(before.requests, 1230u);

  // Controller 1 deleted: its path disk left sysfs, the daemon forgets its keys.
  const Topology after = Stack({2});
  StaleKeys stale;
  stale.stats = {kPath1Read, kPath1Write};
  stale.origins = {{kNvmeMajor, 1, kDmMajor, 0, kRead, 11}};
  EXPECT_EQ(departed.Retire(stale, maps, after), 2u);
  maps.stats.erase(kPath1Read);
  maps.stats.erase(kPath1Write);
  maps.origins.clear();

  Snapshot read = maps;
  departed.AddTo(&read);
  const HeadSums now = SumsOfHead(read, after);
  EXPECT_EQ(now.requests, before.requests);
  EXPECT_EQ(now.bytes, before.bytes);
  EXPECT_EQ(now.missed, before.missed);
  EXPECT_EQ(now.latency_count, before.latency_count);
  EXPECT_EQ(now.remapped, before.remapped);
  // Under the head's own key, per op; the (head, dm-0) pair keeps its evidence.
  EXPECT_EQ(RequestCount(read.stats.at(kHeadRead)), 700u);
  EXPECT_EQ(RequestCount(read.stats.at(kHeadWrite)), 30u);
  EXPECT_EQ(read.origins.at({kNvmeMajor, 2, kDmMajor, 0, kRead, 5}).missed_merges, 650u);

  // The remaining path goes on: the head's counts grow by exactly what it adds.
  maps.stats[kPath2Read] = Requests(800, 700);
  read = maps;
  departed.AddTo(&read);
  EXPECT_EQ(SumsOfHead(read, after).requests, before.requests + 300);
}

TEST(DepartedPaths, AHeadThatGoesTakesWhatItsPathsLeftIt) {
  Snapshot maps;
  maps.stats[kPath1Read] = Requests(700);
  maps.stats[kPath2Read] = Requests(500);
  DepartedPaths departed;
  departed.Learn(maps, Stack({1, 2}));
  StaleKeys path1;
  path1.stats = {kPath1Read};
  departed.Retire(path1, maps, Stack({2}));
  maps.stats.erase(kPath1Read);
  EXPECT_FALSE(departed.empty());

  // The whole namespace goes: the head's key (the carry) and the last path's key are stale together.
  Snapshot read = maps;
  departed.AddTo(&read);
  StaleKeys all;
  for (const auto& [key, stats] : read.stats) all.stats.push_back(key);
  EXPECT_EQ(departed.Retire(all, read, Stack({}, false)), 0u);
  EXPECT_TRUE(departed.empty());
  Snapshot empty;
  departed.AddTo(&empty);
  EXPECT_TRUE(empty.stats.empty());
}

TEST(DepartedPaths, NothingIsKeptForAPathWhoseHeadIsGoneOrNew) {
  Snapshot maps;
  maps.stats[kPath1Read] = Requests(700);
  StaleKeys stale;
  stale.stats = {kPath1Read};
  {
    DepartedPaths departed;
    departed.Learn(maps, Stack({1, 2}));
    EXPECT_EQ(departed.Retire(stale, maps, Stack({}, false)), 0u);  // head and paths gone at once
    EXPECT_TRUE(departed.empty());
  }
  {
    // The head was re-created meanwhile (same 259:2, a new diskseq): a new device, its series starts at 0.
    DepartedPaths departed;
    departed.Learn(maps, Stack({1, 2}));
    EXPECT_EQ(departed.Retire(stale, maps, Stack({2}, true, 99)), 0u);
    EXPECT_TRUE(departed.empty());
  }
  {
    // Never seen under a head (the path came and went between two scans): nothing to move it to.
    DepartedPaths departed;
    departed.Learn(maps, Stack({2}));
    EXPECT_EQ(departed.Retire(stale, maps, Stack({2})), 0u);
    EXPECT_TRUE(departed.empty());
  }
}

TEST(DepartedPaths, AnOriginThatIsGoneIsNotKept) {
  Snapshot maps;
  maps.stats[kPath1Read] = Requests(10);
  maps.origins[{kNvmeMajor, 1, kDmMajor, 7, kRead, 11}] = PairStats(10, 0, 40960, 0, 0, 0);  // dm-7: gone
  DepartedPaths departed;
  departed.Learn(maps, Stack({1, 2}));
  StaleKeys stale;
  stale.stats = {kPath1Read};
  stale.origins = {{kNvmeMajor, 1, kDmMajor, 7, kRead, 11}};
  departed.Retire(stale, maps, Stack({2}));
  Snapshot read;
  departed.AddTo(&read);
  EXPECT_TRUE(read.origins.empty());
  EXPECT_EQ(read.stats.size(), 1u);
}

// The daemon's path: ActiveSource over a source whose maps lose the path's keys on Forget, read by
// scrapes before, during and after; the head's counts never drop.
class FakeMaps final : public SnapshotSource {
 public:
  Snapshot Read() override {
    std::lock_guard<std::mutex> lock(mutex);
    return maps;
  }
  void Forget(const StaleKeys& keys) override {
    std::lock_guard<std::mutex> lock(mutex);
    for (const DevOpKey& k : keys.stats) maps.stats.erase(k);
    for (const OriginKey& k : keys.origins) maps.origins.erase(k);
  }
  std::mutex mutex;
  Snapshot maps;
};

TEST(DepartedPaths, ActiveSourceScrapesSeeTheHeadMonotonicThroughAPathDeletion) {
  auto maps = std::make_shared<FakeMaps>();
  maps->maps.stats[kPath1Read] = Requests(100);
  maps->maps.stats[kPath2Read] = Requests(100);
  ActiveSource source(maps, SourceStatus{});
  Topology topology = Stack({1, 2});
  uint64_t last = 0;
  auto scrape = [&](const char* when) {
    const uint64_t now = SumsOfHead(source.Read(), topology).requests;
    EXPECT_GE(now, last) << when;
    last = now;
  };
  for (int tick = 0; tick < 10; ++tick) {
    {
      std::lock_guard<std::mutex> lock(maps->mutex);
      if (maps->maps.stats.count(kPath1Read)) maps->maps.stats[kPath1Read] = Requests(100 + 50 * tick);
      maps->maps.stats[kPath2Read] = Requests(100 + 40 * tick);
    }
    const Snapshot snapshot = source.Read();
    source.LearnPaths(snapshot, topology);
    scrape("before the tick's forget");
    if (tick == 4) {
      topology = Stack({2});  // controller 1 deleted: the rescan no longer shows nvme2c1n1
      // A scrape between that rescan (a uevent, any time) and the tick that retires the path's keys:
      // they are still in the maps, and sysfs no longer says whose they are (CI, 128 -> 64).
      scrape("after the rescan, before the tick's forget");
      StaleKeys stale;
      stale.stats = {kPath1Read};
      EXPECT_EQ(source.ForgetKeepingHeads(stale, topology), 1u);
      EXPECT_EQ(maps->Read().stats.count(kPath1Read), 0u);  // deleted from the maps
    }
    scrape("after the tick");
  }
  // Path 1 counted 100 + 50 * 4 = 300 before it went; path 2 reached 100 + 40 * 9 = 460.
  EXPECT_EQ(last, 760u);

  // A new source (the BPF retry after diskstats): its counters start afresh, no carry from the old one.
  auto fresh = std::make_shared<FakeMaps>();
  source.Switch(fresh, SourceStatus{});
  EXPECT_TRUE(source.Read().stats.empty());
}

}  // namespace
