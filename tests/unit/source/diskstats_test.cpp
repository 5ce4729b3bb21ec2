// SPDX-License-Identifier: Apache-2.0
// The diskstats source: parsing (hostile lines included), the snapshot it makes, the fallback to
// /sys/block/*/stat where /proc/diskstats is hidden, the reduced collapse condition and the
// detection info metric.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "detector/detector.h"
#include "source/diskstats.h"
#include "source/source.h"

namespace {

using namespace mergewatch;

// 6.1's /proc/diskstats (17 counter fields), a 4.4 line (11 fields) and a partition.
const char* const kDiskstats =
    " 259       0 nvme0n1 16385 0 131080 900 12 3 96 4 0 1200 904 5 1 80 0 7 2\n"
    " 259       1 nvme0n1p1 100 0 800 9 0 0 0 0 0 10 9 0 0 0 0 0 0\n"
    " 254       3 dm-3 16384 0 131072 800 0 0 0 0 0 1100 800 0 0 0 0 0 0\n"
    "   8       0 sda 10 2 96 5 1 0 8 1 0 6 6\n";

TEST(ParseProcDiskstats, ReadsEveryFieldOfEachKernelsFormat) {
  std::vector<std::string> warnings;
  const std::vector<DiskstatsRecord> r = ParseProcDiskstats(kDiskstats, &warnings);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(r[0].major, 259u);
  EXPECT_EQ(r[0].name, "nvme0n1");
  EXPECT_EQ(r[0].field_count, 17u);
  EXPECT_EQ(r[0].fields[kReadsCompleted], 16385u);
  EXPECT_EQ(r[0].fields[kSectorsRead], 131080u);
  EXPECT_EQ(r[0].fields[kWritesMerged], 3u);
  EXPECT_EQ(r[0].fields[kFlushesCompleted], 7u);
  EXPECT_EQ(r[3].name, "sda");
  EXPECT_EQ(r[3].field_count, 11u);
  EXPECT_EQ(r[3].fields[kReadsMerged], 2u);
}

TEST(ParseProcDiskstats, SkipsHostileLinesWithAReasonAndKeepsTheRest) {
  const std::string text =
      "garbage\n"
      " 8 0 sda 1 2 3\n"                                              // too few fields
      " 8 16 sdb 1 2 x 4 5 6 7 8 9 10 11\n"                           // not a number
      " 8 32 sdc 1 2 3 4 5 6 7 8 9 10 99999999999999999999999\n"     // beyond u64
      " 99999999999 0 sdd 1 2 3 4 5 6 7 8 9 10 11\n"                  // major beyond u32
      "\n"
      " 8 48 sde 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19\n";  // a future kernel's extra fields
  std::vector<std::string> warnings;
  const std::vector<DiskstatsRecord> r = ParseProcDiskstats(text, &warnings);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].name, "sde");
  EXPECT_EQ(r[0].field_count, 17u);
  EXPECT_EQ(r[0].fields[16], 17u);
  ASSERT_EQ(warnings.size(), 5u);
  EXPECT_NE(warnings[0].find("line 1"), std::string::npos);
  EXPECT_NE(warnings[1].find("3 fields"), std::string::npos);
  EXPECT_NE(warnings[2].find("\"x\""), std::string::npos);
}

TEST(SnapshotFromDiskstats, CountsAndBytesPerOpInTheOverflowSlotOnlyWholeDisks) {
  const Snapshot s = SnapshotFromDiskstats(ParseProcDiskstats(kDiskstats, nullptr), {"nvme0n1", "dm-3", "sda"},
                                           {"dm-3"});
  EXPECT_TRUE(s.reduced);
  // nvme0n1 read, write, discard; dm-3 read; sda read, write. No partition (it counts under its disk).
  ASSERT_EQ(s.stats.size(), 6u);
  const mw_dev_stats& read = s.stats.at(DevOpKey{259, 0, 0, 0});
  EXPECT_EQ(read.size_slots[MW_SIZE_SLOTS - 1], 16385u);
  for (int i = 0; i < MW_SIZE_SLOTS - 1; ++i) EXPECT_EQ(read.size_slots[i], 0u) << i;
  EXPECT_EQ(read.size_sum_bytes, 131080u * 512);
  EXPECT_EQ(read.latency_sum_ns, 0u);  // an average only: not a device-time histogram
  const mw_dev_stats& write = s.stats.at(DevOpKey{259, 0, 1, 0});
  EXPECT_EQ(write.back_merges, 3u);
  EXPECT_EQ(s.stats.at(DevOpKey{259, 0, 3, 0}).size_slots[MW_SIZE_SLOTS - 1], 5u);
  // A bio-based device counts as bios received, never as requests.
  const mw_dev_stats& dm = s.stats.at(DevOpKey{254, 3, 0, 0});
  EXPECT_EQ(dm.bio_size_slots[MW_SIZE_SLOTS - 1], 16384u);
  EXPECT_EQ(dm.bio_size_sum_bytes, 131072u * 512);
  EXPECT_EQ(dm.size_slots[MW_SIZE_SLOTS - 1], 0u);
  EXPECT_EQ(s.event_counts[MW_CNT_FLUSH], 7u);
  EXPECT_EQ(s.stats.count(DevOpKey{8, 0, 3, 0}), 0u);  // 11 fields: no discards
}

class DiskstatsSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mw-diskstats-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    Mkdir("/proc");
    Mkdir("/sys");
    Mkdir("/sys/block");
    Mkdir("/sys/block/nvme0n1");
    Mkdir("/sys/block/nvme0n1/mq");
    Mkdir("/sys/block/dm-3");
    Write("/sys/block/nvme0n1/dev", "259:0\n");
    Write("/sys/block/nvme0n1/stat", "   16385        0   131080      900 12 3 96 4 0 1200 904 5 1 80 0 7 2\n");
    Write("/sys/block/dm-3/dev", "254:3\n");
    Write("/sys/block/dm-3/stat", "16384 0 131072 800 0 0 0 0 0 1100 800 0 0 0 0 0 0\n");
  }
  void TearDown() override { std::system(("rm -rf " + root_).c_str()); }
  void Mkdir(const std::string& p) { ASSERT_EQ(mkdir((root_ + p).c_str(), 0755), 0) << strerror(errno); }
  void Write(const std::string& p, const std::string& text) { std::ofstream(root_ + p) << text; }
  std::string root_;
};

TEST_F(DiskstatsSourceTest, ReadsProcDiskstatsFilteredByTheDisksInSysfs) {
  Write("/proc/diskstats", kDiskstats);  // sda is not in this sysfs: left out
  DiskstatsSource source(root_ + "/proc", root_ + "/sys");
  const Snapshot s = source.Read();
  EXPECT_EQ(source.last_path(), root_ + "/proc/diskstats");
  EXPECT_EQ(s.stats.size(), 4u);
  EXPECT_EQ(s.stats.at(DevOpKey{254, 3, 0, 0}).bio_size_slots[MW_SIZE_SLOTS - 1], 16384u);
  EXPECT_EQ(s.stats.count(DevOpKey{8, 0, 0, 0}), 0u);
}

TEST_F(DiskstatsSourceTest, WhereProcDiskstatsIsHiddenReadsTheSameCountersFromSysfs) {
  DiskstatsSource source(root_ + "/proc", root_ + "/sys");  // no proc/diskstats: ProcSubset=pid
  const Snapshot s = source.Read();
  EXPECT_EQ(source.last_path(), root_ + "/sys/block/*/stat");
  Write("/proc/diskstats", kDiskstats);
  const Snapshot from_proc = source.Read();
  ASSERT_EQ(s.stats.size(), from_proc.stats.size());
  for (const auto& [key, stats] : from_proc.stats)
    EXPECT_EQ(memcmp(&s.stats.at(key), &stats, sizeof stats), 0) << key.major << ":" << key.minor << " op " << key.op;
}

TEST_F(DiskstatsSourceTest, AHostileSysfsStatFileSkipsThatDiskOnly) {
  Write("/sys/block/dm-3/stat", "not a stat file\n");
  Write("/sys/block/nvme0n1/dev", "259:0junk\n");
  Mkdir("/sys/block/sdz");  // removed between the listing and the read: no stat, no dev
  DiskstatsSource source(root_ + "/proc", root_ + "/sys");
  EXPECT_TRUE(source.Read().stats.empty());
  EXPECT_THROW(DiskstatsSource(root_ + "/proc", root_ + "/nowhere").Read(), std::runtime_error);
}

CollapseEvidence Reduced(double rate, double mean, double merge_share, int nomerges, double upper_mean,
                         const std::string& upper = "") {
  CollapseEvidence e;
  e.reduced = true;
  e.requests_per_second = rate;
  e.mean_request_bytes = mean;
  e.merge_share = merge_share;
  e.nomerges = nomerges;
  e.max_request_bytes = 512 * 1024;
  e.upper_mean_bio_bytes = upper_mean;
  e.upper = upper;
  return e;
}

// A disk with queue/iostats=0 has still counters: the source cannot see it, and says which.
// Request-based whole disks only: a dm device's own statistics are not the evidence, and a
// partition counts under its disk.
TEST(DisksWithoutStatistics, RequestBasedWholeDisksWithIostatsOff) {
  uint32_t minor = 0;
  auto device = [&minor](const std::string& name, bool request_based, int iostats, bool partition = false) {
    BlockDevice d;
    d.name = name;
    d.major = 259;
    d.minor = minor++;  // a device number each: the topology drops duplicates
    d.disk = partition ? "nvme0n1" : name;
    d.is_partition = partition;
    d.request_based = request_based;
    d.queue.iostats = iostats;
    return d;
  };
  const Topology topology = Topology::FromDevices({device("nvme0n1", true, 0), device("nvme0n1p1", true, 0, true),
                                                   device("nvme1n1", true, 1), device("sda", true, -1),
                                                   device("dm-0", false, 0), device("nvme2n1", true, 0)});
  EXPECT_EQ(DisksWithoutStatistics(topology), (std::vector<std::string>{"nvme0n1", "nvme2n1"}));
}

TEST(ReducedCondition, SmallUnmergedRequestsWithMergingOffOrBehindALargerUpper) {
  CollapsePolicy none;
  none.require_upper = UpperRequirement::kNone;
  // The loop test: 4 KiB, nothing merged, nomerges=2.
  EXPECT_TRUE(ReducedCondition(Reduced(5000, 4096, 0, 2, 0), none));
  // The same with merging allowed and nothing merged (random reads): no evidence of a collapse.
  EXPECT_FALSE(ReducedCondition(Reduced(5000, 4096, 0, 0, 0), none));
  // Merging allowed and merging: quiet.
  EXPECT_FALSE(ReducedCondition(Reduced(5000, 262144, 0.98, 0, 0), none));
  // Requests near max_sectors_kb under nomerges=2: nothing left to merge.
  EXPECT_FALSE(ReducedCondition(Reduced(500, 524288, 0, 2, 0), none));
  // Idle.
  EXPECT_FALSE(ReducedCondition(Reduced(10, 4096, 0, 2, 0), none));
  // Merges happening though nomerges=2 was just set: the window still holds them.
  EXPECT_FALSE(ReducedCondition(Reduced(5000, 4096, 0.5, 2, 0), none));

  CollapsePolicy dm;  // require_upper=dm, the default
  // 6.1's snapshot: dm-3 counts its 4 KiB pieces (its mean is the disk's), nomerges=2 on the disk.
  EXPECT_TRUE(ReducedCondition(Reduced(5000, 4096, 0, 2, 4096, "dm-3"), dm));
  EXPECT_FALSE(ReducedCondition(Reduced(5000, 4096, 0, 2, 4096, ""), dm));  // no upper: not this disk's alert
  // 4.4's iostat: dm bios of 256 KiB over 4 KiB requests with merging allowed (REQ_NOMERGE above).
  EXPECT_TRUE(ReducedCondition(Reduced(5000, 4096, 0, 0, 262144, "dm-3"), dm));
  // The healthy origin: large bios, large requests.
  EXPECT_FALSE(ReducedCondition(Reduced(500, 524288, 0, 2, 524288, "dm-0"), dm));
}

TEST(DetectionInfoFamily, NamesTheSourceEvidenceWhatIsMissingAndWhy) {
  const prometheus::MetricFamily f = DetectionInfoFamily(DiskstatsStatus("line one\nline two"));
  EXPECT_EQ(f.name, "mergewatch_detection_info");
  ASSERT_EQ(f.metric.size(), 1u);
  const auto& l = f.metric[0].label;
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0].name, "source");
  EXPECT_EQ(l[0].value, "diskstats");
  EXPECT_EQ(l[1].value, "reduced");
  EXPECT_EQ(l[2].value, kDiskstatsMissing);
  EXPECT_EQ(l[3].value, "line one");
  EXPECT_EQ(f.metric[0].gauge.value, 1);
  const auto bpf = DetectionInfoFamily(SourceStatus{}).metric[0].label;
  EXPECT_EQ(bpf[0].value, "bpf");
  EXPECT_EQ(bpf[1].value, "full");
  EXPECT_EQ(bpf[2].value, "");
  EXPECT_EQ(DetectionInfoFamily(DiskstatsStatus(std::string(500, 'x'))).metric[0].label[3].value.size(), 200u);
}

// The detector relies on block_getrq and block_bio_remap though only block_rq_issue and
// block_rq_complete must load: either one not attached (or not loaded at all) makes it blind, said in
// the one info metric; block_bio_queue (detached on purpose without stacked devices) never does.
TEST(WithProgramEvidence, BlindWhenAProgramTheDetectorNeedsIsNotAttached) {
  const std::vector<ProgramStatus> all = {{"block_rq_issue", "tp_btf", true},
                                          {"block_rq_complete", "tp_btf", true},
                                          {"block_getrq", "tp_btf", true},
                                          {"block_bio_remap", "tp_btf", true},
                                          {"block_bio_queue", "tp_btf", false}};
  const SourceStatus full = WithProgramEvidence(SourceStatus{}, all);
  EXPECT_EQ(full.evidence, "full");
  EXPECT_EQ(full.missing, "");
  EXPECT_EQ(full.reason, "");

  std::vector<ProgramStatus> no_getrq = all;
  no_getrq[2].attached = false;
  const SourceStatus blind = WithProgramEvidence(SourceStatus{}, no_getrq);
  EXPECT_EQ(blind.source, "bpf");
  EXPECT_EQ(blind.evidence, "blind");
  EXPECT_EQ(blind.missing, "missed_merges,merge_runs");
  EXPECT_EQ(blind.reason, "block_getrq not attached: merge collapse cannot be detected");

  std::vector<ProgramStatus> no_remap(all.begin(), all.begin() + 3);  // block_bio_remap not loaded at all
  EXPECT_EQ(WithProgramEvidence(SourceStatus{}, no_remap).missing, "remap_origins");
  std::vector<ProgramStatus> neither = all;
  neither[2].attached = neither[3].attached = false;
  const SourceStatus both = WithProgramEvidence(SourceStatus{}, neither);
  EXPECT_EQ(both.missing, "missed_merges,merge_runs,remap_origins");
  EXPECT_EQ(both.reason, "block_getrq, block_bio_remap not attached: merge collapse cannot be detected");
  EXPECT_EQ(DetectionInfoFamily(both).metric[0].label[1].value, "blind");

  // The diskstats source is reduced, not blind, whatever the (absent) programs; no list yet: unchanged.
  const SourceStatus reduced = DiskstatsStatus("--source=diskstats");
  EXPECT_EQ(WithProgramEvidence(reduced, {}).evidence, "reduced");
  EXPECT_EQ(WithProgramEvidence(reduced, neither).missing, kDiskstatsMissing);
  EXPECT_EQ(WithProgramEvidence(SourceStatus{}, {}).evidence, "full");
}

TEST(ParseSourceChoice, TheThreeValuesOnly) {
  SourceChoice c;
  EXPECT_TRUE(ParseSourceChoice("auto", &c) && c == SourceChoice::kAuto);
  EXPECT_TRUE(ParseSourceChoice("bpf", &c) && c == SourceChoice::kBpf);
  EXPECT_TRUE(ParseSourceChoice("diskstats", &c) && c == SourceChoice::kDiskstats);
  EXPECT_FALSE(ParseSourceChoice("Diskstats", &c));
  EXPECT_FALSE(ParseSourceChoice("", &c));
}

}  // namespace
