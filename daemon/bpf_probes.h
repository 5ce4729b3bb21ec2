// Loads the CO-RE BPF object, picks tp_btf or the raw_tp fallback, attaches, and reads
// the maps. Destroying the object detaches every link.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "exporter.h"
#include "snapshot.h"

struct mergewatch_bpf;
struct bpf_link;
struct bpf_program;

namespace mergewatch {

struct ProbeOptions {
  std::string btf_path = "/sys/kernel/btf/vmlinux";
  uint32_t inflight_entries = MW_DEFAULT_INFLIGHT_ENTRIES;
  std::string program_type = "auto";  // auto, tp_btf or raw_tp (--bpf.program-type)
};

// Why loading failed, so main can pick the exit code and the advice.
enum class ProbeError { kNone, kNoBtf, kNoPrivilege, kLoad };

// Positions of the arguments the programs read, from the btf_trace_<tp> prototypes.
struct TracepointLayout {
  uint32_t rq_arg = 0;         // block_rq_insert/issue: 0 for (rq), 1 for (q, rq)
  uint32_t bio_merge_arg = 0;  // block_bio_backmerge: 0 for (bio), 2 for (q, rq, bio)
  uint32_t bio_queue_arg = 0;  // block_bio_queue: 0 for (bio), 1 for (q, bio)
  uint32_t getrq_arg = 0;      // block_getrq: 0 for (bio), 1 for (q, bio, rw)
  uint32_t bio_remap_arg = 0;  // block_bio_remap: 0 for (bio, dev, from), 1 for (q, bio, dev, from)
  std::vector<std::string> missing;  // tracepoints the kernel does not have
};

// What one loaded program has cost so far (struct bpf_prog_info). The kernel counts only
// while kernel.bpf_stats_enabled=1 (it adds two clock reads per run, so it is off by default).
struct ProgramCost {
  std::string tracepoint;
  std::string mode;
  uint64_t run_time_ns = 0;
  uint64_t run_count = 0;
};

// log2 of the in-flight table's size: --bpf.inflight-entries rounded up to a power of two.
uint32_t InflightSlotBits(uint32_t entries);

// Reads the layout from a BTF file; false with a message if the file is not usable BTF.
bool ReadTracepointLayout(const std::string& btf_path, TracepointLayout* layout, std::string* error);

class BpfProbes final : public SnapshotSource {
 public:
  static std::unique_ptr<BpfProbes> Load(const ProbeOptions& options, ProbeError* error_kind,
                                         std::string* error);
  ~BpfProbes() override;
  BpfProbes(const BpfProbes&) = delete;
  BpfProbes& operator=(const BpfProbes&) = delete;

  Snapshot Read() override;
  void Forget(const StaleKeys& keys) override;
  // block_bio_queue fires for every bio of every device but matters only for bio-based
  // devices stacked on others: attached only while one exists. Returns true on a change.
  bool SetBioQueueTracing(bool wanted);
  std::string mode() const { return mode_; }
  // Every loaded program, attached or not; thread-safe.
  std::vector<ProgramCost> ProgramCosts() const;
  size_t attached_count() const;

 private:
  BpfProbes() = default;
  mergewatch_bpf* skel_ = nullptr;
  std::vector<struct bpf_link*> links_;
  mutable std::mutex mutex_;  // programs_ and the bio_queue link: the main loop changes them, scrapes read
  std::mutex maps_mutex_;     // a map walk (Read) and key deletion (Forget) never overlap
  std::vector<ProgramStatus> programs_;
  struct bpf_program* bio_queue_program_ = nullptr;
  struct bpf_link* bio_queue_link_ = nullptr;
  std::string mode_;
};

}  // namespace mergewatch
