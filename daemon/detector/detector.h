// SPDX-License-Identifier: Apache-2.0
// Merge-collapse detector: finds disks that dispatch small requests one by one although
// contiguous neighbours could have been merged (the 2019 nomerges=2 incident), and never
// fires on small I/O that simply cannot merge.
//
// Pure: it takes cumulative map snapshots, the topology and the time as inputs, so tests
// drive it with synthetic snapshots and a fake clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <regex>
#include <functional>
#include <string>
#include <vector>

#include "clock.h"
#include "attribution/top_services.h"
#include "source/snapshot.h"
#include "topology/topology.h"

namespace mergewatch {

// "250ms", "10s", "2m", "1h" -> duration; false on anything else (no unit, negative, garbage).
bool ParseDuration(const std::string& text, Duration* out);

enum class UpperRequirement { kDm, kAny, kNone };
bool ParseUpperRequirement(const std::string& text, UpperRequirement* out);

struct CollapsePolicy {
  std::string lower_devices = "^nvme";      // regex on the kernel name of candidate disks
  UpperRequirement require_upper = UpperRequirement::kDm;
  Duration window = std::chrono::seconds(10);
  Duration raise_after = std::chrono::seconds(5);
  Duration clear_after = std::chrono::seconds(30);
  double min_requests_per_second = 50;      // an idle or nearly idle disk never fires
  // Deprecated, ignored: the size rule is relative now (min_run_size_ratio), so that 8 and
  // 16 KiB requests that should have been merged page like 4 KiB ones. Kept so that
  // --collapse.min-small-share still parses.
  double min_small_share = 0.8;
  double min_missed_share = 0.5;            // share of requests that were a missed merge
  double max_merge_share = 0.05;            // merged bios / (requests + merged bios): about zero
  double min_upper_size_ratio = 4;          // upper mean bio size / lower mean request size
  double min_run_size_ratio = 4;            // size merging would have built / mean request size
  // The split ticket (SplitCondition): pieces this large or larger cost little per byte (the
  // remedy's own target: an LVM snapshot chunk of 64 KiB), so they are no ticket.
  double split_max_piece_bytes = 64 * 1024;
  // --devices.exclude/--devices.include: an excluded disk is no candidate (it has no series to
  // page on); as the upper device of a candidate it still counts. Unset: nothing is excluded.
  std::function<bool(const std::string&)> excluded_device;
};

// What the detector saw on one disk over the window: the alert's evidence.
struct CollapseEvidence {
  double window_seconds = 0;
  uint64_t requests = 0;
  double requests_per_second = 0;
  double small_share = 0;
  double missed_share = 0;
  double merge_share = 0;
  double back_merges_per_second = 0;
  double mean_request_bytes = 0;
  // The size merging would have built: the mean contiguous run the missed merges formed
  // (missed_merge_run_bytes / missed_merge_runs, capped by the queue limits in BPF). Without
  // run data (runs_reported false), estimated as requests / (requests - missed) requests of
  // the mean size: each run has one request that was not a missed merge, its first.
  double merged_request_bytes = 0;
  bool runs_reported = false;
  // The upper device the disk's requests came from (block_bio_remap chain), or without
  // remapped requests in the window the one with the largest bios; "" if none.
  std::string upper;
  double upper_mean_bio_bytes = 0;   // 0 when the upper device received no bios in the window
  double upper_request_share = 0;    // share of the disk's requests remapped from upper
  // The remap chain decided `upper` (for the rest of a disk with remap data: "", those requests came down no
  // chain), rather than a guess from bio sizes that a quiet window would leave unknown.
  bool upper_by_remap = false;
  // Reduced evidence (the diskstats source): no missed merges or runs; the condition rests on
  // the mean sizes, the merge share and the queue settings instead (ReducedCondition).
  bool reduced = false;
  int nomerges = -1;                 // the disk's queue/nomerges (its multipath paths' worst)
  double max_request_bytes = 0;      // queue/max_sectors_kb in bytes; 0 if unknown
};

// The collapse condition on reduced evidence (no per-request data), pure: enough requests, about
// no merges, small requests, and either the upper device's mean I/O at least min_upper_size_ratio
// times the disk's mean request (splits that were not merged back, where the upper counts the
// bios it received), or the queue forbidding merges (nomerges=2) with requests at most
// 1/min_run_size_ratio of max_sectors_kb (on 6.1 a dm device counts its split pieces, so its
// mean is the disk's own and only the setting tells the collapse apart).
bool ReducedCondition(const CollapseEvidence& e, const CollapsePolicy& policy);

// The split ticket's condition on one pair's evidence, pure: the upper device's bios reach the disk
// cut into pieces at least min_upper_size_ratio times smaller and below split_max_piece_bytes, at
// min_requests_per_second or more, and nothing merged them or could have (missed share and merge
// share both at most max_merge_share: each piece was issued before the next existed, as with direct
// reads of a snapshot on Linux 6.1, where no setting merges them). Never on reduced evidence (the
// diskstats source sees no missed merges) nor without an upper device.
bool SplitCondition(const CollapseEvidence& e, const CollapsePolicy& policy);

// An LVM snapshot (a dm device with a -cow layer below it), and the chunk the split ticket names for an
// upper device: md/chunk_size or queue/chunk_sectors where sysfs has one, else for a snapshot the piece
// size seen at the disk rounded to a power of two (its chunk; the table itself needs a dm ioctl), else 0.
bool IsSnapshot(const BlockDevice* upper, const Topology& topology);
uint64_t SplitChunkBytes(const BlockDevice* upper, const Topology& topology, double mean_request_bytes);

// One verdict per candidate pair (disk, upper device the I/O was submitted to): the condition is
// decided per pair, so a backup reading a snapshot pages beside any healthy I/O on its origin.
// upper is "" (or, without any remap data, the guessed upper device) for the disk's I/O that came
// down no remap chain.
struct DiskVerdict {
  std::string device;
  bool condition = false;  // the collapse pattern holds over the current window
  bool raised = false;     // after hysteresis: what the alert shows
  std::string upper;       // the alert's upper label: fixed while raised
  CollapseEvidence evidence;
  // While the condition holds or the alert is raised: the words of the onset log line (the
  // evidence sentence, its cause and its remedy), so /status and `mergewatch` say the same.
  // Empty otherwise.
  std::string evidence_text;
  std::string cause;
  std::string remedy;
  // The split ticket of the pair (mergewatch_io_split_finding): SplitCondition over the window, with
  // the collapse's raise/clear hysteresis; off at once while the pair pages for a collapse, while the
  // disk has the max_sectors_capped queue finding (SetSplitVetoes) or on reduced evidence.
  bool split_condition = false;
  bool split_raised = false;
  uint64_t split_chunk_bytes = 0;  // SplitChunkBytes: the chunk named in the cause (0 unknown)
  std::string split_evidence_text;  // while split_condition or split_raised, as logged
  std::string split_cause;
  std::string split_remedy;
  // Who sent the pair's requests over the window, while the condition holds (CollapseServices):
  // the top services and "other"; empty otherwise, and always from the detector itself.
  std::vector<ServiceShare> services;
  uint64_t service_requests = 0;  // the pair's requests those shares are of
};

// One onset or clear, with a line a person can act on.
struct CollapseEvent {
  bool onset = false;
  bool split = false;  // an onset or clear of the split ticket, not of the collapse page
  std::string device;
  std::string upper;
  std::string message;
};

// The cause of a collapse and what to do, from the queue settings the kernel merged under. Pure, so
// each cause has its unit test (tests/unit/detector/detector_test.cpp, CollapseRemedy).
struct RemedyInput {
  std::vector<std::string> queues;  // the request queues where merging happens (the multipath paths, or the disk)
  int nomerges = -1;                // the worst of those queues; -1 unreadable
  std::string scheduler;            // the disk's active I/O scheduler ("" unknown)
  std::string upper;                // the device the I/O was submitted to ("" none)
  double mean_request_bytes = 0;
};
struct Remedy {
  std::string cause;
  std::string remedy;
};
Remedy CollapseRemedy(const RemedyInput& in);

class CollapseDetector {
 public:
  explicit CollapseDetector(CollapsePolicy policy);

  // Feeds the cumulative snapshot taken at `now` and returns the onsets and clears it caused.
  std::vector<CollapseEvent> Update(TimePoint now, const Snapshot& snapshot, const Topology& topology);

  // Every candidate disk that has data, sorted by name.
  std::vector<DiskVerdict> Verdicts() const;
  const CollapsePolicy& policy() const { return policy_; }
  // The disks whose queue finding max_sectors_capped holds (findings/queue_findings.h): that finding
  // names the cause of their small requests, so they get no split ticket. Taken by the next Update.
  void SetSplitVetoes(std::vector<std::string> capped_disks) { split_vetoes_ = std::move(capped_disks); }

 private:
  // The parts of the onset line: where (disk, upper, multipath paths), the evidence, cause, remedy.
  struct Diagnosis {
    std::string where, evidence, cause, remedy, cleared_suffix;
  };
  // What the disk's requests for one upper device (remap origin) showed: cumulative, read and write.
  struct PairTotals {
    uint64_t requests = 0, request_bytes = 0, missed = 0, runs = 0, run_bytes = 0, merges = 0;
    PairTotals& operator+=(const PairTotals& o) {
      requests += o.requests;
      request_bytes += o.request_bytes;
      missed += o.missed;
      runs += o.runs;
      run_bytes += o.run_bytes;
      merges += o.merges;
      return *this;
    }
  };
  struct Totals {  // cumulative, read and write summed
    uint64_t requests = 0, small_requests = 0, request_bytes = 0, missed = 0, back_merges = 0, merges = 0;
    uint64_t runs = 0, run_bytes = 0;
    uint64_t bios = 0, bio_bytes = 0;  // read and write bios with data (block_bio_queue)
    std::map<std::string, PairTotals> origins;  // requests created here, by remap origin
  };
  struct Sample {
    TimePoint time;
    std::map<std::string, Totals> devices;
  };
  using PairKey = std::pair<std::string, std::string>;  // (disk, origin; "" = not remapped)
  struct DiskState {
    bool raised = false;
    bool condition = false;
    TimePoint condition_since{};
    TimePoint healthy_since{};
    bool has_condition_since = false;
    bool has_healthy_since = false;
    std::string upper;
    CollapseEvidence evidence;
    Diagnosis diagnosis;  // filled while condition or raised
    // The split ticket: its own hysteresis over the same evidence.
    bool split_raised = false;
    bool split_condition = false;
    bool has_split_since = false;
    bool has_split_healthy_since = false;
    TimePoint split_since{};
    TimePoint split_healthy_since{};
    Diagnosis split_diagnosis;  // filled while split_condition or split_raised
    uint64_t split_chunk_bytes = 0;
  };

  static Sample SampleOf(TimePoint now, const Snapshot& snapshot, const Topology& topology);
  // A counter that went down (a multipath path disk removed from its head's sums, a device re-created, the
  // BPF maps reloaded) restarts that device's window at `sample`.
  void RestartWindowsOnReset(const Sample& sample);
  std::map<std::string, Totals> WindowDeltas() const;
  // One disk's pairs (per upper device) and its rest, evaluated and stepped.
  void UpdateDisk(const std::string& name, const Totals& delta, const std::map<std::string, Totals>& deltas,
                  TimePoint now, double seconds, const Topology& topology, std::map<PairKey, DiskState>* next,
                  std::vector<CollapseEvent>* events);
  bool IsCandidate(const BlockDevice& device) const;
  bool EligibleUpper(const BlockDevice& device) const;
  CollapseEvidence Evaluate(const std::string& disk, const Totals& delta, double seconds,
                            const std::map<std::string, Totals>& deltas, const Topology& topology) const;
  CollapseEvidence EvaluatePair(const std::string& origin, const PairTotals& pair, const Totals& disk,
                                double seconds, const std::map<std::string, Totals>& deltas) const;
  void Step(const PairKey& key, TimePoint now, CollapseEvidence evidence, double seconds, const Topology& topology,
            std::map<PairKey, DiskState>* next, std::vector<CollapseEvent>* events);
  bool Condition(const CollapseEvidence& e) const;
  // The split ticket's step for one pair, after the collapse's (which vetoes it).
  void StepSplit(const PairKey& key, TimePoint now, const Topology& topology, DiskState* state,
                 std::vector<CollapseEvent>* events) const;
  Diagnosis DiagnoseSplit(const std::string& disk, const CollapseEvidence& e, const Topology& topology) const;
  Diagnosis Diagnose(const std::string& disk, const CollapseEvidence& e, const Topology& topology) const;
  std::string Describe(bool onset, const std::string& disk, const CollapseEvidence& e,
                       const Topology& topology) const;

  CollapsePolicy policy_;
  std::regex lower_regex_;
  std::deque<Sample> samples_;
  bool reduced_ = false;  // the last snapshot's evidence was reduced
  std::map<PairKey, DiskState> pairs_;
  std::vector<std::string> split_vetoes_;
};

}  // namespace mergewatch
