// SPDX-License-Identifier: Apache-2.0
// A point-in-time copy of the BPF maps, summed over CPUs: the input of the exporter and
// the detector, so both can be fed fixtures in tests.
#pragma once

#include <linux/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "attribution/top_services.h"
#include "mergewatch/abi.h"

namespace mergewatch {

struct DevOpKey {
  uint32_t major = 0;
  uint32_t minor = 0;
  uint32_t op = 0;       // raw REQ_OP_*
  uint64_t diskseq = 0;  // which incarnation of major:minor; 0 if the kernel has none (< 5.15)
  bool operator<(const DevOpKey& o) const {
    return std::tie(major, minor, op, diskseq) < std::tie(o.major, o.minor, o.op, o.diskseq);
  }
  bool operator==(const DevOpKey& o) const {
    return major == o.major && minor == o.minor && op == o.op && diskseq == o.diskseq;
  }
};

// Requests created at disk major:minor for bios first submitted to origin (block_bio_remap chain).
struct OriginKey {
  uint32_t major = 0;
  uint32_t minor = 0;
  uint32_t origin_major = 0;
  uint32_t origin_minor = 0;
  uint32_t op = 0;
  uint64_t diskseq = 0;  // of the disk
  bool operator<(const OriginKey& o) const {
    return std::tie(major, minor, origin_major, origin_minor, op, diskseq) <
           std::tie(o.major, o.minor, o.origin_major, o.origin_minor, o.op, o.diskseq);
  }
};

// One incarnation of a disk: major:minor with its diskseq (0 if the kernel has none, < 5.15).
struct DiskKey {
  uint32_t major = 0, minor = 0;
  uint64_t diskseq = 0;
  bool operator<(const DiskKey& o) const {
    return std::tie(major, minor, diskseq) < std::tie(o.major, o.minor, o.diskseq);
  }
  bool operator==(const DiskKey& o) const {
    return major == o.major && minor == o.minor && diskseq == o.diskseq;
  }
};

// One BPF program and whether it is attached now.
struct ProgramStatus {
  std::string tracepoint;  // block_rq_issue, ...
  std::string mode;        // tp_btf or raw_tp
  bool attached = false;
};

struct Snapshot {
  std::map<DevOpKey, mw_dev_stats> stats;
  std::vector<ProgramStatus> programs;
  std::map<OriginKey, mw_origin_stats> origins;
  std::array<uint64_t, MW_CNT_MAX> event_counts{};
  // Runs of our programs the kernel skipped because the same program was already running on
  // that CPU (bpf_prog_info.recursion_misses, 5.12+): a completion in an interrupt on top of a
  // completion in a kworker. Each is an event lost (a request untimed, or not counted).
  uint64_t nested_runs_skipped = 0;
  // Reduced evidence (the diskstats source, source/diskstats.h): request counts and bytes sit
  // in the overflow slot (no per-request sizes), merges in back_merges (back and front not told
  // apart), no latencies, no missed merges, no origins. The exporter and the detector read it.
  bool reduced = false;
  // Native NVMe multipath path disk -> its head, learnt while both were in sysfs (DepartedPaths).
  // A path disk that has just left sysfs keeps its keys in the maps until the next tick retires
  // them onto its head; until then its keys count under this head, or the head's counters would
  // drop for a scrape between the rescan and that tick.
  std::map<DiskKey, DiskKey> path_heads;
  // Requests the kernel has in flight (<sysfs>/dev/block/M:m/inflight: reads, writes), read after the
  // maps for each disk whose requests counted exceed those timed and lost (InFlightGaps): what the
  // untimed figure (mergewatch_request_latency_untimed) leaves out. A disk without the file: absent.
  std::map<DiskKey, std::array<uint64_t, 2>> in_flight;
};

// Requests of `stats` (summed over its CPUs) neither timed nor counted lost by a reason: in flight,
// or completions no program saw (bpf/request_clock.bpf.h keeps no record to find those by).
uint64_t UntimedRequests(const mw_dev_stats& stats);
// The disks with untimed requests in `snapshot`, whose in-flight counts say how many are only in flight.
std::set<DiskKey> InFlightGaps(const Snapshot& snapshot);
// <sysfs_root>/dev/block/M:m/inflight as {reads, writes}; false if it cannot be read or parsed.
bool ReadInFlight(const std::string& sysfs_root, uint32_t major, uint32_t minor, std::array<uint64_t, 2>* out);

// The head a path disk key counts under once the path has left sysfs, or nullptr.
const DiskKey* HeadOfDepartedPath(const Snapshot& snapshot, uint32_t major, uint32_t minor, uint64_t diskseq);

// The one answer to "which device does the data of this map key count under", for every reader of the
// counts (the detector through the topology, the exporter through the scrape's names): what `lookup` (a
// function of major, minor and diskseq returning a device or a name, empty for none) says of the key, else,
// for a path disk that has just left sysfs and whose keys are not retired yet, what it says of the path's head.
// The pruning of the maps asks another question (is the key's device still there at all: FindStaleKeys) and
// must not follow departed paths to their heads, or their keys would never be retired.
template <typename Lookup>
auto CountingDevice(const Snapshot& snapshot, uint32_t major, uint32_t minor, uint64_t diskseq, Lookup lookup)
    -> decltype(lookup(major, minor, diskseq)) {
  if (auto found = lookup(major, minor, diskseq)) return found;
  const DiskKey* head = HeadOfDepartedPath(snapshot, major, minor, diskseq);
  if (head == nullptr) return {};
  return lookup(head->major, head->minor, head->diskseq);
}

// Keys of devices that no longer exist (or whose major:minor now belongs to a newer disk).
struct StaleKeys {
  std::vector<DevOpKey> stats;
  std::vector<OriginKey> origins;
  bool empty() const { return stats.empty() && origins.empty(); }
};

// Adds every counter of `from` into `into` (per-CPU values, or ops that share a label).
void AccumulateStats(const mw_dev_stats& from, mw_dev_stats* into);
void AccumulateOrigin(const mw_origin_stats& from, mw_origin_stats* into);

// Walks a BPF hash map's keys with `next_key(prev or nullptr, &next) -> bool` (the shape of
// bpf_map_get_next_key) and calls `visit(key)` once per key. get_next_key restarts at the
// first key when `prev` was deleted meanwhile, so a plain walk would visit (and sum) the keys
// before it twice: a doubled counter in one scrape, a counter reset in the next. `seen`
// skips them. Returns how many keys were visited again and skipped.
template <typename RawKey, typename NextKey, typename Visit>
size_t VisitEachKeyOnce(NextKey next_key, Visit visit) {
  std::set<std::vector<uint8_t>> seen;
  RawKey key{}, next{};
  bool first = true;
  size_t repeated = 0;
  while (next_key(first ? nullptr : &key, &next)) {
    first = false;
    key = next;
    const auto* bytes = reinterpret_cast<const uint8_t*>(&key);
    if (!seen.emplace(bytes, bytes + sizeof(key)).second) {
      ++repeated;
      continue;
    }
    visit(key);
  }
  return repeated;
}

// Where snapshots come from: the live BPF maps, or a fixture in tests.
class SnapshotSource {
 public:
  virtual ~SnapshotSource() = default;
  virtual Snapshot Read() = 0;
  // Requests per (disk, upper device) pair and cgroup (attribution/top_services.h), cumulative;
  // read per tick, never per scrape. Empty for a source without them (diskstats).
  virtual ServiceCounters ReadServices() { return {}; }
  // Drops the data of removed devices for good, so a number reused later starts from zero
  // and the maps do not fill up with the dead.
  virtual void Forget(const StaleKeys& keys) = 0;
};

}  // namespace mergewatch
