// SPDX-License-Identifier: Apache-2.0
#include "source/bpf_probes.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

#include "log.h"

namespace mergewatch {

std::unique_ptr<BpfProbes> BpfProbes::Load(const ProbeOptions& options, ProbeFailure* failure) {
  return FromReply(LoadInChild(options), failure, options.sysfs_root);
}

std::unique_ptr<BpfProbes> BpfProbes::FromReply(LoadReply reply, ProbeFailure* failure,
                                                const std::string& sysfs_root) {
  if (reply.kind != ProbeError::kNone) {
    *failure = ProbeFailure{reply.kind, reply.error_number, reply.error};
    return nullptr;
  }
  return std::unique_ptr<BpfProbes>(new BpfProbes(std::move(reply), sysfs_root));
}

namespace {

// The descriptor among `fds` of the map the kernel names `name` (15 characters at most), or -1.
int MapNamed(const std::vector<int>& fds, const char* name) {
  for (int fd : fds) {
    bpf_map_info info{};
    uint32_t length = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd, &info, &length) == 0 && strcmp(info.name, name) == 0) return fd;
  }
  return -1;
}

// A buffer element the kernel fills: left uninitialised, as zeroing 64 keys' per-CPU values
// (824 bytes each: 105 KB on 2 CPUs, 3.4 MB on 64) for each map and scrape costs as much as
// the copy itself.
template <typename T>
struct KernelFilled {
  T value;
  KernelFilled() {}  // NOLINT: no member initialiser, on purpose
};

// Adds a key's per-CPU values (`ncpus` of them from `per_cpu`) into `*out` under to_key(key).
template <typename RawKey, typename Value, typename SnapshotKey, typename ToKey, typename Accumulate>
void AddPerCpu(const RawKey& key, const KernelFilled<Value>* per_cpu, int ncpus, ToKey to_key, Accumulate accumulate,
               std::map<SnapshotKey, Value>* out) {
  Value& total = (*out)[to_key(key)];
  for (int cpu = 0; cpu < ncpus; ++cpu) accumulate(per_cpu[cpu].value, &total);
}

// Every key of the per-CPU map `fd` with its values, in batches of bpf_map_lookup_batch (v5.6,
// commit 057996380a42 "bpf: Add batch ops to all htab bpf map"): one system call per 64 keys
// where the walk takes two per key (a sixth of a scrape's CPU with 32 busy devices). False,
// with nothing kept, on any error (no batch lookup in the kernel or for the map: EINVAL,
// ENOTSUPP): the caller walks instead.
template <typename RawKey, typename Value>
bool ReadBatched(int fd, int ncpus, std::vector<KernelFilled<RawKey>>* keys,
                 std::vector<KernelFilled<Value>>* values) {
  static_assert(sizeof(Value) % 8 == 0, "per-CPU values are copied 8-byte aligned");
  static_assert(sizeof(KernelFilled<Value>) == sizeof(Value) && sizeof(KernelFilled<RawKey>) == sizeof(RawKey),
                "the kernel writes arrays of the plain types");
  uint32_t chunk = 64;
  uint64_t token_in = 0, token_out = 0;  // the kernel's batch position: a bucket index for a hash
  bool first = true;
  LIBBPF_OPTS(bpf_map_batch_opts, opts);
  for (;;) {
    const size_t have = keys->size();
    keys->resize(have + chunk);
    values->resize((have + chunk) * static_cast<size_t>(ncpus));
    uint32_t count = chunk;
    const int ret = bpf_map_lookup_batch(fd, first ? nullptr : &token_in, &token_out, keys->data() + have,
                                         values->data() + have * static_cast<size_t>(ncpus), &count, &opts);
    const int error = ret < 0 ? errno : 0;
    keys->resize(have + (error == 0 || error == ENOENT ? count : 0));
    values->resize(keys->size() * static_cast<size_t>(ncpus));
    if (error == ENOENT) return true;  // the last batch (count may be 0)
    if (error == ENOSPC && count == 0) {  // one bucket holds more keys than a chunk
      chunk *= 2;
      continue;
    }
    if (error != 0) {
      keys->clear();
      values->clear();
      return false;
    }
    first = false;
    token_in = token_out;
  }
}

// Every key of the per-CPU stats map `fd`, its values summed over `ncpus` CPUs into `*out`
// under the key `to_key` makes of it (added to what is there: a key can be in a map and its
// spill map). See Read on the walk.
template <typename RawKey, typename Value, typename SnapshotKey, typename ToKey, typename Accumulate>
void SumPerCpuMap(int fd, int ncpus, ToKey to_key, Accumulate accumulate, std::map<SnapshotKey, Value>* out) {
  if (fd < 0) return;
  std::vector<KernelFilled<RawKey>> keys;
  std::vector<KernelFilled<Value>> values;
  if (ReadBatched<RawKey, Value>(fd, ncpus, &keys, &values)) {
    for (size_t i = 0; i < keys.size(); ++i)
      AddPerCpu(keys[i].value, &values[i * static_cast<size_t>(ncpus)], ncpus, to_key, accumulate, out);
    return;
  }
  std::vector<KernelFilled<Value>> per_cpu(static_cast<size_t>(ncpus));
  VisitEachKeyOnce<RawKey>(
      [&](const RawKey* prev, RawKey* next) { return bpf_map_get_next_key(fd, prev, next) == 0; },
      [&](const RawKey& key) {
        // A key deleted between get_next_key and lookup is skipped, not an error.
        if (bpf_map_lookup_elem(fd, &key, per_cpu.data()) != 0) return;
        AddPerCpu(key, per_cpu.data(), ncpus, to_key, accumulate, out);
      });
}

DevOpKey ToDevOpKey(const mw_dev_key& k) { return DevOpKey{k.major, k.minor, k.op, k.diskseq}; }
OriginKey ToOriginKey(const mw_origin_key& k) {
  return OriginKey{k.major, k.minor, k.origin_major, k.origin_minor, k.op, k.diskseq};
}

ServiceCounterKey ToServiceCounterKey(const mw_service_key& k) {
  ServiceCounterKey key;
  key.pair = DevicePair{k.major, k.minor, k.origin_major, k.origin_minor, k.diskseq};
  // An unknown source (a newer BPF object) is the task's: its id is still a cgroup's.
  key.cgroup.id = k.cgroup;
  key.cgroup.source = k.source == MW_CG_BLKCG       ? CgroupSource::kBlkcg
                      : k.source == MW_CG_WRITEBACK ? CgroupSource::kWriteback
                                                    : CgroupSource::kTask;
  return key;
}

}  // namespace

BpfProbes::BpfProbes(LoadReply reply, std::string sysfs_root)
    : loaded_(std::move(reply)), sysfs_root_(std::move(sysfs_root)) {
  for (LoadedProgram& p : loaded_.programs) {
    if (p.tracepoint == "block_bio_queue") bio_queue_ = &p;
    programs_.push_back(ProgramStatus{p.tracepoint, p.mode, p.link_fd >= 0});
  }
  dev_spill_fd_ = MapNamed(loaded_.other_map_fds, "dev_stats_spill");
  origin_spill_fd_ = MapNamed(loaded_.other_map_fds, "origin_spill");
  service_counts_fd_ = MapNamed(loaded_.other_map_fds, "service_counts");
  if (dev_spill_fd_ < 0 || origin_spill_fd_ < 0)
    LogWarn("the BPF object's spill maps were not found: a key a program cannot create is not counted");
  if (service_counts_fd_ < 0)
    LogWarn("the BPF object's service_counts map was not found: the services behind a collapse are not named");
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
// dev_stats, origin_stats and their spill maps (Forget; the BPF programs never do), and Forget
// never runs during a walk (maps_mutex_). Batch lookups (ReadBatched) walk the buckets, so they
// race a deleter too, and rely on that guard alone; the key-by-key walk, kept for kernels without
// them, also visits each key once (VisitEachKeyOnce), which keeps its sums exact should anything
// else delete. A key a program creates during either walk is counted from the next scrape on.
Snapshot BpfProbes::Read() {
  Snapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    snapshot.programs = programs_;
  }
  std::lock_guard<std::mutex> maps_lock(maps_mutex_);
  const int ncpus = libbpf_num_possible_cpus();
  if (ncpus <= 0) throw std::runtime_error("cannot count possible CPUs");

  // A key's events are in dev_stats, or in the spill map while dev_stats refused the key, or
  // in both (a later event created it): the sum is its count.
  for (int fd : {loaded_.dev_stats_fd, dev_spill_fd_})
    SumPerCpuMap<mw_dev_key, mw_dev_stats>(fd, ncpus, ToDevOpKey, AccumulateStats, &snapshot.stats);
  for (int fd : {loaded_.origin_stats_fd, origin_spill_fd_})
    SumPerCpuMap<mw_origin_key, mw_origin_stats>(fd, ncpus, ToOriginKey, AccumulateOrigin, &snapshot.origins);

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
  // After the maps: a request counted and not yet timed when they were read is in flight now, or
  // has completed since (then the untimed figure is low for this read, never high for long).
  for (const DiskKey& disk : InFlightGaps(snapshot)) {
    std::array<uint64_t, 2> in_flight{};
    if (ReadInFlight(sysfs_root_, disk.major, disk.minor, &in_flight)) snapshot.in_flight[disk] = in_flight;
  }
  return snapshot;
}

ServiceCounters BpfProbes::ReadServices() {
  // The LRU map is never pruned by the daemon: an entry the kernel evicts comes back from 0, which
  // ServiceWindow counts as a reset. Ops are summed: a service's share is of all the pair's requests.
  const int ncpus = libbpf_num_possible_cpus();
  std::map<ServiceCounterKey, uint64_t> counters;
  if (ncpus <= 0) return counters;
  std::lock_guard<std::mutex> maps_lock(maps_mutex_);
  SumPerCpuMap<mw_service_key, uint64_t>(service_counts_fd_, ncpus, ToServiceCounterKey,
                                         [](uint64_t from, uint64_t* into) { *into += from; }, &counters);
  return counters;
}

void BpfProbes::Forget(const StaleKeys& keys) {
  std::lock_guard<std::mutex> maps_lock(maps_mutex_);  // never under a Read's walk (see Read)
  // From both maps of each kind (see Read); ENOENT (not in that one, or already gone) is fine.
  for (const DevOpKey& k : keys.stats) {
    mw_dev_key key{k.major, k.minor, k.op, 0, k.diskseq};
    for (int fd : {loaded_.dev_stats_fd, dev_spill_fd_})
      if (fd >= 0) bpf_map_delete_elem(fd, &key);
  }
  for (const OriginKey& k : keys.origins) {
    mw_origin_key key{k.major, k.minor, k.origin_major, k.origin_minor, k.op, 0, k.diskseq};
    for (int fd : {loaded_.origin_stats_fd, origin_spill_fd_})
      if (fd >= 0) bpf_map_delete_elem(fd, &key);
  }
}

}  // namespace mergewatch
