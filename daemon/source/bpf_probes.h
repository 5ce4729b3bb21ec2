// SPDX-License-Identifier: Apache-2.0
// The loaded BPF programs and maps, as plain descriptors from the loader child (bpf_loader.h):
// reads the maps, attaches block_bio_queue on demand. Destroying the object detaches every link.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "source/bpf_loader.h"
#include "source/snapshot.h"

namespace mergewatch {

// What one loaded program has cost so far (struct bpf_prog_info). The kernel counts only
// while kernel.bpf_stats_enabled=1 (it adds two clock reads per run, so it is off by default).
struct ProgramCost {
  std::string tracepoint;
  std::string mode;
  uint64_t run_time_ns = 0;
  uint64_t run_count = 0;
};

class BpfProbes final : public SnapshotSource {
 public:
  static std::unique_ptr<BpfProbes> Load(const ProbeOptions& options, ProbeFailure* failure);
  // The probes of a loader's reply (LoaderProcess::Finish), or null with its failure.
  // `sysfs_root`: where each read finds the disks' in-flight counts (Snapshot::in_flight).
  static std::unique_ptr<BpfProbes> FromReply(LoadReply reply, ProbeFailure* failure,
                                              const std::string& sysfs_root = "/sys");
  ~BpfProbes() override;
  BpfProbes(const BpfProbes&) = delete;
  BpfProbes& operator=(const BpfProbes&) = delete;

  Snapshot Read() override;
  ServiceCounters ReadServices() override;
  void Forget(const StaleKeys& keys) override;
  // block_bio_queue fires for every bio of every device but matters only for bio-based
  // devices stacked on others: attached only while one exists. Returns true on a change.
  bool SetBioQueueTracing(bool wanted);
  std::string mode() const { return loaded_.mode; }
  // Every loaded program, attached or not; thread-safe.
  std::vector<ProgramCost> ProgramCosts() const;
  size_t attached_count() const;

 private:
  BpfProbes(LoadReply reply, std::string sysfs_root);
  LoadReply loaded_;          // owns every descriptor; only bio_queue's link_fd changes (under mutex_)
  std::string sysfs_root_;    // where Read finds the disks' in-flight counts
  mutable std::mutex mutex_;  // programs_ and the bio_queue link: the main loop changes them, scrapes read
  std::mutex maps_mutex_;     // a map walk (Read) and key deletion (Forget) never overlap
  std::vector<ProgramStatus> programs_;
  LoadedProgram* bio_queue_ = nullptr;  // in loaded_.programs, if loaded
  // dev_stats_spill and origin_spill (mergewatch.bpf.c): the keys a program could not create in
  // dev_stats or origin_stats, counted apart. Among loaded_.other_map_fds, found by name; -1 if not.
  int dev_spill_fd_ = -1;
  int origin_spill_fd_ = -1;
  int service_counts_fd_ = -1;  // service_counts: requests per (pair, op, cgroup)
};

}  // namespace mergewatch
