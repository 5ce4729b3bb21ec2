// SPDX-License-Identifier: Apache-2.0
#include "topology/topology_namer.h"

#include <gtest/gtest.h>

#include <chrono>

#include "topology/device_events.h"

namespace mergewatch {
namespace {

// Stands in for the sysfs namer: counts every lookup, so that a test can tell a name taken
// from the topology (no call) from one taken from sysfs.
class CountingNamer final : public DeviceNamer {
 public:
  std::optional<std::string> NameOf(uint32_t major, uint32_t minor, uint64_t diskseq) override {
    ++calls;
    return "sysfs:" + std::to_string(major) + ":" + std::to_string(minor) + "@" + std::to_string(diskseq);
  }
  int calls = 0;
};

BlockDevice Disk(const std::string& name, uint32_t major, uint32_t minor, uint64_t diskseq) {
  BlockDevice d;
  d.name = d.disk = name;
  d.major = major;
  d.minor = minor;
  d.diskseq = diskseq;
  d.kind = DeviceKind::kLoop;
  return d;
}

std::shared_ptr<const Topology> TwoLoops() {
  BlockDevice partition = Disk("loop1p1", 259, 7, 0);
  partition.is_partition = true;
  partition.disk = "loop1";
  BlockDevice path = Disk("nvme2c1n1", 0, 0, 30);  // hidden multipath path disk: no dev_t
  path.hidden = true;
  path.multipath_head = "nvme2n1";
  path.kind = DeviceKind::kNvme;
  return std::make_shared<const Topology>(Topology::FromDevices(
      {Disk("loop0", 7, 0, 5), Disk("loop1", 7, 1, 6), partition, path, Disk("nvme2n1", 259, 9, 29),
       Disk("sda", 8, 0, 0)}));  // sda: a disk on a kernel without diskseq
}

constexpr Duration kQuiet = std::chrono::milliseconds(100);
constexpr Duration kMaxDelay = std::chrono::milliseconds(500);

// The daemon's sequence around a read of the event socket (DeviceWatch::OnReadable).
void Drained(TopologyNames* names, RescanPlanner* planner, std::shared_ptr<const Topology> topology,
             const DrainResult& drained, TimePoint now) {
  names->Distrust();
  planner->Add(drained, now);
  names->Publish(std::move(topology), planner->pending());
}

TEST(TopologyNames, ExactMatchIsNamedFromTheTopologyWithoutSysfs) {
  CountingNamer sysfs;
  TopologyNames names(sysfs, [] { return false; });
  names.Publish(TwoLoops(), /*rescan_pending=*/false);
  TopologyNamer namer = names.ForScrape();
  EXPECT_TRUE(namer.trusts_topology());
  EXPECT_EQ(namer.NameOf(7, 0, 5), "loop0");
  EXPECT_EQ(namer.NameOf(7, 1, 6), "loop1");
  EXPECT_EQ(namer.NameOf(259, 9, 29), "nvme2n1");
  EXPECT_EQ(sysfs.calls, 0);
}

// Another incarnation of the number (a loop device detached and attached again), or a number
// the topology does not have: sysfs decides, the topology names nothing.
TEST(TopologyNames, DiskseqMismatchAsksSysfs) {
  CountingNamer sysfs;
  TopologyNames names(sysfs, [] { return false; });
  names.Publish(TwoLoops(), false);
  TopologyNamer namer = names.ForScrape();
  EXPECT_EQ(namer.NameOf(7, 0, 4), "sysfs:7:0@4");  // the predecessor of loop0
  EXPECT_EQ(namer.NameOf(7, 0, 8), "sysfs:7:0@8");  // a successor the scan has not seen
  EXPECT_EQ(namer.NameOf(7, 2, 9), "sysfs:7:2@9");  // a number the scan has not seen
  EXPECT_EQ(sysfs.calls, 3);
}

// No diskseq (kernels before 5.15, a remap's origin key), a partition (diskseq 0 in the
// topology), a hidden multipath path disk (named after its head by the sysfs namer's rules):
// nothing ties the key to one disk for good, so sysfs names them, as before.
TEST(TopologyNames, KeysWithoutAnExactDiskseqAskSysfs) {
  CountingNamer sysfs;
  TopologyNames names(sysfs, [] { return false; });
  names.Publish(TwoLoops(), false);
  TopologyNamer namer = names.ForScrape();
  EXPECT_EQ(namer.NameOf(7, 0, 0), "sysfs:7:0@0");
  EXPECT_EQ(namer.NameOf(8, 0, 0), "sysfs:8:0@0");
  EXPECT_EQ(namer.NameOf(259, 7, 0), "sysfs:259:7@0");
  EXPECT_EQ(namer.NameOf(259, 1, 30), "sysfs:259:1@30");
  EXPECT_EQ(namer.NameOf(0, 0, 30), "sysfs:0:0@30");
  EXPECT_EQ(sysfs.calls, 5);
}

// A block uevent drained and not yet rescanned (the debounce): sysfs, until the rescan that
// follows it publishes its topology.
TEST(TopologyNames, PendingUeventAsksSysfsUntilTheRescan) {
  CountingNamer sysfs;
  TopologyNames names(sysfs, [] { return false; });
  RescanPlanner planner(kQuiet, kMaxDelay);
  names.Publish(TwoLoops(), planner.pending());
  DrainResult event;
  event.block_events = 1;
  Drained(&names, &planner, TwoLoops(), event, TimePoint{});
  EXPECT_FALSE(names.ForScrape().trusts_topology());
  EXPECT_EQ(names.ForScrape().NameOf(7, 0, 5), "sysfs:7:0@5");
  EXPECT_EQ(sysfs.calls, 1);
  // A periodic rescan while the event's is still due does not end the distrust.
  names.Publish(TwoLoops(), planner.pending());
  EXPECT_FALSE(names.ForScrape().trusts_topology());
  bool lost = false;
  ASSERT_TRUE(planner.TakeDue(TimePoint{} + kQuiet, &lost));
  names.Publish(TwoLoops(), planner.pending());  // the rescan
  EXPECT_EQ(names.ForScrape().NameOf(7, 0, 5), "loop0");
  EXPECT_EQ(sysfs.calls, 1);
}

// Messages of other subsystems change no block device: trusted again right after the drain.
TEST(TopologyNames, OtherSubsystemsKeepTheTopologyTrusted) {
  CountingNamer sysfs;
  TopologyNames names(sysfs, [] { return false; });
  RescanPlanner planner(kQuiet, kMaxDelay);
  names.Publish(TwoLoops(), false);
  DrainResult other;
  other.other_events = 3;
  Drained(&names, &planner, TwoLoops(), other, TimePoint{});
  EXPECT_TRUE(names.ForScrape().trusts_topology());
}

// ENOBUFS: the kernel dropped events, any device may have changed. Sysfs until the full rescan.
TEST(TopologyNames, OverrunAsksSysfsUntilTheRescan) {
  CountingNamer sysfs;
  TopologyNames names(sysfs, [] { return false; });
  RescanPlanner planner(kQuiet, kMaxDelay);
  names.Publish(TwoLoops(), false);
  DrainResult lost_events;
  lost_events.overrun = true;
  Drained(&names, &planner, TwoLoops(), lost_events, TimePoint{});
  EXPECT_EQ(names.ForScrape().NameOf(7, 0, 5), "sysfs:7:0@5");
  bool lost = false;
  ASSERT_TRUE(planner.TakeDue(TimePoint{}, &lost));
  EXPECT_TRUE(lost);
  names.Publish(TwoLoops(), planner.pending());
  EXPECT_EQ(names.ForScrape().NameOf(7, 0, 5), "loop0");
  EXPECT_EQ(sysfs.calls, 1);
}

// An event the main loop has not read yet (or an error on the socket) is seen by the scrape
// itself: sysfs, although the last publish was trusted.
TEST(TopologyNames, UnreadEventsAskSysfs) {
  CountingNamer sysfs;
  bool unread = true;
  int checks = 0;
  TopologyNames names(sysfs, [&] {
    ++checks;
    return unread;
  });
  names.Publish(TwoLoops(), false);
  TopologyNamer namer = names.ForScrape();
  EXPECT_FALSE(namer.trusts_topology());
  EXPECT_EQ(namer.NameOf(7, 0, 5), "sysfs:7:0@5");
  unread = false;
  TopologyNamer next = names.ForScrape();
  EXPECT_EQ(next.NameOf(7, 0, 5), "loop0");
  EXPECT_EQ(next.NameOf(7, 1, 6), "loop1");
  EXPECT_EQ(checks, 2);  // once per scrape, not per device
}

// While the main loop reads the socket (Distrust, before its read) scrapes take sysfs.
TEST(TopologyNames, DistrustedWhileTheSocketIsRead) {
  CountingNamer sysfs;
  TopologyNames names(sysfs, [] { return false; });
  names.Publish(TwoLoops(), false);
  names.Distrust();
  EXPECT_EQ(names.ForScrape().NameOf(7, 0, 5), "sysfs:7:0@5");
}

// No device events (the unit without AF_NETLINK): nothing tells a change between rescans,
// so sysfs names every key, as before the topology could.
TEST(TopologyNames, NoDeviceEventsAlwaysAskSysfs) {
  CountingNamer sysfs;
  TopologyNames names(sysfs, std::function<bool()>());
  names.Publish(TwoLoops(), false);
  TopologyNamer namer = names.ForScrape();
  EXPECT_FALSE(namer.trusts_topology());
  EXPECT_EQ(namer.NameOf(7, 0, 5), "sysfs:7:0@5");
  EXPECT_EQ(sysfs.calls, 1);
}

// Nothing published yet: sysfs.
TEST(TopologyNames, NothingPublishedAsksSysfs) {
  CountingNamer sysfs;
  TopologyNames names(sysfs, [] { return false; });
  EXPECT_EQ(names.ForScrape().NameOf(7, 0, 5), "sysfs:7:0@5");
}

// On a scanned fixture tree the topology gives every key the name the sysfs namer gives it,
// multipath path disks (by their head) included.
TEST(TopologyNames, SameNamesAsTheSysfsNamerOnAFixtureTree) {
  const std::string root = std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/nvme-multipath";
  auto topology = std::make_shared<const Topology>(Topology::Scan(root, nullptr));
  SysfsDeviceNamer sysfs(root);
  TopologyNames names(sysfs, [] { return false; });
  names.Publish(topology, false);
  int exact = 0;
  for (const BlockDevice& d : topology->devices()) {
    const uint32_t major = d.hidden ? 259 : d.major;  // a path's key carries its gendisk's number
    const uint32_t minor = d.hidden ? 1 : d.minor;
    SysfsDeviceNamer fresh(root);
    EXPECT_EQ(names.ForScrape().NameOf(major, minor, d.diskseq), fresh.NameOf(major, minor, d.diskseq)) << d.name;
    exact += ExactTopologyName(*topology, major, minor, d.diskseq) != nullptr;
  }
  EXPECT_GE(exact, 2);  // the test compares some names taken from the topology
}

}  // namespace
}  // namespace mergewatch
