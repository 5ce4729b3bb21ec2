// SPDX-License-Identifier: Apache-2.0
// The glue of "who": per-tick counters to the services of the verdicts whose condition holds,
// over the detector's window, named from a cgroup tree; the onset line's words; the host's cgroups.
#include "collapse_services.h"

#include <gtest/gtest.h>

#include "tests/unit/attribution/cgroup_tree.h"

namespace mergewatch {
namespace {

using attribution_test::CgroupTree;
using std::chrono::seconds;

constexpr uint32_t kNvmeMajor = 259, kDmMajor = 253;

BlockDevice Device(const std::string& name, uint32_t major, uint32_t minor, uint64_t diskseq = 0) {
  BlockDevice d;
  d.name = d.disk = name;
  d.major = major;
  d.minor = minor;
  d.diskseq = diskseq;
  return d;
}

// nvme0n1 (diskseq 7) under dm-1 (the origin LV) and dm-4 (its snapshot).
Topology Stack() {
  return Topology::FromDevices(
      {Device("nvme0n1", kNvmeMajor, 0, 7), Device("dm-1", kDmMajor, 1), Device("dm-4", kDmMajor, 4)});
}

ServiceCounterKey Key(uint32_t upper_minor, uint64_t cgroup, CgroupSource source = CgroupSource::kTask) {
  return {DevicePair{kNvmeMajor, 0, kDmMajor, upper_minor, 7}, CgroupRef{cgroup, source}};
}

DiskVerdict Verdict(const std::string& upper, bool condition) {
  DiskVerdict v;
  v.device = "nvme0n1";
  v.upper = upper;
  v.condition = condition;
  return v;
}

class CollapseServicesTest : public ::testing::Test {
 protected:
  CollapseServicesTest() {
    tree_.Make("/backup.slice", 100);
    tree_.Make("/db.slice", 200);
  }
  CollapseServices Make() { return CollapseServices(CgroupNames(tree_.root(), tree_.Source()), seconds(10)); }

  CgroupTree tree_;
  TimePoint t0_{};
};

TEST_F(CollapseServicesTest, NamesTheServicesOfTheCollapsedPairOnly) {
  CollapseServices services = Make();
  const Topology topology = Stack();
  std::vector<DiskVerdict> verdicts = {Verdict("dm-4", true), Verdict("dm-1", false)};
  services.Update(t0_, {{Key(4, 100), 1000}, {Key(4, 200), 10}, {Key(1, 200), 500}}, topology, &verdicts);
  EXPECT_TRUE(verdicts[0].services.empty()) << "the first tick is the baseline";
  services.Update(t0_ + seconds(1),
                  {{Key(4, 100), 1970}, {Key(4, 200), 40}, {Key(4, 0, CgroupSource::kWriteback), 0}, {Key(1, 200), 900}},
                  topology, &verdicts);
  ASSERT_EQ(verdicts[0].services.size(), 3u);  // backup, db, then other (0)
  EXPECT_EQ(verdicts[0].services[0].cgroup, "/backup.slice");
  EXPECT_EQ(verdicts[0].services[0].requests, 970u);
  EXPECT_DOUBLE_EQ(verdicts[0].services[0].share, 970.0 / 1000);
  EXPECT_EQ(verdicts[0].services[1].cgroup, "/db.slice");
  EXPECT_EQ(verdicts[0].services[2].cgroup, "other");
  EXPECT_EQ(verdicts[0].service_requests, 1000u);
  EXPECT_TRUE(verdicts[1].services.empty()) << "dm-1's pair is healthy: no series, its cgroups not named";
  EXPECT_EQ(ServicesText(verdicts[0].services), "97% /backup.slice, 3% /db.slice");
}

TEST_F(CollapseServicesTest, SharesAreOfTheDetectorWindowNotOfOneTick) {
  CollapseServices services = Make();
  const Topology topology = Stack();
  std::vector<DiskVerdict> verdicts = {Verdict("dm-4", true)};
  services.Update(t0_, {{Key(4, 100), 0}, {Key(4, 200), 0}}, topology, &verdicts);
  services.Update(t0_ + seconds(1), {{Key(4, 100), 900}, {Key(4, 200), 0}}, topology, &verdicts);
  // An idle tick for the backup keeps its share while it is in the window.
  services.Update(t0_ + seconds(2), {{Key(4, 100), 900}, {Key(4, 200), 100}}, topology, &verdicts);
  ASSERT_FALSE(verdicts[0].services.empty());
  EXPECT_EQ(verdicts[0].services[0].cgroup, "/backup.slice");
  EXPECT_DOUBLE_EQ(verdicts[0].services[0].share, 0.9);
  // Ten seconds on, the backup's requests left the window: only db's last 50 count.
  services.Update(t0_ + seconds(12), {{Key(4, 100), 900}, {Key(4, 200), 150}}, topology, &verdicts);
  ASSERT_FALSE(verdicts[0].services.empty());
  EXPECT_EQ(verdicts[0].services[0].cgroup, "/db.slice");
  EXPECT_DOUBLE_EQ(verdicts[0].services[0].share, 1.0);
}

TEST_F(CollapseServicesTest, ConditionGoneClearsTheServices) {
  CollapseServices services = Make();
  const Topology topology = Stack();
  std::vector<DiskVerdict> verdicts = {Verdict("dm-4", true)};
  services.Update(t0_, {{Key(4, 100), 0}}, topology, &verdicts);
  services.Update(t0_ + seconds(1), {{Key(4, 100), 50}}, topology, &verdicts);
  ASSERT_FALSE(verdicts[0].services.empty());
  verdicts[0].condition = false;
  services.Update(t0_ + seconds(2), {{Key(4, 100), 90}}, topology, &verdicts);
  EXPECT_TRUE(verdicts[0].services.empty());
}

TEST_F(CollapseServicesTest, AnotherIncarnationOfTheDiskIsNotThisVerdicts) {
  CollapseServices services = Make();
  const Topology topology = Stack();  // nvme0n1 is diskseq 7
  std::vector<DiskVerdict> verdicts = {Verdict("dm-4", true)};
  ServiceCounterKey old_disk = Key(4, 200);
  old_disk.pair.disk_diskseq = 6;
  services.Update(t0_, {{Key(4, 100), 0}, {old_disk, 0}}, topology, &verdicts);
  services.Update(t0_ + seconds(1), {{Key(4, 100), 10}, {old_disk, 1000}}, topology, &verdicts);
  ASSERT_FALSE(verdicts[0].services.empty());
  EXPECT_EQ(verdicts[0].services[0].cgroup, "/backup.slice");
  EXPECT_DOUBLE_EQ(verdicts[0].services[0].share, 1.0);
}

TEST_F(CollapseServicesTest, KernelWritebackAndUnknownIdsHaveFixedNames) {
  CollapseServices services = Make();
  const Topology topology = Stack();
  std::vector<DiskVerdict> verdicts = {Verdict("dm-4", true)};
  const ServiceCounters zero = {{Key(4, 1, CgroupSource::kWriteback), 0}, {Key(4, 0), 0}, {Key(4, 999), 0}};
  services.Update(t0_, zero, topology, &verdicts);
  services.Update(t0_ + seconds(1), {{Key(4, 1, CgroupSource::kWriteback), 600}, {Key(4, 0), 300}, {Key(4, 999), 100}},
                  topology, &verdicts);
  ASSERT_EQ(verdicts[0].services.size(), 3u) << "999 is not in the tree: \"kernel\", one series with id 0";
  EXPECT_EQ(verdicts[0].services[0].cgroup, "writeback");
  EXPECT_EQ(verdicts[0].services[1].cgroup, "kernel");
  EXPECT_EQ(verdicts[0].services[1].requests, 400u);
  EXPECT_EQ(ServicesText(verdicts[0].services), "60% writeback, 40% kernel");
}

TEST(ServicesText, NamesTheV1HostAndOtherOnlyWithRequests) {
  std::vector<ServiceShare> shares = {{false, "", 90, 0.9}, {true, "other", 10, 0.1}};
  EXPECT_EQ(ServicesText(shares), "90% unattributed (cgroup v1), 10% other");
  EXPECT_EQ(ServicesText({}), "");
}

TEST(CgroupHost, AV1OnlyHostHasNoMountAndTheDefaultRoot) {
  const CgroupHost host = ReadCgroupHost(
      "25 30 0:22 / /sys/fs/cgroup/blkio rw,nosuid shared:9 - cgroup cgroup rw,blkio\n");
  EXPECT_FALSE(host.mount.has_value());
  EXPECT_TRUE(host.io_on_v1);
  EXPECT_EQ(host.root_id, 1u);
}

TEST(CgroupHost, AnUnreadableMountKeepsTheDefaultRoot) {
  const CgroupHost host =
      ReadCgroupHost("30 25 0:26 / /nonexistent/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n");
  ASSERT_TRUE(host.mount.has_value());
  EXPECT_EQ(*host.mount, "/nonexistent/cgroup");
  EXPECT_FALSE(host.io_on_v1);
  EXPECT_EQ(host.root_id, 1u);
}

}  // namespace
}  // namespace mergewatch
