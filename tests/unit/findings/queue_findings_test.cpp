// SPDX-License-Identifier: Apache-2.0
// Queue findings (daemon/findings/) on sysfs fixtures and on hand-made topologies.
#include "findings/queue_findings.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#ifndef MERGEWATCH_FIXTURE_DIR
#error "compile with -DMERGEWATCH_FIXTURE_DIR=\"<repo>/tests/fixtures\""
#endif

namespace mergewatch {
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

constexpr const char* kKernel61 = "6.1.0-27-amd64";  // Debian 12's
constexpr const char* kKernel611 = "6.11.0";
constexpr const char* kKernel618 = "6.18.44-fc-v782";

std::vector<BlockDevice> ScanDevices(const std::string& fixture_case, std::vector<std::string>* warnings) {
  const Topology t = Topology::Scan(std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/" + fixture_case, warnings);
  return t.devices();
}

Pairs Found(const Topology& topology, const std::string& kernel) {
  Pairs pairs;
  for (const QueueFinding& f : FindQueueConfigProblems(topology, kernel)) pairs.emplace_back(f.device, f.finding);
  return pairs;
}

BlockDevice* Named(std::vector<BlockDevice>* devices, const std::string& name) {
  for (BlockDevice& d : *devices)
    if (d.name == name) return &d;
  ADD_FAILURE() << "no device " << name;
  static BlockDevice scratch;
  return &scratch;
}

// A request-based whole disk with the kernel's defaults for a single-queue SATA SSD.
BlockDevice Disk(const std::string& name, DeviceKind kind) {
  static uint32_t next_minor = 0;  // a Topology drops a second device with the same dev_t
  BlockDevice d;
  d.major = 8;
  d.minor = next_minor++;
  d.name = d.disk = name;
  d.kind = kind;
  d.request_based = true;
  d.queue.nomerges = 0;
  d.queue.scheduler = "mq-deadline";
  d.queue.available_schedulers = {"mq-deadline", "none"};
  d.queue.max_sectors_kb = 1280;
  d.queue.max_hw_sectors_kb = 32767;
  d.queue.rotational = 0;
  d.queue.hw_queues = 1;
  return d;
}

// `upper` (dm or md, bio-based) stacked on each of `lowers`.
void Stack(std::vector<BlockDevice>* devices, BlockDevice upper, const std::vector<std::string>& lowers) {
  for (const std::string& lower : lowers) {
    Named(devices, lower)->holders.push_back(upper.name);
    upper.slaves.push_back(lower);
  }
  upper.request_based = false;
  devices->push_back(std::move(upper));
}

// --- The LinkedIn hosts (fixture md-raid1-hdd) ----------------------------------------------------

TEST(QueueFindings, LinkedInRaid1MembersWithoutSchedulerAreBothNamed) {
  std::vector<std::string> warnings;
  const Topology t = Topology::FromDevices(ScanDevices("md-raid1-hdd", &warnings));
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  // The topology as LinkedIn had it: md0 over a partition of each HDD, the disks single-queue.
  EXPECT_EQ(t.LowerDisks("md0"), (std::vector<std::string>{"sda", "sdb"}));
  EXPECT_EQ(t.UpperDevices("sda"), (std::vector<std::string>{"md0"}));
  const BlockDevice* sda = t.FindByName("sda");
  ASSERT_NE(sda, nullptr);
  EXPECT_TRUE(sda->request_based);
  EXPECT_EQ(sda->queue.hw_queues, 1);
  EXPECT_EQ(sda->queue.available_schedulers, (std::vector<std::string>{"none"}));
  EXPECT_EQ(sda->queue.max_hw_sectors_kb, 32767u);

  const std::vector<QueueFinding> findings = FindQueueConfigProblems(t, kKernel61);
  EXPECT_EQ(Found(t, kKernel61), (Pairs{{"sda", kRotationalWithoutScheduler}, {"sdb", kRotationalWithoutScheduler}}));
  ASSERT_EQ(findings.size(), 2u);
  EXPECT_NE(findings[0].evidence.find("no elevator is built in or loaded"), std::string::npos) << findings[0].evidence;
  EXPECT_NE(findings[0].remedy.find("modprobe mq-deadline"), std::string::npos) << findings[0].remedy;
}

TEST(QueueFindings, MqDeadlineOnTheMembersClearsIt) {
  std::vector<BlockDevice> devices = ScanDevices("md-raid1-hdd", nullptr);
  for (const char* name : {"sda", "sdb"}) {
    Named(&devices, name)->queue.scheduler = "mq-deadline";
    Named(&devices, name)->queue.available_schedulers = {"mq-deadline", "none"};
  }
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), Pairs{});
}

TEST(QueueFindings, ElevatorAvailableButNotChosenSaysWhichAndHowToSetIt) {
  std::vector<BlockDevice> devices = ScanDevices("md-raid1-hdd", nullptr);
  Named(&devices, "sda")->queue.available_schedulers = {"none", "mq-deadline", "bfq"};
  const std::vector<QueueFinding> findings = FindQueueConfigProblems(Topology::FromDevices(devices), kKernel61);
  ASSERT_EQ(findings.size(), 2u);
  EXPECT_EQ(findings[0].device, "sda");
  EXPECT_NE(findings[0].evidence.find("available: mq-deadline bfq"), std::string::npos) << findings[0].evidence;
  EXPECT_EQ(findings[0].remedy.rfind("echo mq-deadline > /sys/block/sda/queue/scheduler", 0), 0u) << findings[0].remedy;
}

TEST(QueueFindings, RotationalOnNoneIsAFindingWhateverTheHardwareQueues) {
  std::vector<BlockDevice> devices = {Disk("sdc", DeviceKind::kScsi)};
  devices[0].transport = "sd";
  devices[0].queue.rotational = 1;
  devices[0].queue.scheduler = "none";
  // An HDD behind a multi-queue HBA (virtio-scsi's default of one queue per vCPU, host-wide tags): the
  // kernel's own default is none there (elevator_get_default()), and the disk seeks all the same.
  devices[0].queue.hw_queues = 4;
  const std::vector<QueueFinding> multi = FindQueueConfigProblems(Topology::FromDevices(devices), kKernel61);
  ASSERT_EQ(multi.size(), 1u);
  EXPECT_EQ(multi[0].finding, kRotationalWithoutScheduler);
  EXPECT_EQ(multi[0].evidence, "rotational=1 (driver sd), 4 hardware queues, scheduler none; available: mq-deadline");
  EXPECT_EQ(multi[0].remedy, "echo mq-deadline > /sys/block/sdc/queue/scheduler, and make it stick with a udev rule "
                             "setting ATTR{queue/scheduler}");
  devices[0].queue.available_schedulers = {"none"};  // no elevator: built in would not help, the rule does
  const std::vector<QueueFinding> bare = FindQueueConfigProblems(Topology::FromDevices(devices), kKernel61);
  ASSERT_EQ(bare.size(), 1u);
  EXPECT_NE(bare[0].remedy.find("udev rule"), std::string::npos) << bare[0].remedy;
  EXPECT_EQ(bare[0].remedy.find("CONFIG_MQ_IOSCHED_DEADLINE"), std::string::npos) << bare[0].remedy;
  devices[0].queue.hw_queues = 1;
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), (Pairs{{"sdc", kRotationalWithoutScheduler}}));
  // VPD page B1: a disk that gives its rpm is named; one whose rate is 0 ("not reported": QEMU's scsi-hd
  // without rotation_rate, clouds' virtual SCSI disks) kept sd's rotational default, a guess: not named.
  devices[0].scsi_rotation_rate = 7200;
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), (Pairs{{"sdc", kRotationalWithoutScheduler}}));
  devices[0].scsi_rotation_rate = 0;
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), Pairs{});
  devices[0].scsi_rotation_rate = -1;
  devices[0].queue.rotational = 0;  // an SSD on none: no finding
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), Pairs{});
}

// --- which transports can say they rotate (fixture transports) -------------------------------------

TEST(QueueFindings, TransportsAreReadFromTheDriverLink) {
  std::vector<std::string> warnings;
  const Topology t = Topology::FromDevices(ScanDevices("transports", &warnings));
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  const std::vector<std::pair<std::string, std::string>> want = {
      {"sda", "sd"}, {"vda", "virtio_blk"}, {"xvda", "vbd"}, {"nvme0n1", "nvme"}, {"loop0", "loop"}};
  for (const auto& [name, transport] : want) {
    const BlockDevice* d = t.FindByName(name);
    ASSERT_NE(d, nullptr) << name;
    EXPECT_EQ(d->transport, transport) << name;
    EXPECT_TRUE(d->request_based) << name;
    EXPECT_EQ(d->queue.rotational, 1) << name;
    EXPECT_EQ(d->queue.scheduler, "none") << name;
  }
  EXPECT_EQ(t.FindByName("sda")->queue.hw_queues, 2);
  EXPECT_EQ(t.FindByName("sda")->scsi_rotation_rate, 7200);  // device/vpd_pgb1, bytes 4-5
  EXPECT_EQ(t.FindByName("vda")->scsi_rotation_rate, -1);     // not sd
  // The LinkedIn fixture's SATA disks have no cached page (a kernel before v5.18): -1, trusted.
  EXPECT_EQ(Topology::FromDevices(ScanDevices("md-raid1-hdd", nullptr)).FindByName("sda")->scsi_rotation_rate, -1);
  EXPECT_EQ(t.FindByName("vda")->queue.hw_queues, 1);
  // The LinkedIn fixture's SATA disks hang off sd too.
  const Topology hdd = Topology::FromDevices(ScanDevices("md-raid1-hdd", nullptr));
  EXPECT_EQ(hdd.FindByName("sda")->transport, "sd");
  EXPECT_EQ(hdd.FindByName("sda1")->transport, "sd");  // a partition carries its disk's
  EXPECT_EQ(hdd.FindByName("md0")->transport, "");
}

TEST(QueueFindings, OnlyTransportsThatReportRotationAreNamed) {
  // Every disk rotational=1 on none: the scsi disk with two queues (QEMU scsi-hd, rotation_rate=7200,
  // virtio-scsi's default queues) and the NVMe namespace are named; the one-queue virtio-blk disk, the
  // Xen disk and the loop device are not (their flag is never the device's word).
  std::vector<BlockDevice> devices = ScanDevices("transports", nullptr);
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61),
            (Pairs{{"nvme0n1", kRotationalWithoutScheduler}, {"sda", kRotationalWithoutScheduler}}));
  const std::vector<QueueFinding> findings = FindQueueConfigProblems(Topology::FromDevices(devices), kKernel61);
  ASSERT_EQ(findings.size(), 2u);
  EXPECT_EQ(findings[1].evidence, "rotational=1 (driver sd), 2 hardware queues, scheduler none; available: mq-deadline");
  // mq-deadline clears it; nothing else changes.
  Named(&devices, "sda")->queue.scheduler = "mq-deadline";
  Named(&devices, "nvme0n1")->queue.scheduler = "mq-deadline";
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), Pairs{});
  // Each non-reporting transport alone, on every kernel: never named.
  for (const char* name : {"vda", "xvda", "loop0"}) {
    const BlockDevice* d = Named(&devices, name);
    for (const char* kernel : {kKernel61, kKernel611, kKernel618})
      EXPECT_EQ(Found(Topology::FromDevices({*d}), kernel), Pairs{}) << name << " " << kernel;
  }
  // An unknown transport (a virtual disk: nbd, ublk) counts as one that can say.
  BlockDevice nbd = Disk("nbd0", DeviceKind::kOther);
  nbd.queue.rotational = 1;
  nbd.queue.scheduler = "none";
  EXPECT_EQ(Found(Topology::FromDevices({nbd}), kKernel61), (Pairs{{"nbd0", kRotationalWithoutScheduler}}));
}

// --- merging_disabled_under_stack ------------------------------------------------------------------

TEST(QueueFindings, NomergesOnAMemberOfAStackIsAFinding) {
  std::vector<BlockDevice> devices = ScanDevices("md-raid1-hdd", nullptr);
  for (const char* name : {"sda", "sdb"}) Named(&devices, name)->queue.scheduler = "mq-deadline";
  Named(&devices, "sdb")->queue.nomerges = 2;
  const std::vector<QueueFinding> findings = FindQueueConfigProblems(Topology::FromDevices(devices), kKernel61);
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].device, "sdb");
  EXPECT_EQ(findings[0].finding, kMergingDisabledUnderStack);
  EXPECT_EQ(findings[0].evidence, "nomerges=2 under md0 (no merging at all)");
}

TEST(QueueFindings, NomergesWithNothingStackedIsNoFinding) {
  std::vector<BlockDevice> devices = {Disk("nvme0n1", DeviceKind::kNvme)};
  devices[0].queue.nomerges = 2;
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), Pairs{});
  BlockDevice dm = Disk("dm-0", DeviceKind::kDm);
  dm.dm_name = "vg-lv";
  Stack(&devices, dm, {"nvme0n1"});
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), (Pairs{{"nvme0n1", kMergingDisabledUnderStack}}));
}

TEST(QueueFindings, BufferedLoopNomergesBefore611IsTheDriversOwn) {
  std::vector<BlockDevice> devices = {Disk("loop0", DeviceKind::kLoop)};
  devices[0].queue.scheduler = "none";
  devices[0].queue.nomerges = 2;
  devices[0].loop_direct_io = 0;
  Stack(&devices, Disk("dm-0", DeviceKind::kDm), {"loop0"});
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), Pairs{});
  // 667ea36378cf (v6.11): the driver no longer sets it, so it was set by someone.
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel611), (Pairs{{"loop0", kMergingDisabledUnderStack}}));
  // In direct I/O mode the driver cleared it on every kernel; 1 it never sets.
  devices[0].loop_direct_io = 1;
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), (Pairs{{"loop0", kMergingDisabledUnderStack}}));
  devices[0].loop_direct_io = 0;
  devices[0].queue.nomerges = 1;
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), (Pairs{{"loop0", kMergingDisabledUnderStack}}));
}

TEST(QueueFindings, StackedDevicesThemselvesAreNeverNamed) {
  // A request-based dm-multipath device with every bad setting: only its paths may be named.
  std::vector<BlockDevice> devices = {Disk("sdc", DeviceKind::kScsi)};
  BlockDevice mpath = Disk("dm-0", DeviceKind::kDm);
  mpath.queue.nomerges = 2;
  mpath.queue.rotational = 1;
  mpath.queue.scheduler = "none";
  mpath.queue.max_sectors_kb = 64;
  Stack(&devices, mpath, {"sdc"});
  devices.back().request_based = true;
  BlockDevice md = Disk("md0", DeviceKind::kMd);
  md.queue = mpath.queue;
  Stack(&devices, md, {"dm-0"});
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel61), Pairs{});
}

// --- max_sectors_capped ----------------------------------------------------------------------------

TEST(QueueFindings, MaxSectorsAQuarterOfTheReferenceOrLess) {
  std::vector<BlockDevice> devices = {Disk("loop0", DeviceKind::kLoop)};
  devices[0].queue.max_hw_sectors_kb = 1280;  // loop on 6.18
  devices[0].queue.max_sectors_kb = 321;
  EXPECT_EQ(Found(Topology::FromDevices(devices), kKernel618), Pairs{});
  devices[0].queue.max_sectors_kb = 320;
  const std::vector<QueueFinding> findings = FindQueueConfigProblems(Topology::FromDevices(devices), kKernel618);
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].finding, kMaxSectorsCapped);
  EXPECT_EQ(findings[0].remedy.rfind("echo 1280 > /sys/block/loop0/queue/max_sectors_kb", 0), 0u) << findings[0].remedy;
}

TEST(QueueFindings, MaxSectorsReferenceFollowsTheKernelsCapAndTheDevice) {
  QueueSettings q;
  q.max_sectors_kb = 512;
  q.max_hw_sectors_kb = 2147483647;  // virtio-blk: 2 TiB hardware limit
  EXPECT_EQ(MaxSectorsReferenceKb(q, ParseKernelRelease(kKernel61)), 1280u);
  EXPECT_EQ(MaxSectorsReferenceKb(q, ParseKernelRelease("6.16.9")), 1280u);
  EXPECT_EQ(MaxSectorsReferenceKb(q, ParseKernelRelease("6.17.0")), 4096u);  // 9b8b84879d4a
  EXPECT_EQ(MaxSectorsReferenceKb(q, std::nullopt), 1280u);
  q.max_hw_sectors_kb = 128;  // an NVMe drive with a 128 KiB MDTS runs at its limit
  EXPECT_EQ(MaxSectorsReferenceKb(q, ParseKernelRelease(kKernel618)), 128u);
  q.max_hw_sectors_kb = 32767;
  q.optimal_io_bytes = 256 * 1024;  // sd uses the Optimal Transfer Length as its default
  EXPECT_EQ(MaxSectorsReferenceKb(q, ParseKernelRelease(kKernel61)), 256u);
  q.max_sectors_kb = 0;  // unknown: nothing to judge
  EXPECT_EQ(MaxSectorsReferenceKb(q, ParseKernelRelease(kKernel61)), 0u);
}

TEST(QueueFindings, DefaultsOfHealthyDevicesGiveNothing) {
  std::vector<BlockDevice> devices;
  BlockDevice virtio = Disk("vda", DeviceKind::kVirtio);
  virtio.queue.max_sectors_kb = 4096;  // the clarification's case: 4096 KiB against a 2 TiB hardware limit
  virtio.queue.max_hw_sectors_kb = 2147483647;
  virtio.queue.scheduler = "none";
  virtio.queue.hw_queues = 2;
  devices.push_back(virtio);
  BlockDevice nvme = Disk("nvme0n1", DeviceKind::kNvme);
  nvme.queue.scheduler = "none";
  nvme.queue.hw_queues = 2;
  nvme.queue.max_sectors_kb = nvme.queue.max_hw_sectors_kb = 512;
  devices.push_back(nvme);
  BlockDevice hdd = Disk("sda", DeviceKind::kScsi);
  hdd.queue.rotational = 1;
  devices.push_back(hdd);
  for (const char* kernel : {kKernel61, kKernel611, kKernel618, ""})
    EXPECT_EQ(Found(Topology::FromDevices(devices), kernel), Pairs{}) << kernel;
  std::vector<std::string> warnings;
  for (const char* fixture : {"loop", "md-raid1", "nvme-partitions", "seed-lvm-snapshot", "dm-multipath"}) {
    const Topology t = Topology::FromDevices(ScanDevices(fixture, &warnings));
    EXPECT_EQ(Found(t, kKernel61), Pairs{}) << fixture;
  }
}

// --- kernel release, classes, log lines ------------------------------------------------------------

TEST(QueueFindings, ParsesTheKernelRelease) {
  ASSERT_TRUE(ParseKernelRelease("6.1.0-27-amd64"));
  EXPECT_EQ(ParseKernelRelease("6.1.0-27-amd64")->minor, 1);
  EXPECT_EQ(ParseKernelRelease("5.10")->major, 5);
  EXPECT_TRUE(ParseKernelRelease("6.11.0")->AtLeast(6, 11));
  EXPECT_FALSE(ParseKernelRelease("6.10.14")->AtLeast(6, 11));
  EXPECT_TRUE(ParseKernelRelease("7.0.0")->AtLeast(6, 17));
  for (const char* bad : {"", "6", "6.", "x.1", "6.x", ".1", "-6.1"}) EXPECT_FALSE(ParseKernelRelease(bad)) << bad;
}

TEST(QueueFindings, DeviceClassesAreExclusive) {
  BlockDevice nvme = Disk("nvme0n1", DeviceKind::kNvme);
  EXPECT_STREQ(DeviceClassName(nvme), "nvme");
  nvme.queue.rotational = 1;  // an NVMe HDD is rotational first
  EXPECT_STREQ(DeviceClassName(nvme), "rotational");
  EXPECT_STREQ(DeviceClassName(Disk("sda", DeviceKind::kScsi)), "non_rotational");
  EXPECT_STREQ(DeviceClassName(Disk("loop0", DeviceKind::kLoop)), "non_rotational");
  BlockDevice unknown = Disk("sdz", DeviceKind::kScsi);
  unknown.queue.rotational = -1;
  EXPECT_EQ(DeviceClassName(unknown), nullptr);
  EXPECT_EQ(DeviceClassName(Disk("dm-0", DeviceKind::kDm)), nullptr);
  EXPECT_EQ(DeviceClassName(Disk("md0", DeviceKind::kMd)), nullptr);
  BlockDevice part = Disk("sda1", DeviceKind::kScsi);
  part.is_partition = true;
  EXPECT_EQ(DeviceClassName(part), nullptr);
}

TEST(QueueFindings, LogsWhatAppearedAndWhatCleared) {
  const QueueFinding a{"sda", kRotationalWithoutScheduler, "rotational=1", "echo"};
  const QueueFinding b{"sdb", kMaxSectorsCapped, "max_sectors_kb=64", "echo 1280"};
  EXPECT_TRUE(DescribeFindingChanges({a, b}, {a, b}).empty());
  const std::vector<FindingChange> changes = DescribeFindingChanges({a}, {b});
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_TRUE(changes[0].appeared);
  EXPECT_EQ(changes[0].text, "queue finding max_sectors_capped on sdb: max_sectors_kb=64; remedy: echo 1280");
  EXPECT_FALSE(changes[1].appeared);
  EXPECT_EQ(changes[1].text, "queue finding rotational_without_scheduler on sda cleared");
}

}  // namespace
}  // namespace mergewatch
