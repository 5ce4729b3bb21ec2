// SPDX-License-Identifier: Apache-2.0
// The daemon's evidence: the BPF programs while they run, diskstats otherwise, and the way back to
// BPF after a load failed for a cause that can pass. A retry's loader runs beside the main loop,
// which polls loader_fd() and calls OnLoaderReady(); nothing here blocks but LoadAtStart.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "clock.h"
#include "source/bpf_loader.h"
#include "source/bpf_probes.h"
#include "source/bpf_retry.h"
#include "source/source.h"
#include "topology/topology.h"

namespace mergewatch {

class EvidenceSources {
 public:
  // `options`: every load's; the first `hanging_loads` loaders sleep instead (a test hook).
  // `retry_interval`: the wait before a retry (--topology.refresh-interval).
  EvidenceSources(ProbeOptions options, uint32_t hanging_loads, Duration retry_interval);
  ~EvidenceSources();

  // The load at start: waits for the loader (kLoaderTimeout at most). False with the failure; then a
  // retry is planned if the cause can pass.
  bool LoadAtStart(TimePoint now, ProbeFailure* failure);
  // What to say in the log of the retry plan: "BPF is tried again in 60 s", or why not.
  std::string RetryPlan() const;
  // The source detection reads, made once LoadAtStart has run; the object must outlive its use.
  void Attach(ActiveSource* active) { active_ = active; }

  std::shared_ptr<BpfProbes> bpf() const { return bpf_; }
  // The probes as the scrapes see them (program costs): swapped atomically when a retry succeeds.
  std::vector<ProgramCost> ProgramCosts() const;

  // The main loop's side of a retry: StartRetryIfDue at each tick; while a load is in flight, poll
  // loader_fd() (-1 otherwise) and call OnLoaderReady when it is readable or loader_deadline() passed.
  void StartRetryIfDue(TimePoint now);
  bool loading() const { return loading_ != nullptr; }
  int loader_fd() const { return loading_ ? loading_->fd() : -1; }
  TimePoint loader_deadline() const { return loading_ ? loading_->deadline() : TimePoint::max(); }
  void OnLoaderReady(bool readable, TimePoint now, const Topology& topology);

  // After each scan: block_bio_queue attached only while a bio-based device is stacked on a disk,
  // and on diskstats the disks it cannot see (iostats=0) named once.
  void FollowTopology(const Topology& topology);

  // Stops a retry's loader and releases the probes (every link detached once the source lets go).
  void Stop();

 private:
  ProbeOptions NextLoadOptions();
  void Publish(std::shared_ptr<BpfProbes> probes);
  void ReportDisksWithoutStatistics(const Topology& topology);

  ProbeOptions options_;
  uint32_t hanging_loads_;
  uint32_t loads_started_ = 0;
  BpfRetrySchedule retry_;
  ActiveSource* active_ = nullptr;
  std::shared_ptr<BpfProbes> bpf_;        // null while detection runs on diskstats
  std::shared_ptr<BpfProbes> published_;  // bpf_, read by the scrapes' threads (atomic_load)
  std::unique_ptr<LoaderProcess> loading_;
  std::set<std::string> without_statistics_;  // disks reported as unseen by diskstats (iostats=0)
};

// Attaches block_bio_queue while a bio-based device is stacked on a disk, detaches it otherwise
// (it fires for every bio of every device); logs each change.
void TraceBioLevelWhereNeeded(const Topology& topology, BpfProbes* probes);

}  // namespace mergewatch
