// SPDX-License-Identifier: Apache-2.0
// The readers against the synthetic sysfs trees in tests/fixtures/sysfs (built by
// make-fixtures.sh): what one device's directory yields (device_reader.cpp's ReadDevice and
// ReadQueue, reached through Topology::Scan, ResolveDevice and ResolveHiddenDisk), what a
// malformed tree warns about. Never touches the host's /sys. The graph over what they read is
// tested in topology_test.cpp, the pure parsers in sysfs_text_test.cpp.
//
// Golden dumps: MERGEWATCH_UPDATE_GOLDEN=1 rewrites them from the current
// output and fails each rewritten case; review the diff, then run again without it.
#include "topology/device_reader.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "tests/unit/topology/sysfs_fixtures.h"

namespace mergewatch {
namespace {

using topology_test::CaseRoot;
using topology_test::ContainsSubstring;
using topology_test::DeviceNames;
using topology_test::MustFind;
using topology_test::Names;
using topology_test::ScanCase;
using topology_test::ScanResult;

// Warnings carry the absolute fixture path; golden files must not.
std::string WithoutRoot(std::string text, const std::string& root) {
  for (size_t at = text.find(root); at != std::string::npos; at = text.find(root, at)) {
    text.replace(at, root.size(), "<root>");
  }
  return text;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// ---------------------------------------------------------------------------
// Golden dumps, one per fixture case.

class TopologyGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TopologyGoldenTest, DumpMatchesGolden) {
  const std::string fixture_case = GetParam();
  const ScanResult scan = ScanCase(fixture_case);
  std::string actual = scan.topology.Dump();
  for (const std::string& warning : scan.warnings) {
    actual += "warning: " + WithoutRoot(warning, CaseRoot(fixture_case)) + "\n";
  }
  const std::string golden_path = std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/" +
                                  fixture_case + ".golden";
  if (std::getenv("MERGEWATCH_UPDATE_GOLDEN") != nullptr) {
    // Update mode writes the golden and fails: a run that compared nothing must never pass.
    std::ofstream(golden_path) << actual;
    FAIL() << "MERGEWATCH_UPDATE_GOLDEN is set: rewrote " << golden_path
           << "; review the diff, then run again without it";
  }
  EXPECT_EQ(ReadWholeFile(golden_path), actual) << "golden: " << golden_path;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TopologyGoldenTest,
                         ::testing::Values("seed-lvm-snapshot", "nvme-partitions", "md-raid1", "md-raid1-hdd",
                                           "dm-multipath", "loop", "transports", "big-minors", "malformed",
                                           "nvme-multipath"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// ---------------------------------------------------------------------------
// 1. The 2019 incident stack.

TEST(TopologySeedLvmSnapshot, ScansCleanly) {
  const ScanResult scan = ScanCase("seed-lvm-snapshot");
  EXPECT_TRUE(scan.warnings.empty()) << scan.warnings.front();
  EXPECT_EQ(DeviceNames(scan.topology), (Names{"dm-0", "dm-1", "dm-2", "dm-3", "nvme1n1"}));
}

TEST(TopologySeedLvmSnapshot, NvmeQueueShowsNomerges) {
  const ScanResult scan = ScanCase("seed-lvm-snapshot");
  const BlockDevice& nvme = MustFind(scan.topology, "nvme1n1");
  EXPECT_EQ(nvme.major, 259u);
  EXPECT_EQ(nvme.minor, 0u);
  EXPECT_EQ(nvme.kind, DeviceKind::kNvme);
  EXPECT_FALSE(nvme.is_partition);
  EXPECT_EQ(nvme.disk, "nvme1n1");
  EXPECT_EQ(nvme.queue.nomerges, 2);
  EXPECT_EQ(nvme.queue.scheduler, "none");
  EXPECT_EQ(nvme.queue.max_sectors_kb, 256u);
  EXPECT_EQ(nvme.queue.max_segments, 127u);
  EXPECT_EQ(nvme.queue.rotational, 0);
  EXPECT_EQ(nvme.holders, (Names{"dm-0", "dm-2"}));
  EXPECT_TRUE(nvme.slaves.empty());
}

TEST(TopologySeedLvmSnapshot, LvmLayersFromNameAndUuid) {
  const ScanResult scan = ScanCase("seed-lvm-snapshot");
  struct Expected {
    const char* name;
    const char* dm_name;
    const char* lv;
    const char* layer;
  };
  const Expected expected[] = {
      {"dm-0", "secvol-seclv-real", "seclv", "real"},
      {"dm-1", "secvol-seclv", "seclv", ""},
      {"dm-2", "secvol-tmp_backup1-cow", "tmp_backup1", "cow"},
      {"dm-3", "secvol-tmp_backup1", "tmp_backup1", ""},
  };
  for (const Expected& e : expected) {
    SCOPED_TRACE(e.name);
    const BlockDevice& dm = MustFind(scan.topology, e.name);
    EXPECT_EQ(dm.kind, DeviceKind::kDm);
    EXPECT_EQ(dm.major, 253u);
    EXPECT_EQ(dm.dm_name, e.dm_name);
    EXPECT_EQ(dm.dm_uuid.rfind("LVM-", 0), 0u);
    EXPECT_EQ(dm.lvm_vg, "secvol");
    EXPECT_EQ(dm.lvm_lv, e.lv);
    EXPECT_EQ(dm.lvm_layer, e.layer);
    // Bio-based dm on the incident kernel: no scheduler file at all.
    EXPECT_EQ(dm.queue.scheduler, "");
  }
}

TEST(TopologySeedLvmSnapshot, SlavesAndHoldersAsTheKernelLinksThem) {
  const ScanResult scan = ScanCase("seed-lvm-snapshot");
  EXPECT_EQ(MustFind(scan.topology, "dm-0").slaves, (Names{"nvme1n1"}));
  EXPECT_EQ(MustFind(scan.topology, "dm-0").holders, (Names{"dm-1", "dm-3"}));
  EXPECT_EQ(MustFind(scan.topology, "dm-1").slaves, (Names{"dm-0"}));
  EXPECT_EQ(MustFind(scan.topology, "dm-2").holders, (Names{"dm-3"}));
  EXPECT_EQ(MustFind(scan.topology, "dm-3").slaves, (Names{"dm-0", "dm-2"}));
  EXPECT_TRUE(MustFind(scan.topology, "dm-3").holders.empty());
}

// ---------------------------------------------------------------------------
// 2. Partitions.

TEST(TopologyNvmePartitions, PartitionsInheritDiskAndQueue) {
  const ScanResult scan = ScanCase("nvme-partitions");
  EXPECT_TRUE(scan.warnings.empty()) << scan.warnings.front();
  const BlockDevice& disk = MustFind(scan.topology, "nvme0n1");
  for (const char* name : {"nvme0n1p1", "nvme0n1p2"}) {
    SCOPED_TRACE(name);
    const BlockDevice& part = MustFind(scan.topology, name);
    EXPECT_TRUE(part.is_partition);
    EXPECT_EQ(part.disk, "nvme0n1");
    EXPECT_EQ(part.kind, DeviceKind::kNvme);
    EXPECT_EQ(part.major, 259u);
    EXPECT_EQ(part.queue.max_sectors_kb, disk.queue.max_sectors_kb);
    EXPECT_EQ(part.queue.scheduler, disk.queue.scheduler);
    EXPECT_EQ(part.queue.nomerges, disk.queue.nomerges);
    EXPECT_EQ(part.queue.rotational, disk.queue.rotational);
  }
  EXPECT_EQ(MustFind(scan.topology, "nvme0n1p2").minor, 2u);
}

TEST(TopologyNvmePartitions, EscapedDashInVgName) {
  const ScanResult scan = ScanCase("nvme-partitions");
  const BlockDevice& dm = MustFind(scan.topology, "dm-0");
  EXPECT_EQ(dm.major, 254u);  // dm's major is dynamic
  EXPECT_EQ(dm.dm_name, "my--vg-data");
  EXPECT_EQ(dm.lvm_vg, "my-vg");
  EXPECT_EQ(dm.lvm_lv, "data");
  EXPECT_EQ(dm.lvm_layer, "");
  EXPECT_EQ(dm.queue.scheduler, "none");
}

// ---------------------------------------------------------------------------
// 3. md RAID1 over SATA.

TEST(TopologyMdRaid1, MdOverScsiDisks) {
  const ScanResult scan = ScanCase("md-raid1");
  EXPECT_TRUE(scan.warnings.empty()) << scan.warnings.front();
  const BlockDevice& md = MustFind(scan.topology, "md0");
  EXPECT_EQ(md.kind, DeviceKind::kMd);
  EXPECT_EQ(md.major, 9u);
  EXPECT_EQ(md.slaves, (Names{"sda", "sdb"}));
  EXPECT_EQ(md.queue.scheduler, "none");
  EXPECT_TRUE(md.dm_name.empty());
  for (const char* name : {"sda", "sdb"}) {
    SCOPED_TRACE(name);
    const BlockDevice& sd = MustFind(scan.topology, name);
    EXPECT_EQ(sd.kind, DeviceKind::kScsi);
    EXPECT_EQ(sd.queue.scheduler, "mq-deadline");
    EXPECT_EQ(sd.queue.rotational, 1);
    EXPECT_EQ(sd.holders, (Names{"md0"}));
    EXPECT_EQ(scan.topology.UpperDevices(name), (Names{"md0"}));
  }
  EXPECT_EQ(MustFind(scan.topology, "sdb").minor, 16u);
  EXPECT_EQ(scan.topology.LowerDisks("md0"), (Names{"sda", "sdb"}));
}

// ---------------------------------------------------------------------------
// 4. dm-multipath.

TEST(TopologyDmMultipath, NotLvm) {
  const ScanResult scan = ScanCase("dm-multipath");
  EXPECT_TRUE(scan.warnings.empty()) << scan.warnings.front();
  const BlockDevice& dm = MustFind(scan.topology, "dm-0");
  EXPECT_EQ(dm.kind, DeviceKind::kDm);
  EXPECT_EQ(dm.dm_name, "mpatha");
  EXPECT_EQ(dm.dm_uuid, "mpath-3600a098038303053453f463045727a4f");
  EXPECT_TRUE(dm.lvm_vg.empty());
  EXPECT_TRUE(dm.lvm_lv.empty());
  EXPECT_TRUE(dm.lvm_layer.empty());
  EXPECT_EQ(dm.slaves, (Names{"sdc", "sdd"}));
  EXPECT_EQ(scan.topology.LowerDisks("dm-0"), (Names{"sdc", "sdd"}));
  EXPECT_EQ(MustFind(scan.topology, "sdc").kind, DeviceKind::kScsi);
  EXPECT_EQ(scan.topology.UpperDevices("sdd"), (Names{"dm-0"}));
}

// ---------------------------------------------------------------------------
// 5. Loop devices.

TEST(TopologyLoop, AttachedAndUnattached) {
  const ScanResult scan = ScanCase("loop");
  EXPECT_TRUE(scan.warnings.empty()) << scan.warnings.front();
  EXPECT_EQ(DeviceNames(scan.topology), (Names{"loop0", "loop1", "loop12"}));
  for (const BlockDevice& loop : scan.topology.devices()) {
    SCOPED_TRACE(loop.name);
    EXPECT_EQ(loop.kind, DeviceKind::kLoop);  // loop1 has no loop/ dir
    EXPECT_EQ(loop.major, 7u);
    EXPECT_EQ(loop.queue.nomerges, 0);
    EXPECT_FALSE(loop.is_partition);
  }
  const BlockDevice* loop12 = scan.topology.Find(7, 12);
  ASSERT_NE(loop12, nullptr);
  EXPECT_EQ(loop12->name, "loop12");
}

// ---------------------------------------------------------------------------
// 6. Minors above 255.

TEST(TopologyBigMinors, FindUsesSeparateMajorAndMinor) {
  const ScanResult scan = ScanCase("big-minors");
  EXPECT_TRUE(scan.warnings.empty()) << scan.warnings.front();
  const BlockDevice* loop = scan.topology.Find(7, 300);
  ASSERT_NE(loop, nullptr);
  EXPECT_EQ(loop->name, "loop300");
  EXPECT_EQ(loop->kind, DeviceKind::kLoop);
  // 300 truncated to 8 bits is 44: nothing may live there.
  EXPECT_EQ(scan.topology.Find(7, 44), nullptr);

  const BlockDevice* part = scan.topology.Find(259, 1048000);
  ASSERT_NE(part, nullptr);
  EXPECT_EQ(part->name, "nvme0n1p300");
  EXPECT_TRUE(part->is_partition);
  EXPECT_EQ(part->disk, "nvme0n1");
  const BlockDevice* max_minor = scan.topology.Find(259, (1u << 20) - 1);
  ASSERT_NE(max_minor, nullptr);
  EXPECT_EQ(max_minor->name, "nvme0n1p301");
}

TEST(TopologyBigMinors, ResolveDeviceThroughDevBlock) {
  std::vector<std::string> warnings;
  const auto part = ResolveDevice(CaseRoot("big-minors"), 259, 1048000, &warnings);
  ASSERT_TRUE(part.has_value());
  EXPECT_EQ(part->name, "nvme0n1p300");
  EXPECT_EQ(part->kind, DeviceKind::kNvme);
  EXPECT_EQ(part->queue.max_sectors_kb, 512u);  // read from the parent disk
  EXPECT_TRUE(warnings.empty());
}

// ---------------------------------------------------------------------------
// 8. Native NVMe multipath, as Debian 6.1 lays it out (measured in the VM).

TEST(TopologyNvmeMultipath, HiddenPathDisksAreKeptAndTiedToTheirHead) {
  const ScanResult scan = ScanCase("nvme-multipath");
  EXPECT_TRUE(scan.warnings.empty()) << scan.warnings.front();
  EXPECT_EQ(DeviceNames(scan.topology), (Names{"dm-0", "nvme0n1", "nvme2c1n1", "nvme2c2n1", "nvme2n1"}));
  const BlockDevice& path = MustFind(scan.topology, "nvme2c1n1");
  EXPECT_TRUE(path.hidden);
  EXPECT_EQ(path.major, 0u);  // no dev file
  EXPECT_EQ(path.diskseq, 2u);
  EXPECT_EQ(path.multipath_head, "nvme2n1");
  EXPECT_EQ(path.kind, DeviceKind::kNvme);
  EXPECT_TRUE(path.request_based);
  EXPECT_EQ(path.queue.nomerges, 2);
  const BlockDevice& head = MustFind(scan.topology, "nvme2n1");
  EXPECT_FALSE(head.hidden);
  EXPECT_FALSE(head.request_based);
  EXPECT_EQ(head.kind, DeviceKind::kNvme);
  EXPECT_EQ(head.multipath_paths, (Names{"nvme2c1n1", "nvme2c2n1"}));
  EXPECT_TRUE(MustFind(scan.topology, "nvme0n1").multipath_paths.empty());
  EXPECT_EQ(scan.topology.UpperDevices("nvme2n1"), (Names{"dm-0"}));
}

TEST(TopologyNvmeMultipath, ResolveHiddenDiskByDiskseq) {
  std::vector<std::string> warnings;
  const auto path = ResolveHiddenDisk(CaseRoot("nvme-multipath"), 1, &warnings);
  ASSERT_TRUE(path.has_value());
  EXPECT_EQ(path->name, "nvme2c2n1");
  EXPECT_EQ(path->multipath_head, "nvme2n1");
  EXPECT_FALSE(ResolveHiddenDisk(CaseRoot("nvme-multipath"), 3, &warnings).has_value());  // the head: visible
  EXPECT_FALSE(ResolveHiddenDisk(CaseRoot("nvme-multipath"), 42, &warnings).has_value());
  EXPECT_FALSE(ResolveHiddenDisk(CaseRoot("nvme-multipath"), 0, &warnings).has_value());
  EXPECT_TRUE(warnings.empty());
}

// A disk without a dev file that is not a hidden multipath path is still skipped.
TEST(TopologyNvmeMultipath, OnlyHiddenPathsMayLackADevFile) {
  const ScanResult scan = ScanCase("malformed");
  EXPECT_EQ(scan.topology.FindByName("sdx"), nullptr);
  EXPECT_TRUE(ContainsSubstring(scan.warnings, "sdx: no dev file, skipped"));
}

// ---------------------------------------------------------------------------
// 7. Malformed trees.

TEST(TopologyMalformed, KeepsWellFormedDevices) {
  const ScanResult scan = ScanCase("malformed");
  EXPECT_EQ(DeviceNames(scan.topology), (Names{"nvme0n1", "nvme0n1p2", "ram0", "vda"}));
  const BlockDevice& vda = MustFind(scan.topology, "vda");
  EXPECT_EQ(vda.kind, DeviceKind::kVirtio);
  EXPECT_EQ(vda.queue.scheduler, "mq-deadline");
  EXPECT_EQ(MustFind(scan.topology, "ram0").kind, DeviceKind::kOther);
  EXPECT_EQ(MustFind(scan.topology, "ram0").queue.nomerges, -1);
  // A dangling holder link still names its holder.
  EXPECT_EQ(MustFind(scan.topology, "nvme0n1").holders, (Names{"dm-9"}));
  EXPECT_EQ(scan.topology.UpperDevices("nvme0n1"), (Names{"dm-9"}));
}

TEST(TopologyMalformed, BadQueueValuesBecomeUnknown) {
  const ScanResult scan = ScanCase("malformed");
  const BlockDevice& nvme = MustFind(scan.topology, "nvme0n1");
  EXPECT_EQ(nvme.queue.nomerges, -1);
  EXPECT_EQ(nvme.queue.scheduler, "");
  EXPECT_EQ(nvme.queue.max_sectors_kb, 0u);
  EXPECT_EQ(nvme.queue.max_segments, 127u);
  EXPECT_EQ(nvme.queue.rotational, 0);
  EXPECT_EQ(MustFind(scan.topology, "nvme0n1p2").queue.nomerges, -1);
}

TEST(TopologyMalformed, EachProblemIsWarned) {
  const ScanResult scan = ScanCase("malformed");
  const std::vector<std::string>& w = scan.warnings;
  EXPECT_TRUE(ContainsSubstring(w, "/nomerges: malformed value \"garbage\""));
  EXPECT_TRUE(ContainsSubstring(w, "/max_sectors_kb: malformed value \"-5\""));
  EXPECT_TRUE(ContainsSubstring(w, "/scheduler: malformed value"));
  EXPECT_TRUE(ContainsSubstring(w, "nvme0n1p1/dev: malformed value \"259:x\""));
  EXPECT_TRUE(ContainsSubstring(w, "/sdx: no dev file"));
  EXPECT_TRUE(ContainsSubstring(w, "sdy/dev: malformed value \"banana\""));
  EXPECT_TRUE(ContainsSubstring(w, "/empty0: no dev file"));
  EXPECT_TRUE(ContainsSubstring(w, "block/ghost: dangling symlink"));
  EXPECT_TRUE(ContainsSubstring(w, "block/escape: symlink climbs above the sysfs root"));
  EXPECT_TRUE(ContainsSubstring(w, "block/absolute: absolute symlink target /sys/block/vda"));
  EXPECT_TRUE(ContainsSubstring(w, "block/cycle: too many levels of symlinks"));
  EXPECT_TRUE(ContainsSubstring(w, "block/notadir: not a directory"));
  EXPECT_TRUE(ContainsSubstring(w, "dev/block/8:99: dangling symlink"));
  EXPECT_TRUE(ContainsSubstring(w, "ram0/queue: missing"));
}

TEST(TopologyMalformed, ResolveDeviceFallsBackToScan) {
  // vda has no dev/block link in this tree.
  std::vector<std::string> warnings;
  const auto vda = ResolveDevice(CaseRoot("malformed"), 254, 0, &warnings);
  ASSERT_TRUE(vda.has_value());
  EXPECT_EQ(vda->name, "vda");
  EXPECT_EQ(vda->kind, DeviceKind::kVirtio);
}

TEST(TopologyMalformed, ResolveDeviceBrokenLinkWarnsAndReturnsNothing) {
  std::vector<std::string> warnings;
  EXPECT_FALSE(ResolveDevice(CaseRoot("malformed"), 8, 99, &warnings).has_value());
  EXPECT_TRUE(ContainsSubstring(warnings, "dev/block/8:99: dangling symlink"));
}

// ---------------------------------------------------------------------------
// Roots and arguments at the edges.

TEST(TopologyScan, MissingRootWarnsAndIsEmpty) {
  std::vector<std::string> warnings;
  const Topology topology = Topology::Scan(CaseRoot("does-not-exist"), &warnings);
  EXPECT_TRUE(topology.devices().empty());
  EXPECT_TRUE(ContainsSubstring(warnings, "does-not-exist/block: missing"));
}

TEST(TopologyScan, NullWarningsAndTrailingSlashAreFine) {
  const Topology topology = Topology::Scan(CaseRoot("malformed") + "/", nullptr);
  EXPECT_NE(topology.FindByName("vda"), nullptr);
}

TEST(TopologyResolveDevice, ReadsOneDeviceWithoutScanning) {
  std::vector<std::string> warnings;
  const auto dm3 = ResolveDevice(CaseRoot("seed-lvm-snapshot"), 253, 3, &warnings);
  ASSERT_TRUE(dm3.has_value());
  EXPECT_EQ(dm3->name, "dm-3");
  EXPECT_EQ(dm3->lvm_lv, "tmp_backup1");
  EXPECT_EQ(dm3->slaves, (Names{"dm-0", "dm-2"}));
  EXPECT_FALSE(ResolveDevice(CaseRoot("seed-lvm-snapshot"), 253, 9, &warnings).has_value());
  EXPECT_TRUE(warnings.empty());
}

// ---------------------------------------------------------------------------
// One device at a time (device_reader.h), as the walks call it.

// A partition read on its own takes its disk's queue/ from the parent directory; given the disk's
// queue by the caller (a scan reads the disk first), it reads none of its own.
TEST(TopologyReadDevice, PartitionQueueFromTheCallerOrTheParent) {
  std::vector<std::string> warnings;
  const topology_internal::SysfsTree tree(CaseRoot("nvme-partitions"), &warnings);
  const std::optional<std::string> disk_dir = topology_internal::ResolveDeviceDir(tree, "block/nvme0n1");
  ASSERT_TRUE(disk_dir.has_value());
  EXPECT_EQ(*disk_dir, "devices/pci0000:00/0000:00:1b.0/0000:01:00.0/nvme/nvme0/nvme0n1");
  const std::string part_dir = *disk_dir + "/nvme0n1p2";
  const std::optional<BlockDevice> alone = topology_internal::ReadDevice(tree, part_dir, nullptr);
  ASSERT_TRUE(alone.has_value());
  EXPECT_TRUE(alone->is_partition);
  EXPECT_EQ(alone->disk, "nvme0n1");
  EXPECT_EQ(alone->queue.max_sectors_kb, 512u);
  EXPECT_EQ(topology_internal::ReadQueue(tree, *disk_dir).max_sectors_kb, 512u);
  QueueSettings given;
  given.max_sectors_kb = 4242;
  const std::optional<BlockDevice> with_disk = topology_internal::ReadDevice(tree, part_dir, &given);
  ASSERT_TRUE(with_disk.has_value());
  EXPECT_EQ(with_disk->queue.max_sectors_kb, 4242u);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_FALSE(topology_internal::ResolveDeviceDir(tree, "block/nvme9n9").has_value());
  EXPECT_TRUE(ContainsSubstring(warnings, "block/nvme9n9: does not exist"));
}

// ---------------------------------------------------------------------------
// Queue settings.

// queue/iostats: read where present (0 or 1), -1 where the kernel has no such file (every
// fixture above), a malformed value warned about and taken as unknown.
TEST(TopologyQueue, IostatsIsReadWherePresent) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(testing::TempDir()) / ("iostats-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::copy(CaseRoot("seed-lvm-snapshot"), root, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  EXPECT_EQ(MustFind(Topology::Scan(root.string(), nullptr), "nvme1n1").queue.iostats, -1);
  const fs::path file = fs::canonical(root / "block/nvme1n1") / "queue/iostats";
  std::ofstream(file) << "0\n";
  std::vector<std::string> warnings;
  EXPECT_EQ(MustFind(Topology::Scan(root.string(), &warnings), "nvme1n1").queue.iostats, 0);
  EXPECT_TRUE(warnings.empty());
  std::ofstream(file, std::ios::trunc) << "yes\n";
  EXPECT_EQ(MustFind(Topology::Scan(root.string(), &warnings), "nvme1n1").queue.iostats, -1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("iostats: malformed value"), std::string::npos) << warnings[0];
  fs::remove_all(root);
}

}  // namespace
}  // namespace mergewatch
