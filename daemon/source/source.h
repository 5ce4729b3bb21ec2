// SPDX-License-Identifier: Apache-2.0
// Where the evidence comes from: the BPF programs (full evidence) or the kernel's diskstats
// (reduced evidence, no BPF at all). Both are SnapshotSources producing the same Snapshot for
// the exporter and the detector; ActiveSource is the one the daemon reads now, and says which
// and why (mergewatch_detection_info): never a silent downgrade.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "source/bpf_loader.h"
#include "source/departed_paths.h"
#include "source/snapshot.h"

namespace mergewatch {

enum class SourceChoice { kAuto, kBpf, kDiskstats };  // --source
bool ParseSourceChoice(const std::string& text, SourceChoice* out);

// What the detector has to work with, as mergewatch_detection_info labels it.
struct SourceStatus {
  std::string source = "bpf";    // bpf or diskstats
  std::string evidence = "full"; // full, reduced or blind
  std::string missing;           // comma-separated kinds of evidence this source cannot see; "" for none
  std::string reason;            // why this source: "" for BPF as asked, else the BPF failure or the flag
};

// The kinds of evidence the diskstats source has no way to see.
extern const char* const kDiskstatsMissing;

// The status of running on diskstats for `reason` ("--source=diskstats", or the BPF failure).
SourceStatus DiskstatsStatus(const std::string& reason);

// mergewatch_detection_info{source, evidence, missing, reason} 1: pure.
prometheus::MetricFamily DetectionInfoFamily(const SourceStatus& status);

// The BPF source's status with what its programs show now (a blind detector is silent, so its
// blindness must show): only block_rq_issue/complete are required to load, but the detector decides on
// block_getrq (missed merges and their runs) and block_bio_remap (which upper device a request
// came from; the default policy pages only under one). Either not attached, or not loaded at all:
// evidence "blind", what it would have given in missing, the tracepoints in reason. block_bio_queue
// is attached on demand only (no stacked device: detached on purpose), so it is not judged here.
// Pure; the diskstats source's status passes unchanged.
SourceStatus WithProgramEvidence(SourceStatus status, const std::vector<ProgramStatus>& programs);


// The source the daemon reads now. Read/Forget go to the current one; Switch replaces it (the
// BPF retry succeeded) while scrapes run. Thread-safe. A multipath head's counters never go
// backwards while it lives: what a departed path disk counted stays under the head's key
// (DepartedPaths), added to every Read.
class ActiveSource final : public SnapshotSource {
 public:
  ActiveSource(std::shared_ptr<SnapshotSource> source, SourceStatus status);
  Snapshot Read() override;
  ServiceCounters ReadServices() override;
  void Forget(const StaleKeys& keys) override;
  // Which head each path disk in `snapshot` counts under, while `topology` shows the path.
  void LearnPaths(const Snapshot& snapshot, const Topology& topology);
  // Forget, keeping what the stale keys of a departed path disk counted under its head (if
  // `topology` still shows the head). Read and delete are one step against concurrent Reads, so
  // no scrape sees the head without its departed path's counts. Returns how many keys moved.
  size_t ForgetKeepingHeads(const StaleKeys& keys, const Topology& topology);
  void Switch(std::shared_ptr<SnapshotSource> source, SourceStatus status);
  void SetStatus(SourceStatus status);  // the same source, a new reason
  SourceStatus status() const;
  // status() judged against the programs of the last Read() (WithProgramEvidence).
  SourceStatus DetectionStatus() const;

 private:
  std::shared_ptr<SnapshotSource> Current() const;
  mutable std::mutex mutex_;
  // Held over a source's read plus the carry added to it, and over a forget plus the carry
  // taken from it (taken before mutex_).
  std::mutex io_mutex_;
  DepartedPaths departed_;
  std::shared_ptr<SnapshotSource> source_;
  SourceStatus status_;
  std::vector<ProgramStatus> programs_;  // of the last Read()
};

// The collector of mergewatch_detection_info for a scrape.
class DetectionInfoCollector final : public prometheus::Collectable {
 public:
  explicit DetectionInfoCollector(const ActiveSource& source) : source_(source) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return {DetectionInfoFamily(source_.DetectionStatus())};
  }

 private:
  const ActiveSource& source_;
};

}  // namespace mergewatch
