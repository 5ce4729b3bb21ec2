// SPDX-License-Identifier: Apache-2.0
// The source of evidence that needs no BPF: the kernel's per-disk I/O accounting (the fields of
// /proc/diskstats, the same as /sys/block/<disk>/stat), read once a second. It fills the same
// Snapshot the BPF maps do, as far as diskstats can honestly fill it (Snapshot::reduced):
//   - requests completed and bytes per op: the count and the sum of the request-size histogram,
//     all in the overflow slot (only le="+Inf" is exported: diskstats has no per-request sizes);
//   - bios merged into requests: back_merges (diskstats does not tell back from front merges);
//   - bio-based devices (dm, md): their completed I/Os and bytes in the bio-size slots. On 6.1 a
//     dm device counts every piece it split a bio into (dm core resubmits the remainder as a new
//     accounted I/O), not the bios it received: the detector takes that into account.
// Nothing else: no missed merges, no contiguous runs, no latency distribution, no remap origins.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "source/snapshot.h"
#include "topology/topology.h"

namespace mergewatch {

// One device's counters, in /proc/diskstats order after major, minor and name
// (Documentation/admin-guide/iostats.rst): 11 fields before 4.18, 15 with discards (4.18),
// 17 with flushes (5.5). Missing fields are 0.
struct DiskstatsRecord {
  uint32_t major = 0;
  uint32_t minor = 0;
  std::string name;
  std::array<uint64_t, 17> fields{};
  size_t field_count = 0;
};

// Field indexes (iostats.rst numbers them from 1).
enum DiskstatsField : size_t {
  kReadsCompleted = 0,
  kReadsMerged = 1,
  kSectorsRead = 2,
  kReadTimeMs = 3,
  kWritesCompleted = 4,
  kWritesMerged = 5,
  kSectorsWritten = 6,
  kWriteTimeMs = 7,
  kInFlight = 8,
  kIoTimeMs = 9,
  kWeightedIoTimeMs = 10,
  kDiscardsCompleted = 11,
  kDiscardsMerged = 12,
  kSectorsDiscarded = 13,
  kDiscardTimeMs = 14,
  kFlushesCompleted = 15,
  kFlushTimeMs = 16,
};

// The counter fields of one /sys/block/<disk>/stat file (or of a diskstats line after its
// first three columns). False, with a reason, for fewer than 11 fields, more than 17, or a
// field that is not a decimal u64.
bool ParseStatFields(const std::string& text, DiskstatsRecord* record, std::string* error);

// Every line of /proc/diskstats. A malformed line is skipped with a warning (never the whole
// read): a kernel that appends fields keeps the first 17.
std::vector<DiskstatsRecord> ParseProcDiskstats(const std::string& text, std::vector<std::string>* warnings);

// The snapshot of the records whose name is a whole disk (in /sys/block: partitions count
// under their disk, as the BPF source counts a request under rq->q->disk). bio_based names
// the dm/md (and other bio-based) disks, whose I/Os count as bios received, not requests.
Snapshot SnapshotFromDiskstats(const std::vector<DiskstatsRecord>& records, const std::set<std::string>& whole_disks,
                               const std::set<std::string>& bio_based);

// The disks the diskstats source cannot see: request-based whole disks with queue/iostats=0,
// whose statistics the kernel does not keep (their diskstats lines stay at what they were), by
// name. A dm or md device above them still counts its bios, but the disk's requests and merges,
// the evidence, are gone: the daemon says so in its log while it runs on diskstats.
std::vector<std::string> DisksWithoutStatistics(const Topology& topology);

// Reads <proc_root>/diskstats, or where it is hidden (a unit with ProcSubset=pid) or missing,
// <sysfs_root>/block/<disk>/stat and dev of each disk: the same counters (both are
// part_stat_read_all in block/genhd.c). Forget() is a no-op: the kernel owns these counters,
// and a re-created device starts them from zero itself.
class DiskstatsSource final : public SnapshotSource {
 public:
  DiskstatsSource(std::string proc_root, std::string sysfs_root);
  Snapshot Read() override;
  void Forget(const StaleKeys&) override {}
  // "/proc/diskstats" or "/sys/block/*/stat": what the last Read used.
  std::string last_path() const;

 private:
  std::string proc_root_;
  std::string sysfs_root_;
  mutable std::mutex mutex_;  // the main loop's tick and scrapes read at the same time
  std::string last_path_;
  bool warned_proc_ = false;
  std::set<std::string> warned_;
};

}  // namespace mergewatch
