// SPDX-License-Identifier: Apache-2.0
#include "source/bpf_probes.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "log.h"

namespace mergewatch {

std::unique_ptr<BpfProbes> BpfProbes::Load(const ProbeOptions& options, ProbeError* error_kind,
                                           std::string* error) {
  return FromReply(LoadInChild(options), error_kind, error);
}

std::unique_ptr<BpfProbes> BpfProbes::FromReply(LoadReply reply, ProbeError* error_kind, std::string* error) {
  if (reply.kind != ProbeError::kNone) {
    *error_kind = reply.kind;
    *error = reply.error;
    return nullptr;
  }
  return std::unique_ptr<BpfProbes>(new BpfProbes(std::move(reply)));
}

BpfProbes::BpfProbes(LoadReply reply) : loaded_(std::move(reply)) {
  for (LoadedProgram& p : loaded_.programs) {
    if (p.tracepoint == "block_bio_queue") bio_queue_ = &p;
    programs_.push_back(ProgramStatus{p.tracepoint, p.mode, p.link_fd >= 0});
  }
}

// Without libbpf's object: a tp_btf program names its attach target itself (set at load), a
// raw_tp one is attached by the tracepoint's name. Closing the link's descriptor detaches.
bool BpfProbes::SetBioQueueTracing(bool wanted) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bio_queue_ == nullptr || wanted == (bio_queue_->link_fd >= 0)) return false;
  if (wanted) {
    const int fd = bpf_raw_tracepoint_open(bio_queue_->mode == "raw_tp" ? "block_bio_queue" : nullptr,
                                           bio_queue_->prog_fd);
    if (fd < 0) {
      LogWarn(std::string("cannot attach to block_bio_queue (") + bio_queue_->mode + "): " + strerror(-fd));
      return false;
    }
    bio_queue_->link_fd = fd;
  } else {
    close(bio_queue_->link_fd);
    bio_queue_->link_fd = -1;
  }
  for (ProgramStatus& p : programs_)
    if (p.tracepoint == "block_bio_queue") p.attached = wanted;
  return true;
}

BpfProbes::~BpfProbes() { CloseReplyFds(&loaded_); }

std::vector<ProgramCost> BpfProbes::ProgramCosts() const {
  std::vector<ProgramCost> costs;
  for (const LoadedProgram& p : loaded_.programs) {  // prog_fd never changes after construction
    bpf_prog_info info{};
    uint32_t length = sizeof(info);
    if (bpf_obj_get_info_by_fd(p.prog_fd, &info, &length) != 0) continue;
    costs.push_back(ProgramCost{p.tracepoint, p.mode, info.run_time_ns, info.run_cnt});
  }
  return costs;
}

size_t BpfProbes::attached_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const LoadedProgram& p : loaded_.programs) n += p.link_fd >= 0 ? 1 : 0;
  return n;
}

// Exact while devices go away: bpf_map_get_next_key() on a key deleted under the walk
// restarts at the first key, and every key before it would be summed twice (a doubled
// counter, then a "reset" on the next scrape). Two guards: only the daemon deletes keys of
// dev_stats and origin_stats (Forget; the BPF programs never do), and Forget never runs
// during a walk (maps_mutex_); and each walk visits a key once (VisitEachKeyOnce), which
// alone keeps the sums exact should anything else delete. Batch lookups were the other
// choice: they race a deleter too (a bucket deleted mid-batch), and walking a few hundred
// keys is short.
Snapshot BpfProbes::Read() {
  Snapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    snapshot.programs = programs_;
  }
  std::lock_guard<std::mutex> maps_lock(maps_mutex_);
  const int ncpus = libbpf_num_possible_cpus();
  if (ncpus <= 0) throw std::runtime_error("cannot count possible CPUs");

  int stats_fd = loaded_.dev_stats_fd;
  std::vector<mw_dev_stats> per_cpu(static_cast<size_t>(ncpus));
  VisitEachKeyOnce<mw_dev_key>(
      [&](const mw_dev_key* prev, mw_dev_key* next) { return bpf_map_get_next_key(stats_fd, prev, next) == 0; },
      [&](const mw_dev_key& key) {
        // A key deleted between get_next_key and lookup is skipped, not an error.
        if (bpf_map_lookup_elem(stats_fd, &key, per_cpu.data()) != 0) return;
        mw_dev_stats& total = snapshot.stats[DevOpKey{key.major, key.minor, key.op, key.diskseq}];
        for (const mw_dev_stats& cpu : per_cpu) AccumulateStats(cpu, &total);
      });

  int origin_fd = loaded_.origin_stats_fd;
  std::vector<mw_origin_stats> origin_per_cpu(static_cast<size_t>(ncpus));
  VisitEachKeyOnce<mw_origin_key>(
      [&](const mw_origin_key* prev, mw_origin_key* next) {
        return bpf_map_get_next_key(origin_fd, prev, next) == 0;
      },
      [&](const mw_origin_key& okey) {
        if (bpf_map_lookup_elem(origin_fd, &okey, origin_per_cpu.data()) != 0) return;
        mw_origin_stats& total = snapshot.origins[OriginKey{okey.major, okey.minor, okey.origin_major,
                                                            okey.origin_minor, okey.op, okey.diskseq}];
        for (const mw_origin_stats& cpu : origin_per_cpu) AccumulateOrigin(cpu, &total);
      });

  int counts_fd = loaded_.event_counts_fd;
  std::vector<uint64_t> counts(static_cast<size_t>(ncpus));
  for (uint32_t i = 0; i < MW_CNT_MAX; ++i) {
    if (bpf_map_lookup_elem(counts_fd, &i, counts.data()) != 0) continue;
    for (uint64_t v : counts) snapshot.event_counts[i] += v;
  }
  for (const LoadedProgram& p : loaded_.programs) {
    bpf_prog_info info{};
    uint32_t length = sizeof(info);
    if (bpf_obj_get_info_by_fd(p.prog_fd, &info, &length) == 0)
      snapshot.nested_runs_skipped += info.recursion_misses;
  }
  return snapshot;
}

void BpfProbes::Forget(const StaleKeys& keys) {
  std::lock_guard<std::mutex> maps_lock(maps_mutex_);  // never under a Read's walk (see Read)
  int stats_fd = loaded_.dev_stats_fd;
  for (const DevOpKey& k : keys.stats) {
    mw_dev_key key{k.major, k.minor, k.op, 0, k.diskseq};
    bpf_map_delete_elem(stats_fd, &key);  // ENOENT: already gone, fine
  }
  int origin_fd = loaded_.origin_stats_fd;
  for (const OriginKey& k : keys.origins) {
    mw_origin_key key{k.major, k.minor, k.origin_major, k.origin_minor, k.op, 0, k.diskseq};
    bpf_map_delete_elem(origin_fd, &key);
  }
}

}  // namespace mergewatch
