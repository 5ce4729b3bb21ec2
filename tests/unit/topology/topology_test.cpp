// SPDX-License-Identifier: Apache-2.0
// The graph (topology.cpp): the indexes by dev_t, name and diskseq, the stacking walks over
// slaves/ and holders/, multipath heads, on the fixture trees of tests/fixtures/sysfs and on
// in-memory topologies. Reading the trees is tested in device_reader_test.cpp.
#include "topology/topology.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/unit/topology/sysfs_fixtures.h"

namespace mergewatch {
namespace {

using topology_test::DeviceNames;
using topology_test::MustFind;
using topology_test::Names;
using topology_test::ScanCase;
using topology_test::ScanResult;

// ---------------------------------------------------------------------------
// The 2019 incident stack (seed-lvm-snapshot).

TEST(TopologySeedLvmSnapshot, UpperDevicesNearestFirst) {
  const ScanResult scan = ScanCase("seed-lvm-snapshot");
  const Names upper = scan.topology.UpperDevices("nvme1n1");
  EXPECT_EQ(upper, (Names{"dm-0", "dm-2", "dm-1", "dm-3"}));
  EXPECT_EQ(scan.topology.UpperDevices("dm-0"), (Names{"dm-1", "dm-3"}));
  EXPECT_TRUE(scan.topology.UpperDevices("dm-3").empty());
}

TEST(TopologySeedLvmSnapshot, LowerDisksReachTheNvme) {
  const ScanResult scan = ScanCase("seed-lvm-snapshot");
  EXPECT_EQ(scan.topology.LowerDisks("dm-3"), (Names{"nvme1n1"}));
  EXPECT_EQ(scan.topology.LowerDisks("dm-1"), (Names{"nvme1n1"}));
  EXPECT_TRUE(scan.topology.LowerDisks("nvme1n1").empty());
  EXPECT_TRUE(scan.topology.LowerDisks("no-such-device").empty());
}

TEST(TopologySeedLvmSnapshot, FindByDevNumber) {
  const ScanResult scan = ScanCase("seed-lvm-snapshot");
  const BlockDevice* dm3 = scan.topology.Find(253, 3);
  ASSERT_NE(dm3, nullptr);
  EXPECT_EQ(dm3->name, "dm-3");
  EXPECT_EQ(scan.topology.Find(253, 4), nullptr);
  EXPECT_EQ(scan.topology.Find(259, 1), nullptr);
}

// ---------------------------------------------------------------------------
// Partitions (nvme-partitions).

TEST(TopologyNvmePartitions, DmOnPartition) {
  const ScanResult scan = ScanCase("nvme-partitions");
  EXPECT_EQ(MustFind(scan.topology, "dm-0").slaves, (Names{"nvme0n1p2"}));
  EXPECT_EQ(MustFind(scan.topology, "nvme0n1p2").holders, (Names{"dm-0"}));
  EXPECT_TRUE(MustFind(scan.topology, "nvme0n1p1").holders.empty());
  // The holder link lives on the partition only.
  EXPECT_TRUE(MustFind(scan.topology, "nvme0n1").holders.empty());
  // ...but requests name the whole disk, so the disk's upper view includes it.
  EXPECT_EQ(scan.topology.UpperDevices("nvme0n1"), (Names{"dm-0"}));
  EXPECT_EQ(scan.topology.UpperDevices("nvme0n1p2"), (Names{"dm-0"}));
  EXPECT_TRUE(scan.topology.UpperDevices("nvme0n1p1").empty());
  EXPECT_EQ(scan.topology.LowerDisks("dm-0"), (Names{"nvme0n1"}));
}

// ---------------------------------------------------------------------------
// Native NVMe multipath (nvme-multipath), as Debian 6.1 lays it out (measured in the VM).

// The BPF key of a path's request is the gendisk's major:first_minor (259:1 on 6.1, in no
// sysfs file) and its diskseq: the diskseq finds the path, and the path's data counts
// under the head.
TEST(TopologyNvmeMultipath, KeysOfPathRequestsCountUnderTheHead) {
  const ScanResult scan = ScanCase("nvme-multipath");
  const Topology& t = scan.topology;
  ASSERT_NE(t.FindKey(259, 1, 2), nullptr);
  EXPECT_EQ(t.FindKey(259, 1, 2)->name, "nvme2c1n1");
  EXPECT_EQ(t.FindKey(259, 0, 1)->name, "nvme2c2n1");
  EXPECT_EQ(t.CountedUnder(259, 1, 2)->name, "nvme2n1");
  EXPECT_EQ(t.CountedUnder(259, 0, 1)->name, "nvme2n1");
  // Visible devices keep their own series; a diskseq nobody has names nothing.
  EXPECT_EQ(t.CountedUnder(259, 2, 3)->name, "nvme2n1");
  EXPECT_EQ(t.CountedUnder(259, 3, 4)->name, "nvme0n1");
  EXPECT_EQ(t.CountedUnder(259, 3, 0)->name, "nvme0n1");
  EXPECT_EQ(t.CountedUnder(259, 1, 99), nullptr);
  EXPECT_EQ(t.CountedUnder(259, 1, 0), nullptr);
  // The visible nvme0n1 at 259:3 with another incarnation's diskseq is not nvme0n1.
  EXPECT_EQ(t.CountedUnder(259, 3, 5), nullptr);
  EXPECT_EQ(t.Find(0, 0), nullptr);  // hidden disks are not indexed by a dev_t they lack
}

TEST(TopologyNvmeMultipath, PathWithoutItsHeadCountsNowhere) {
  BlockDevice path;
  path.name = "nvme5c1n1";
  path.hidden = true;
  path.diskseq = 7;
  path.multipath_head = "nvme5n1";
  const Topology t = Topology::FromDevices({path});
  EXPECT_EQ(t.FindKey(259, 9, 7)->name, "nvme5c1n1");
  EXPECT_EQ(t.CountedUnder(259, 9, 7), nullptr);
}

// ---------------------------------------------------------------------------
// Kind names and in-memory topologies.

TEST(TopologyDeviceKindName, AllKinds) {
  EXPECT_STREQ(DeviceKindName(DeviceKind::kNvme), "nvme");
  EXPECT_STREQ(DeviceKindName(DeviceKind::kScsi), "scsi");
  EXPECT_STREQ(DeviceKindName(DeviceKind::kVirtio), "virtio");
  EXPECT_STREQ(DeviceKindName(DeviceKind::kLoop), "loop");
  EXPECT_STREQ(DeviceKindName(DeviceKind::kDm), "dm");
  EXPECT_STREQ(DeviceKindName(DeviceKind::kMd), "md");
  EXPECT_STREQ(DeviceKindName(DeviceKind::kOther), "other");
}

BlockDevice MakeDevice(const std::string& name, uint32_t minor, Names slaves, Names holders) {
  BlockDevice device;
  device.major = 253;
  device.minor = minor;
  device.name = name;
  device.disk = name;
  device.slaves = std::move(slaves);
  device.holders = std::move(holders);
  return device;
}

TEST(TopologyFromDevices, CyclesTerminate) {
  // Impossible in a real kernel, but a corrupt tree must not hang the daemon.
  const Topology topology = Topology::FromDevices({
      MakeDevice("dm-a", 0, {"dm-b"}, {"dm-b"}),
      MakeDevice("dm-b", 1, {"dm-a"}, {"dm-a"}),
  });
  EXPECT_EQ(topology.UpperDevices("dm-a"), (Names{"dm-b"}));
  EXPECT_TRUE(topology.LowerDisks("dm-a").empty());
}

TEST(TopologyFromDevices, SortsAndDropsDuplicates) {
  const Topology topology = Topology::FromDevices({
      MakeDevice("dm-b", 1, {}, {}),
      MakeDevice("dm-a", 0, {}, {}),
      MakeDevice("dm-c", 1, {}, {}),  // same dev_t as dm-b
  });
  EXPECT_EQ(DeviceNames(topology), (Names{"dm-a", "dm-b"}));
  EXPECT_EQ(topology.Find(253, 1)->name, "dm-b");
}

TEST(TopologyFromDevices, UnknownSlaveCountsAsBottomDisk) {
  const Topology topology = Topology::FromDevices({MakeDevice("dm-0", 0, {"sdz"}, {})});
  EXPECT_EQ(topology.LowerDisks("dm-0"), (Names{"sdz"}));
}

// block_bio_queue is attached only while a bio-based device sits on another: dm over a
// disk yes; a bio-based device with nothing below (zram), a blk-mq disk, or a partition no.
TEST(Topology, StackedBioBasedDevicesAreTheOnesWithSlaves) {
  auto device = [](std::string name, bool request_based, std::vector<std::string> slaves, bool partition = false) {
    BlockDevice d;
    d.name = d.disk = std::move(name);
    d.request_based = request_based;
    d.slaves = std::move(slaves);
    d.is_partition = partition;
    return d;
  };
  Topology with_dm = Topology::FromDevices({device("nvme0n1", true, {}), device("dm-0", false, {"nvme0n1"}),
                                            device("zram0", false, {})});
  EXPECT_EQ(with_dm.StackedBioBasedDevices(), (Names{"dm-0"}));
  Topology without = Topology::FromDevices({device("nvme0n1", true, {}), device("zram0", false, {}),
                                            device("loop0", true, {})});
  EXPECT_TRUE(without.StackedBioBasedDevices().empty());
}

}  // namespace
}  // namespace mergewatch
