// SPDX-License-Identifier: Apache-2.0
#include "source/evidence_sources.h"

#include <atomic>

#include "log.h"
#include "source/diskstats.h"

namespace mergewatch {

void TraceBioLevelWhereNeeded(const Topology& topology, BpfProbes* probes) {
  const std::vector<std::string> stacked = topology.StackedBioBasedDevices();
  if (!probes->SetBioQueueTracing(!stacked.empty())) return;
  if (stacked.empty()) {
    LogInfo("no dm/md device stacked on a disk: block_bio_queue detached");
  } else {
    std::string names;
    for (const std::string& n : stacked) names += (names.empty() ? "" : ",") + n;
    LogInfo("bio-based devices stacked on disks (" + names + "): block_bio_queue attached");
  }
}

EvidenceSources::EvidenceSources(ProbeOptions options, uint32_t hanging_loads, Duration retry_interval)
    : options_(std::move(options)), hanging_loads_(hanging_loads), retry_(retry_interval) {}

EvidenceSources::~EvidenceSources() { Stop(); }

ProbeOptions EvidenceSources::NextLoadOptions() {
  ProbeOptions options = options_;
  options.loader_hangs = loads_started_++ < hanging_loads_;
  return options;
}

void EvidenceSources::Publish(std::shared_ptr<BpfProbes> probes) {
  bpf_ = probes;
  std::atomic_store(&published_, std::move(probes));
}

bool EvidenceSources::LoadAtStart(TimePoint now, ProbeFailure* failure) {
  std::shared_ptr<BpfProbes> probes = BpfProbes::Load(NextLoadOptions(), failure);
  if (!probes) {
    retry_.Failed(now, *failure);
    return false;
  }
  Publish(std::move(probes));
  return true;
}

std::string EvidenceSources::RetryPlan() const {
  if (!retry_.planned()) return "BPF is not tried again (the cause needs an operator; --source=bpf exits instead)";
  return "BPF is tried again in " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(retry_.delay()).count()) + " s";
}

std::vector<ProgramCost> EvidenceSources::ProgramCosts() const {
  const std::shared_ptr<BpfProbes> probes = std::atomic_load(&published_);
  return probes ? probes->ProgramCosts() : std::vector<ProgramCost>{};
}

void EvidenceSources::StartRetryIfDue(TimePoint now) {
  if (loading_ || bpf_ || !retry_.Due(now)) return;
  LogInfo("trying to load the BPF programs again");
  loading_ = LoaderProcess::Start(NextLoadOptions(), now);
}

void EvidenceSources::OnLoaderReady(bool readable, TimePoint now, const Topology& topology) {
  if (!loading_) return;
  const bool give_up = !readable && now >= loading_->deadline();
  if (!readable && !give_up && loading_->fd() >= 0) return;
  std::unique_ptr<LoaderProcess> loading = std::move(loading_);
  ProbeFailure failure;
  std::shared_ptr<BpfProbes> probes = BpfProbes::FromReply(loading->Finish(give_up), &failure, options_.sysfs_root);
  loading.reset();
  if (!probes) {
    retry_.Failed(now, failure);
    LogWarn("BPF still cannot run (" + failure.message + "): detection stays on diskstats; " + RetryPlan());
    if (active_ != nullptr) active_->SetStatus(DiskstatsStatus(failure.message));
    return;
  }
  TraceBioLevelWhereNeeded(topology, probes.get());
  retry_.Succeeded();
  Publish(probes);
  if (active_ != nullptr) active_->Switch(probes, SourceStatus{});
  LogInfo("attached " + std::to_string(probes->attached_count()) + " BPF programs using " + probes->mode() +
          ": detection runs on BPF again (full evidence)");
}

void EvidenceSources::FollowTopology(const Topology& topology) {
  if (bpf_) TraceBioLevelWhereNeeded(topology, bpf_.get());
  ReportDisksWithoutStatistics(topology);
}

// On diskstats, a disk with queue/iostats=0 is invisible (its counters stay still): never a silent
// blind spot. Said once when it appears, once when it is seen again; on BPF it does not matter.
void EvidenceSources::ReportDisksWithoutStatistics(const Topology& topology) {
  std::set<std::string> now;
  if (!bpf_)
    for (const std::string& name : DisksWithoutStatistics(topology)) now.insert(name);
  for (const std::string& name : now) {
    if (without_statistics_.count(name)) continue;
    LogWarn("iostats=0 on " + name + ": the kernel keeps no I/O statistics for it, so the diskstats source sees "
            "none of its requests and cannot detect merge collapse on it. Remedy: echo 1 > /sys/block/" + name +
            "/queue/iostats, or let BPF run");
  }
  for (const std::string& name : without_statistics_)
    if (!now.count(name) && !bpf_)
      LogInfo("iostats on " + name + " is back, or the disk is gone: the diskstats source sees it again");
  without_statistics_ = std::move(now);
}

void EvidenceSources::Stop() {
  loading_.reset();  // a retry's loader still running is killed and reaped
  bpf_.reset();
  std::atomic_store(&published_, std::shared_ptr<BpfProbes>());
}

}  // namespace mergewatch
