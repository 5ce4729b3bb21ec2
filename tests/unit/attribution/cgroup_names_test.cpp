// SPDX-License-Identifier: Apache-2.0
// Cgroup ids to paths: the mountinfo reading, the v1-only host, the special names, the rescan's
// rate limit, departed cgroups, the cache bound, and names with any byte but '/' and NUL.
#include "attribution/cgroup_names.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/unit/attribution/cgroup_tree.h"

namespace mergewatch {
namespace {

using attribution_test::CgroupTree;
using std::chrono::milliseconds;
using std::chrono::seconds;

CgroupName Service(const std::string& path) { return {CgroupNameKind::kService, path}; }
const CgroupName kKernelName{CgroupNameKind::kKernel, ""};

TimePoint At(Duration d) { return TimePoint(d); }

// Debian 12's: pure cgroup2 at /sys/fs/cgroup.
const char kUnified[] =
    "22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "26 22 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
// systemd's hybrid layout: v1 controllers and a controller-less cgroup2 at unified/.
const char kHybrid[] =
    "31 23 0:28 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid shared:10 shared:11 - cgroup2 cgroup2 rw,nsdelegate\n"
    "33 31 0:30 / /sys/fs/cgroup/blkio rw,nosuid shared:12 - cgroup cgroup rw,blkio\n";
// This build host's: v1 only.
const char kV1Only[] =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "34 31 0:31 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n";

TEST(Cgroup2MountPoint, PureUnifiedHybridAndV1Only) {
  EXPECT_EQ(Cgroup2MountPoint(kUnified), std::optional<std::string>("/sys/fs/cgroup"));
  EXPECT_EQ(Cgroup2MountPoint(kHybrid), std::optional<std::string>("/sys/fs/cgroup/unified"));
  EXPECT_EQ(Cgroup2MountPoint(kV1Only), std::nullopt);
  EXPECT_EQ(Cgroup2MountPoint(""), std::nullopt);
}

TEST(Cgroup2MountPoint, EscapedMountPointAndSubtreeBindMount) {
  // A bind mount of a subtree (root field not "/") names paths relative to that subtree: skipped.
  const char text[] =
      "40 26 0:24 /system.slice /mnt/sub rw - cgroup2 cgroup2 rw\n"
      "41 22 0:24 / /run/my\\040cgroup\\134x rw - cgroup2 none rw\n";
  EXPECT_EQ(Cgroup2MountPoint(text), std::optional<std::string>("/run/my cgroup\\x"));
}

TEST(IoControllerOnV1, BlkioMountedOnV1) {
  EXPECT_TRUE(IoControllerOnV1(kHybrid));
  EXPECT_TRUE(IoControllerOnV1(kV1Only));
  EXPECT_FALSE(IoControllerOnV1(kUnified));
  EXPECT_FALSE(IoControllerOnV1("32 31 0:29 / /sys/fs/cgroup/net rw - cgroup cgroup rw,net_cls,blkio_x\n"));
  EXPECT_TRUE(IoControllerOnV1("32 31 0:29 / /sys/fs/cgroup/b rw - cgroup cgroup rw,cpu,blkio,memory\n"));
}

// A hybrid host's blkcg ids are the v1 blkio hierarchy's: id 10 there is not /system.slice.
TEST(CgroupNames, BlkcgIdsOfAV1IoControllerAreNotLookedUp) {
  CgroupTree tree;
  tree.Make("/system.slice", 10);
  CgroupNamesOptions options;
  options.blkcg_ids_on_cgroup2 = false;
  CgroupNames names(tree.root(), tree.Source(), options);
  EXPECT_EQ(names.Name(10, CgroupSource::kBlkcg, At(seconds(1))), kKernelName);
  EXPECT_EQ(names.Name(10, CgroupSource::kTask, At(seconds(1))), Service("/system.slice"));
}

TEST(Cgroup2MountPoint, GarbageNeverCrashes) {
  for (const char* text : {"-", " - ", "1 2 3", "1 2 3 4 5", "1 2 3 4 5 -", "1 2 3 / /x - ", "\n\n\\", "1 2 3 / \\7"}) {
    EXPECT_EQ(Cgroup2MountPoint(text), std::nullopt) << text;
  }
  for (const char* text : {"-", "1 2 3 / /x - cgroup", "1 2 3 / /x - cgroup none"}) EXPECT_FALSE(IoControllerOnV1(text));
  EXPECT_EQ(UnescapeMountinfo("a\\04"), "a\\04");     // cut off: kept as is
  EXPECT_EQ(UnescapeMountinfo("a\\477b"), "a\\477b");  // > \377: not an escape
  EXPECT_EQ(UnescapeMountinfo("\\011\\012"), "\t\n");
}

TEST(CgroupNames, V1OnlyHostNamesEveryIdUnattributed) {
  CgroupNames names(std::nullopt, [](int) { return std::optional<uint64_t>(1); });
  for (uint64_t id : {uint64_t{1}, uint64_t{4242}, ~uint64_t{0}}) {
    const CgroupName name = names.Name(id, CgroupSource::kTask, At(seconds(1)));
    EXPECT_EQ(name.kind, CgroupNameKind::kUnattributedV1);
    EXPECT_EQ(LabelOf(name), "");
    EXPECT_EQ(DisplayOf(name), "unattributed (cgroup v1)");
  }
  EXPECT_EQ(names.Name(0, CgroupSource::kTask, At(seconds(1))), kKernelName);
  EXPECT_EQ(LabelOf(names.Name(1, CgroupSource::kWriteback, At(seconds(1)))), "writeback");
  names.Sweep(At(seconds(3600)));
  EXPECT_EQ(names.stats().scans, 0u);
  EXPECT_EQ(names.size(), 0u);
}

TEST(CgroupNames, PathsBelowTheMountAndTheRoot) {
  CgroupTree tree;
  tree.Make("/system.slice", 10);
  tree.Make("/system.slice/backup.service", 11);
  tree.Make("/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab12.scope", 20);
  CgroupNames names(tree.root(), tree.Source());
  EXPECT_EQ(names.Name(11, CgroupSource::kTask, At(seconds(1))), Service("/system.slice/backup.service"));
  EXPECT_EQ(names.Name(1, CgroupSource::kBlkcg, At(seconds(1))), Service("/"));
  EXPECT_EQ(names.Name(20, CgroupSource::kTask, At(seconds(1))),
            Service("/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab12.scope"));
  EXPECT_EQ(names.stats().scans, 1u) << "one walk cached every directory";
}

TEST(CgroupNames, SpecialNames) {
  CgroupTree tree;
  tree.Make("/kernel", 5);  // a cgroup may be called "kernel": its name is "/kernel", never "kernel"
  CgroupNames names(tree.root(), tree.Source());
  EXPECT_EQ(names.Name(0, CgroupSource::kTask, At(seconds(1))), kKernelName);
  EXPECT_EQ(names.Name(999, CgroupSource::kTask, At(seconds(1))), kKernelName) << "never in the tree";
  const CgroupName writeback = names.Name(1, CgroupSource::kWriteback, At(seconds(1)));
  EXPECT_EQ(writeback.kind, CgroupNameKind::kWriteback);
  EXPECT_EQ(LabelOf(writeback), "writeback");
  EXPECT_EQ(LabelOf(names.Name(5, CgroupSource::kTask, At(seconds(1)))), "/kernel");
  EXPECT_EQ(LabelOf(kKernelName), "kernel");
}

TEST(CgroupNames, AMissRescansAtMostOncePerInterval) {
  CgroupTree tree;
  CgroupNames names(tree.root(), tree.Source());
  EXPECT_EQ(names.Name(30, CgroupSource::kTask, At(seconds(10))), kKernelName);
  EXPECT_EQ(names.stats().scans, 1u);
  tree.Make("/late.service", 30);
  EXPECT_EQ(names.Name(30, CgroupSource::kTask, At(seconds(10) + milliseconds(999))), kKernelName);
  EXPECT_EQ(names.Name(31, CgroupSource::kTask, At(seconds(10) + milliseconds(999))), kKernelName);
  EXPECT_EQ(names.stats().scans, 1u) << "misses within the interval do not walk the tree";
  EXPECT_EQ(names.Name(30, CgroupSource::kTask, At(seconds(11))), Service("/late.service"));
  EXPECT_EQ(names.stats().scans, 2u);
  EXPECT_EQ(names.Name(30, CgroupSource::kTask, At(seconds(11))), Service("/late.service"));
  EXPECT_EQ(names.stats().scans, 2u) << "a hit does not walk";
}

TEST(CgroupNames, ADepartedCgroupIsNamedAsItWasThenDropped) {
  CgroupTree tree;
  tree.Make("/backup.slice", 40);
  CgroupNamesOptions options;
  options.refresh_interval = seconds(60);
  options.grace = seconds(300);
  CgroupNames names(tree.root(), tree.Source(), options);
  EXPECT_EQ(names.Name(40, CgroupSource::kTask, At(seconds(0))), Service("/backup.slice"));
  tree.Remove("/backup.slice");
  names.Sweep(At(seconds(60)));  // the walk that notices: gone since 60 s
  EXPECT_EQ(names.stats().scans, 2u);
  EXPECT_EQ(names.Name(40, CgroupSource::kTask, At(seconds(359))), Service("/backup.slice")) << "in flight";
  EXPECT_EQ(names.Name(40, CgroupSource::kTask, At(seconds(360))), kKernelName) << "grace over";
  names.Sweep(At(seconds(400)));
  EXPECT_EQ(names.size(), 1u) << "only the root is left";
}

TEST(CgroupNames, SweepDropsDepartedIdsNobodyAsksFor) {
  CgroupTree tree;
  for (int i = 0; i < 50; ++i) tree.Make("/job-" + std::to_string(i) + ".scope", 100 + i);
  CgroupNames names(tree.root(), tree.Source());
  names.Sweep(At(seconds(0)));
  EXPECT_EQ(names.size(), 51u);
  for (int i = 0; i < 50; ++i) tree.Remove("/job-" + std::to_string(i) + ".scope");
  names.Sweep(At(seconds(60)));
  EXPECT_EQ(names.size(), 51u) << "departed, within the grace period";
  names.Sweep(At(seconds(360)));
  EXPECT_EQ(names.size(), 1u);
  EXPECT_EQ(names.stats().expired, 50u);
}

TEST(CgroupNames, ARenameKeepsTheIdAndTakesTheNewPath) {
  CgroupTree tree;
  tree.Make("/a", 7);
  CgroupNames names(tree.root(), tree.Source());
  EXPECT_EQ(names.Name(7, CgroupSource::kTask, At(seconds(0))), Service("/a"));
  tree.Rename("/a", "/b");
  names.Sweep(At(seconds(60)));
  EXPECT_EQ(names.Name(7, CgroupSource::kTask, At(seconds(61))), Service("/b"));
}

TEST(CgroupNames, TheCacheIsBoundedAndTheAskedIdAlwaysFits) {
  CgroupTree tree;
  for (int i = 0; i < 20; ++i) tree.Make("/s" + std::to_string(i), 200 + i);
  CgroupNamesOptions options;
  options.capacity = 4;
  CgroupNames names(tree.root(), tree.Source(), options);
  for (int i = 0; i < 20; ++i) {
    const TimePoint now = At(seconds(10 * i));
    EXPECT_EQ(names.Name(200 + i, CgroupSource::kTask, now), Service("/s" + std::to_string(i)));
    EXPECT_LE(names.size(), 4u);
  }
  EXPECT_GE(names.stats().evictions, 16u);
}

TEST(CgroupNames, AWalkStopsAtItsDirectoryBound) {
  CgroupTree tree;
  for (int i = 0; i < 10; ++i) tree.Make("/d" + std::to_string(i), 300 + i);
  CgroupNamesOptions options;
  options.max_scan_directories = 5;
  CgroupNames names(tree.root(), tree.Source(), options);
  names.Sweep(At(seconds(0)));
  EXPECT_EQ(names.stats().truncated_scans, 1u);
  EXPECT_EQ(names.stats().directories, 5u);
  EXPECT_EQ(names.size(), 5u);
}

// Every byte but '/' and NUL, 255-byte components, nested to a 4 KiB path: named byte for byte;
// one directory deeper than 4 KiB is not named and counted.
TEST(CgroupNames, HostileNamesUpToFourKib) {
  std::string all_bytes;
  for (int b = 1; b < 256; ++b) {
    if (b != '/') all_bytes += static_cast<char>(b);
  }
  std::string path = "/" + all_bytes;  // 255 bytes
  for (char fill = 'a'; path.size() + 256 <= kMaxCgroupPathBytes; ++fill) path += "/" + std::string(255, fill);
  ASSERT_EQ(path.size(), 4095u);  // the longest PATH_MAX allows with its NUL
  CgroupTree tree;
  tree.Make("/" + all_bytes, 500);
  tree.Make(path, 501);
  tree.Make(path + "/x", 502);  // 4097 bytes
  CgroupNames names(tree.root(), tree.Source());
  EXPECT_EQ(names.Name(500, CgroupSource::kTask, At(seconds(0))), Service("/" + all_bytes));
  EXPECT_EQ(names.Name(501, CgroupSource::kTask, At(seconds(0))), Service(path));
  EXPECT_EQ(names.Name(502, CgroupSource::kTask, At(seconds(5))), kKernelName);
  EXPECT_EQ(names.stats().too_long_paths, 1u * names.stats().scans);
}

TEST(CgroupNames, AMissingMountNamesKernelAndNeverCrashes) {
  CgroupTree tree;
  CgroupNames names(tree.root() + "/not-there", tree.Source());
  EXPECT_EQ(names.Name(1, CgroupSource::kTask, At(seconds(0))), kKernelName);
  names.Sweep(At(seconds(100)));
  EXPECT_EQ(names.size(), 0u);
}

TEST(KernfsIdOf, ABadDescriptorHasNoId) { EXPECT_EQ(KernfsIdOf(-1), std::nullopt); }

}  // namespace
}  // namespace mergewatch
