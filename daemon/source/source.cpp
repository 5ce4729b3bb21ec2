// SPDX-License-Identifier: Apache-2.0
#include "source/source.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

namespace mergewatch {

const char* const kDiskstatsMissing = "request_sizes,missed_merges,merge_runs,latency,remap_origins";

bool ParseSourceChoice(const std::string& text, SourceChoice* out) {
  if (text == "auto") *out = SourceChoice::kAuto;
  else if (text == "bpf") *out = SourceChoice::kBpf;
  else if (text == "diskstats") *out = SourceChoice::kDiskstats;
  else return false;
  return true;
}

SourceStatus DiskstatsStatus(const std::string& reason) {
  SourceStatus status;
  status.source = "diskstats";
  status.evidence = "reduced";
  status.missing = kDiskstatsMissing;
  status.reason = reason;
  return status;
}

prometheus::MetricFamily DetectionInfoFamily(const SourceStatus& status) {
  prometheus::MetricFamily family;
  family.name = "mergewatch_detection_info";
  family.help =
      "Where the detector's evidence comes from: source bpf (evidence full) or diskstats (evidence reduced: "
      "no per-request sizes, missed merges, latencies or remap origins, listed in missing; evidence blind: "
      "block_getrq or block_bio_remap not attached, merge collapse cannot be detected); reason says why. "
      "Always 1.";
  family.type = prometheus::MetricType::Gauge;
  // The reason's first line, bounded: a label, not a log (the log has all of it).
  std::string reason = status.reason.substr(0, status.reason.find('\n'));
  if (reason.size() > 200) reason = reason.substr(0, 197) + "...";
  prometheus::ClientMetric metric;
  metric.label = {{"source", status.source}, {"evidence", status.evidence}, {"missing", status.missing},
                  {"reason", reason}};
  metric.gauge.value = 1;
  family.metric.push_back(std::move(metric));
  return family;
}

ActiveSource::ActiveSource(std::shared_ptr<SnapshotSource> source, SourceStatus status)
    : source_(std::move(source)), status_(std::move(status)) {}

std::shared_ptr<SnapshotSource> ActiveSource::Current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return source_;
}

Snapshot ActiveSource::Read() {
  Snapshot snapshot;
  {
    std::lock_guard<std::mutex> io(io_mutex_);
    snapshot = Current()->Read();
    departed_.AddTo(&snapshot);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  programs_ = snapshot.programs;
  return snapshot;
}

ServiceCounters ActiveSource::ReadServices() { return Current()->ReadServices(); }

SourceStatus ActiveSource::DetectionStatus() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return WithProgramEvidence(status_, programs_);
}

SourceStatus WithProgramEvidence(SourceStatus status, const std::vector<ProgramStatus>& programs) {
  // No list yet (before the first Read): nothing known to be missing. A BPF source always lists
  // block_rq_issue and block_rq_complete, which it cannot run without.
  if (status.source != "bpf" || programs.empty()) return status;
  struct Needed {
    const char* tracepoint;
    const char* gives;
  };
  static const Needed kNeeded[] = {{"block_getrq", "missed_merges,merge_runs"}, {"block_bio_remap", "remap_origins"}};
  std::string missing, reason;
  for (const Needed& n : kNeeded) {
    bool attached = false;
    for (const ProgramStatus& p : programs) attached = attached || (p.tracepoint == n.tracepoint && p.attached);
    if (attached) continue;
    missing += (missing.empty() ? "" : ",") + std::string(n.gives);
    reason += (reason.empty() ? "" : ", ") + std::string(n.tracepoint);
  }
  if (missing.empty()) return status;
  status.evidence = "blind";
  status.missing = missing;
  status.reason = reason + " not attached: merge collapse cannot be detected";
  return status;
}

void ActiveSource::Forget(const StaleKeys& keys) {
  std::lock_guard<std::mutex> io(io_mutex_);
  Current()->Forget(keys);
}

void ActiveSource::LearnPaths(const Snapshot& snapshot, const Topology& topology) {
  std::lock_guard<std::mutex> io(io_mutex_);
  departed_.Learn(snapshot, topology);
}

size_t ActiveSource::ForgetKeepingHeads(const StaleKeys& keys, const Topology& topology) {
  std::lock_guard<std::mutex> io(io_mutex_);
  const std::shared_ptr<SnapshotSource> source = Current();
  // The values as the keys are deleted: a path disk that is gone counts nothing more meanwhile.
  const size_t moved = departed_.Retire(keys, source->Read(), topology);
  source->Forget(keys);
  return moved;
}

void ActiveSource::Switch(std::shared_ptr<SnapshotSource> source, SourceStatus status) {
  std::shared_ptr<SnapshotSource> old;
  {
    std::lock_guard<std::mutex> io(io_mutex_);
    departed_.Clear();  // the new source's counters start afresh
    std::lock_guard<std::mutex> lock(mutex_);
    old = std::move(source_);
    source_ = std::move(source);
    status_ = std::move(status);
  }
  // `old` is destroyed here, or by the last scrape still reading it.
}

void ActiveSource::SetStatus(SourceStatus status) {
  std::lock_guard<std::mutex> lock(mutex_);
  status_ = std::move(status);
}

SourceStatus ActiveSource::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return status_;
}

}  // namespace mergewatch
