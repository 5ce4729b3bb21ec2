// SPDX-License-Identifier: Apache-2.0
#include "tests/unit/source/pair_stats.h"
#include "metrics/exporter.h"
#include "metrics/exposition.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

namespace mergewatch {
namespace {

class FakeNamer final : public DeviceNamer {
 public:
  std::map<std::pair<uint32_t, uint32_t>, std::string> names;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> diskseqs;  // current incarnation, where known
  std::optional<std::string> NameOf(uint32_t major, uint32_t minor, uint64_t diskseq) override {
    auto it = names.find({major, minor});
    if (it == names.end()) return std::nullopt;
    auto seq = diskseqs.find({major, minor});
    if (diskseq != 0 && seq != diskseqs.end() && seq->second != diskseq) return std::nullopt;
    return it->second;
  }
};

void AddRequests(mw_dev_stats* s, __u64 bytes, __u64 count, __u64 latency_ns) {
  s->size_slots[mw_hist_slot(bytes, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS)] += count;
  s->size_sum_bytes += bytes * count;
  s->latency_slots[mw_hist_slot(latency_ns, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS)] += count;
  s->latency_sum_ns += latency_ns * count;
}

// The 2019 incident's shape: the NVMe disk gets 8-sector reads, the snapshot large bios.
Snapshot IncidentSnapshot() {
  Snapshot snap;
  mw_dev_stats& nvme = snap.stats[{259, 0, 0}];
  AddRequests(&nvme, 4096, 16385, 300000);
  nvme.missed_merges = 16000;
  // Four of its reads lost their latency sample: one found no in-flight slot, three had no completion seen.
  nvme.latency_slots[mw_hist_slot(300000, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS)] -= 4;
  nvme.latency_sum_ns -= 4 * 300000;
  nvme.latency_lost_inflight_full = 1;
  nvme.latency_lost_not_seen = 3;
  mw_dev_stats& nvme_write = snap.stats[{259, 0, 1}];
  AddRequests(&nvme_write, 262144, 3, 2000000);
  nvme_write.back_merges = 189;
  mw_dev_stats& dm = snap.stats[{253, 3, 0}];
  dm.bio_size_slots[mw_hist_slot(262144, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS)] = 256;
  dm.bio_size_sum_bytes = 256ull * 262144;
  // Two raw ops that both export as op="other": summed into one series.
  AddRequests(&snap.stats[{259, 0, 5}], 4096, 2, 5000);
  AddRequests(&snap.stats[{259, 0, 7}], 4096, 3, 5000);
  // A device that is gone from sysfs: not exported.
  AddRequests(&snap.stats[{7, 12, 0}], 4096, 10, 5000);
  // The remap chain: the snapshot's 4 KiB pieces became requests at the disk.
  snap.origins[{259, 0, 253, 3, 0}] = PairStats(16385, 16000, 0, 0, 0, 0);
  // The snapshot's own view: 16381 of its requests dispatched and completed at 300 us, 4 still in flight.
  mw_origin_stats& volume = snap.origins[{259, 0, 253, 3, 0}];
  volume.dispatched = 16385;
  volume.dispatched_bytes = 16385ull * 4096;
  volume.latency_slots[9] = 16381;  // le 2^19 ns = 524 us
  volume.latency_sum_ns = 16381ull * 300000;
  // Remapped from a device that is gone: not exported.
  snap.origins[{259, 0, 253, 9, 0}] = PairStats(5, 0, 0, 0, 0, 0);
  snap.event_counts[MW_CNT_COMPLETE_UNMATCHED] = 4;
  snap.programs = {{"block_rq_issue", "tp_btf", true}, {"block_unplug", "tp_btf", false}};
  return snap;
}

std::string Expose(const Snapshot& snap) {
  FakeNamer namer;
  namer.names = {{{259, 0}, "nvme1n1"}, {{253, 3}, "dm-3"}};
  DaemonStatus status{"1.2.3", "6.1.0-test", 16384};
  return RenderExposition(BuildMetricFamilies(snap, namer, status));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Exporter, KnownSnapshotMatchesGoldenExposition) {
  const std::string golden_path = std::string(MERGEWATCH_FIXTURE_DIR) + "/exposition/incident.prom";
  const std::string text = Expose(IncidentSnapshot());
  if (getenv("MERGEWATCH_UPDATE_GOLDEN") != nullptr) {
    // Update mode writes the golden and fails: a run that compared nothing must never pass.
    std::ofstream(golden_path) << text;
    FAIL() << "MERGEWATCH_UPDATE_GOLDEN is set: rewrote " << golden_path
           << "; review the diff, then run again without it";
  }
  EXPECT_EQ(text, ReadFile(golden_path)) << "regenerate with MERGEWATCH_UPDATE_GOLDEN=1 if the change is intended";
}

TEST(Exporter, ExpositionPassesPromtool) {
  const std::string path = testing::TempDir() + "/mergewatch_exposition.prom";
  std::ofstream(path) << Expose(IncidentSnapshot());
  FILE* pipe = popen(("promtool check metrics < " + path + " 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buf[4096];
  std::string out;
  while (fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  int status = pclose(pipe);
  EXPECT_EQ(status, 0) << "promtool check metrics failed:\n" << out;
}

TEST(Exporter, FourKibRequestsAreInTheFourKibBucket) {
  const std::string text = Expose(IncidentSnapshot());
  EXPECT_NE(text.find("mergewatch_request_size_bytes_bucket{device=\"nvme1n1\",op=\"read\",le=\"4096\"} 16385"),
            std::string::npos);
  EXPECT_NE(text.find("mergewatch_request_size_bytes_bucket{device=\"nvme1n1\",op=\"read\",le=\"2048\"} 0"),
            std::string::npos);
  EXPECT_NE(text.find("mergewatch_request_size_bytes_bucket{device=\"nvme1n1\",op=\"read\",le=\"+Inf\"} 16385"),
            std::string::npos);
}

TEST(Exporter, OpsSharingALabelAreSummedAndRemovedDevicesDropped) {
  const std::string text = Expose(IncidentSnapshot());
  EXPECT_NE(text.find("mergewatch_request_size_bytes_count{device=\"nvme1n1\",op=\"other\"} 5"), std::string::npos);
  EXPECT_EQ(text.find("loop12"), std::string::npos);
  EXPECT_EQ(text.find("7:12"), std::string::npos);
  EXPECT_NE(text.find("mergewatch_unresolved_devices 1"), std::string::npos);
}

// Lost latency samples are per device, op and reason, and account for the gap between the two counts.
TEST(Exporter, LostLatencySamplesAccountForTheGapPerDevice) {
  Snapshot snap = IncidentSnapshot();
  snap.stats[{259, 0, 5}].latency_lost_not_seen = 2;  // op="other" is summed over the raw ops it stands for
  snap.stats[{259, 0, 7}].latency_lost_not_seen = 5;
  const std::string text = Expose(snap);
  for (const char* series : {
           "mergewatch_request_size_bytes_count{device=\"nvme1n1\",op=\"read\"} 16385\n",
           "mergewatch_request_latency_seconds_count{device=\"nvme1n1\",op=\"read\"} 16381\n",
           "mergewatch_request_latency_lost_total{device=\"nvme1n1\",op=\"read\",reason=\"inflight_map_full\"} 1\n",
           "mergewatch_request_latency_lost_total{device=\"nvme1n1\",op=\"read\",reason=\"complete_not_seen\"} 3\n",
           "mergewatch_request_latency_lost_total{device=\"nvme1n1\",op=\"other\",reason=\"complete_not_seen\"} 7\n",
           "mergewatch_request_latency_lost_total{device=\"nvme1n1\",op=\"write\",reason=\"complete_not_seen\"} 0\n"})
    EXPECT_NE(text.find(series), std::string::npos) << series;
  EXPECT_EQ(text.find("mergewatch_request_latency_lost_total{device=\"dm-3\""), std::string::npos);  // no requests
}

TEST(Exporter, BioBasedDevicesExportBioSizesOnly) {
  const std::string text = Expose(IncidentSnapshot());
  EXPECT_NE(text.find("mergewatch_bio_size_bytes_bucket{device=\"dm-3\",op=\"read\",le=\"262144\"} 256"),
            std::string::npos);
  EXPECT_EQ(text.find("mergewatch_request_size_bytes_count{device=\"dm-3\""), std::string::npos);
}

// The diskstats source's snapshot (reduced): count and sum under le="+Inf" only, merges as kind="all", nothing
// it cannot see (latency, missed merges, a dm device's split pieces as bio sizes, BPF drop counters).
TEST(Exporter, ReducedSnapshotExportsOnlyWhatDiskstatsCanSay) {
  Snapshot snap;
  snap.reduced = true;
  mw_dev_stats& nvme = snap.stats[{259, 0, 0}];
  nvme.size_slots[MW_SIZE_SLOTS - 1] = 16384;
  nvme.size_sum_bytes = 16384ull * 4096;
  nvme.back_merges = 7;
  mw_dev_stats& dm = snap.stats[{253, 3, 0}];
  dm.bio_size_slots[MW_SIZE_SLOTS - 1] = 16384;
  dm.bio_size_sum_bytes = 16384ull * 4096;
  snap.event_counts[MW_CNT_FLUSH] = 3;
  snap.programs = {{"block_rq_issue", "none", false}};
  const std::string text = Expose(snap);
  EXPECT_NE(text.find("mergewatch_request_size_bytes_count{device=\"nvme1n1\",op=\"read\"} 16384\n"
                      "mergewatch_request_size_bytes_sum{device=\"nvme1n1\",op=\"read\"} 67108864\n"
                      "mergewatch_request_size_bytes_bucket{device=\"nvme1n1\",op=\"read\",le=\"+Inf\"} 16384\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("le=\"4096\""), std::string::npos);
  EXPECT_NE(text.find("mergewatch_bio_merges_total{device=\"nvme1n1\",op=\"read\",kind=\"all\"} 7"),
            std::string::npos);
  EXPECT_EQ(text.find("kind=\"back\""), std::string::npos);
  for (const char* absent : {"mergewatch_request_latency_seconds_count{", "mergewatch_missed_merges_total{",
                             "mergewatch_bio_size_bytes_count{", "device=\"dm-3\"", "mergewatch_bpf_events_dropped_total{",
                             "kind=\"passthrough\"", "\nmergewatch_bpf_inflight_capacity "})
    EXPECT_EQ(text.find(absent), std::string::npos) << absent;
  EXPECT_NE(text.find("mergewatch_non_io_requests_total{kind=\"flush\"} 3"), std::string::npos);
  EXPECT_NE(text.find("mergewatch_bpf_program_attached{tracepoint=\"block_rq_issue\",mode=\"none\"} 0"),
            std::string::npos);
}

// loop7 was detached and attached again: the old incarnation's keys (diskseq 41) must not
// show under the name, the new one's (42) must.
TEST(Exporter, DataOfAPreviousIncarnationOfTheMinorIsNotExported) {
  Snapshot snap;
  AddRequests(&snap.stats[{7, 7, 0, 41}], 4096, 1000, 5000);
  AddRequests(&snap.stats[{7, 7, 0, 42}], 4096, 3, 5000);
  FakeNamer namer;
  namer.names = {{{7, 7}, "loop7"}};
  namer.diskseqs = {{{7, 7}, 42}};
  std::string text = prometheus::TextSerializer().Serialize(BuildMetricFamilies(snap, namer, DaemonStatus{}));
  EXPECT_NE(text.find("mergewatch_request_size_bytes_count{device=\"loop7\",op=\"read\"} 3\n"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("} 1000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("mergewatch_unresolved_devices 1\n"), std::string::npos) << text;
}

TEST(Exporter, APathDiskThatJustLeftSysfsStillCountsUnderItsHead) {
  // nvme2n1 (259:2, diskseq 5) over the paths at 259:1 (diskseq 11) and 259:4 (diskseq 12); the
  // first path has left sysfs, its keys not yet retired: the namer knows only the head.
  Snapshot snap;
  AddRequests(&snap.stats[{259, 1, 0, 11}], 4096, 64, 5000);
  AddRequests(&snap.stats[{259, 4, 0, 12}], 4096, 64, 5000);
  snap.origins[{259, 1, 253, 0, 0, 11}] = PairStats(64, 60, 0, 0, 0, 0);
  snap.path_heads[DiskKey{259, 1, 11}] = DiskKey{259, 2, 5};
  snap.path_heads[DiskKey{259, 4, 12}] = DiskKey{259, 2, 5};
  FakeNamer namer;
  namer.names = {{{259, 2}, "nvme2n1"}, {{259, 4}, "nvme2n1"}, {{253, 0}, "dm-0"}};
  namer.diskseqs = {{{259, 2}, 5}, {{259, 4}, 12}};
  std::string text = prometheus::TextSerializer().Serialize(BuildMetricFamilies(snap, namer, DaemonStatus{}));
  EXPECT_NE(text.find("mergewatch_request_size_bytes_count{device=\"nvme2n1\",op=\"read\"} 128\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("mergewatch_remapped_requests_total{device=\"nvme2n1\",origin=\"dm-0\",op=\"read\"} 64\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("mergewatch_unresolved_devices 0\n"), std::string::npos) << text;

  // Its head gone too (or a new disk at its major:minor): nothing to count it under.
  namer.diskseqs[{259, 2}] = 6;
  text = prometheus::TextSerializer().Serialize(BuildMetricFamilies(snap, namer, DaemonStatus{}));
  EXPECT_EQ(text.find("device=\"nvme2n1\",op=\"read\"} 128"), std::string::npos) << text;
}

TEST(Exporter, RemappedRequestsNameTheOriginDevice) {
  std::string text = Expose(IncidentSnapshot());
  EXPECT_NE(text.find("mergewatch_remapped_requests_total{device=\"nvme1n1\",origin=\"dm-3\",op=\"read\"} 16385\n"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("mergewatch_remapped_missed_merges_total{device=\"nvme1n1\",origin=\"dm-3\",op=\"read\"} 16000\n"),
      std::string::npos);
  EXPECT_EQ(text.find("origin=\"dm-9\""), std::string::npos);
}

TEST(Log2Histogram, CumulatesAndCountsTheOverflowOnlyInInf) {
  __u64 slots[4] = {1, 2, 3, 4};
  auto h = Log2Histogram(slots, 4, 100, 9, 1.0);  // bytes: per_unit 1
  ASSERT_EQ(h.bucket.size(), 3u);
  EXPECT_EQ(h.bucket[0].upper_bound, 512.0);
  EXPECT_EQ(h.bucket[2].upper_bound, 2048.0);
  EXPECT_EQ(h.bucket[2].cumulative_count, 6u);
  EXPECT_EQ(h.sample_count, 10u);
  EXPECT_EQ(h.sample_sum, 100.0);
}

// The untimed gauge: counted less timed and lost, less the kernel's requests in flight of the op's direction
// (Snapshot::in_flight), never below 0; and which clock timed the samples.
TEST(Exporter, UntimedLeavesOutWhatIsInFlightAndClocksAreExported) {
  Snapshot snap = IncidentSnapshot();
  mw_dev_stats& read = snap.stats[{259, 0, 0}];
  read.latency_lost_not_seen = 0;  // read: 16385 counted, 16381 timed, 1 lost: 3 untimed or in flight
  read.timed_kernel_stamp = 16000;
  read.timed_dispatch_clock = 381;
  EXPECT_NE(Expose(snap).find("mergewatch_request_latency_untimed{device=\"nvme1n1\",op=\"read\"} 3\n"),
            std::string::npos);
  snap.in_flight[DiskKey{259, 0, 0}] = {2, 40};  // the 40 writes in flight are not reads
  std::string text = Expose(snap);
  for (const char* series : {
           "mergewatch_request_latency_untimed{device=\"nvme1n1\",op=\"read\"} 1\n",
           "mergewatch_request_latency_timed_total{device=\"nvme1n1\",op=\"read\",clock=\"kernel_stamp\"} 16000\n",
           "mergewatch_request_latency_timed_total{device=\"nvme1n1\",op=\"read\",clock=\"dispatch_clock\"} 381\n",
           "mergewatch_request_latency_timed_total{device=\"nvme1n1\",op=\"read\",clock=\"inflight_table\"} 0\n"})
    EXPECT_NE(text.find(series), std::string::npos) << series;
  snap.in_flight[DiskKey{259, 0, 0}] = {9, 0};  // more in flight than untimed: 0, never negative
  EXPECT_NE(Expose(snap).find("mergewatch_request_latency_untimed{device=\"nvme1n1\",op=\"read\"} 0\n"),
            std::string::npos);
}

}  // namespace
}  // namespace mergewatch
