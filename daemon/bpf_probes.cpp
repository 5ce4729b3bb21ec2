#include "bpf_probes.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <deque>
#include <mutex>

#include "log.h"
#include "mergewatch.skel.h"

namespace mergewatch {
namespace {

constexpr const char* kDefaultBtfPath = "/sys/kernel/btf/vmlinux";
// Without these two the product has no size or latency data: fail instead of limping.
constexpr const char* kRequiredTracepoints[] = {"block_rq_issue", "block_rq_complete"};

// libbpf's messages: debug lines go to the log at debug level; the tail is kept to
// explain a failed load in the error message itself.
std::mutex g_libbpf_mutex;
std::deque<std::string> g_libbpf_tail;

int LibbpfPrint(enum libbpf_print_level level, const char* format, va_list args) {
  // Verifier logs come as one message of many KiB, with the reason at the end.
  va_list measure;
  va_copy(measure, args);
  const int length = vsnprintf(nullptr, 0, format, measure);
  va_end(measure);
  if (length <= 0) return 0;
  std::string text(static_cast<size_t>(length) + 1, '\0');
  vsnprintf(text.data(), text.size(), format, args);
  text.resize(static_cast<size_t>(length));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.empty()) return 0;
  {
    std::lock_guard<std::mutex> lock(g_libbpf_mutex);
    if (level != LIBBPF_DEBUG) {
      constexpr size_t kKeep = 2000;  // of a verifier log, the end says why
      g_libbpf_tail.push_back(text.size() > kKeep ? "..." + text.substr(text.size() - kKeep) : text);
      if (g_libbpf_tail.size() > 12) g_libbpf_tail.pop_front();
    }
  }
  LogDebug("libbpf: " + text);
  return 0;
}

std::string LibbpfTail() {
  std::lock_guard<std::mutex> lock(g_libbpf_mutex);
  std::string out;
  for (const std::string& l : g_libbpf_tail) out += "\n  libbpf: " + l;
  g_libbpf_tail.clear();
  return out;
}

// Effective CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON (v5.8+): what loading tracing BPF needs.
bool HasBpfPrivilege() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return geteuid() == 0;
  auto has = [&](int cap) { return (data[cap / 32].effective >> (cap % 32)) & 1u; };
  constexpr int kCapPerfmon = 38, kCapBpf = 39;
  return has(CAP_SYS_ADMIN) || (has(kCapBpf) && has(kCapPerfmon));
}

// Number of tracepoint arguments from the typedef btf_trace_<tp> = void (*)(void *, args...).
int TracepointArity(const struct btf* btf, const std::string& tracepoint) {
  int id = btf__find_by_name_kind(btf, ("btf_trace_" + tracepoint).c_str(), BTF_KIND_TYPEDEF);
  if (id < 0) return -1;
  const struct btf_type* type = btf__type_by_id(btf, id);
  while (type != nullptr && (btf_is_typedef(type) || btf_is_ptr(type))) type = btf__type_by_id(btf, type->type);
  if (type == nullptr || !btf_is_func_proto(type)) return -1;
  return btf_vlen(type) - 1;  // minus the leading void *__data
}

std::pair<std::string, std::string> SplitSection(const char* section) {
  std::string s = section != nullptr ? section : "";
  size_t slash = s.find('/');
  if (slash == std::string::npos) return {s, ""};
  return {s.substr(0, slash), s.substr(slash + 1)};
}

}  // namespace

uint32_t InflightSlotBits(uint32_t entries) {
  uint32_t bits = 1;
  while ((1u << bits) < entries && bits < 31) ++bits;
  return bits;
}

bool ReadTracepointLayout(const std::string& btf_path, TracepointLayout* layout, std::string* error) {
  struct btf* btf = btf__parse(btf_path.c_str(), nullptr);
  if (btf == nullptr) {
    *error = "cannot read kernel BTF from " + btf_path + ": " + strerror(errno);
    return false;
  }
  int rq = TracepointArity(btf, "block_rq_issue");
  int merge = TracepointArity(btf, "block_bio_backmerge");
  int queue = TracepointArity(btf, "block_bio_queue");
  int getrq = TracepointArity(btf, "block_getrq");
  int remap = TracepointArity(btf, "block_bio_remap");
  if (rq < 0) {
    btf__free(btf);
    *error = btf_path + " has no btf_trace_block_rq_issue: not the BTF of a kernel with block tracepoints";
    return false;
  }
  layout->rq_arg = rq >= 2 ? 1 : 0;
  layout->bio_merge_arg = merge >= 3 ? 2 : 0;
  layout->bio_queue_arg = queue >= 2 ? 1 : 0;
  layout->getrq_arg = getrq >= 2 ? 1 : 0;
  layout->bio_remap_arg = remap >= 4 ? 1 : 0;
  for (const char* tp : {"block_rq_insert", "block_rq_issue", "block_rq_requeue", "block_rq_complete",
                         "block_bio_backmerge",
                         "block_bio_frontmerge", "block_bio_queue", "block_getrq", "block_bio_remap"}) {
    if (TracepointArity(btf, tp) < 0) layout->missing.push_back(tp);
  }
  btf__free(btf);
  return true;
}

std::unique_ptr<BpfProbes> BpfProbes::Load(const ProbeOptions& options, ProbeError* error_kind,
                                           std::string* error) {
  libbpf_set_print(LibbpfPrint);
  TracepointLayout layout;
  if (access(options.btf_path.c_str(), R_OK) != 0 || !ReadTracepointLayout(options.btf_path, &layout, error)) {
    *error_kind = ProbeError::kNoBtf;
    if (error->empty()) error->assign("cannot read kernel BTF from " + options.btf_path + ": " + strerror(errno));
    error->append(". mergewatchd needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (/sys/kernel/btf/vmlinux), "
                  "or --path.btf pointing at the running kernel's BTF");
    return nullptr;
  }
  for (const std::string& tp : layout.missing) LogWarn("kernel has no tracepoint " + tp + "; not attached");
  if (!HasBpfPrivilege()) {
    *error_kind = ProbeError::kNoPrivilege;
    *error = "not privileged to load BPF: run as root, or grant CAP_BPF, CAP_PERFMON (kernel 5.8+) and "
             "CAP_SYS_RESOURCE; before 5.8 CAP_SYS_ADMIN is needed";
    return nullptr;
  }

  std::string failures;
  for (const char* mode : {"tp_btf", "raw_tp"}) {
    if (options.program_type != "auto" && options.program_type != mode) continue;
    std::unique_ptr<BpfProbes> probes(new BpfProbes());
    LIBBPF_OPTS(bpf_object_open_opts, open_opts);
    if (options.btf_path != kDefaultBtfPath) open_opts.btf_custom_path = options.btf_path.c_str();
    probes->skel_ = mergewatch_bpf__open_opts(&open_opts);
    if (probes->skel_ == nullptr) {
      *error_kind = ProbeError::kLoad;
      *error = std::string("cannot open the BPF object: ") + strerror(errno) + LibbpfTail();
      return nullptr;
    }
    probes->skel_->rodata->targ_rq_arg = layout.rq_arg;
    probes->skel_->rodata->targ_bio_merge_arg = layout.bio_merge_arg;
    probes->skel_->rodata->targ_bio_queue_arg = layout.bio_queue_arg;
    probes->skel_->rodata->targ_getrq_arg = layout.getrq_arg;
    probes->skel_->rodata->targ_bio_remap_arg = layout.bio_remap_arg;
    const uint32_t slot_bits = InflightSlotBits(options.inflight_entries);
    probes->skel_->rodata->inflight_slot_bits = slot_bits;
    bpf_map__set_max_entries(probes->skel_->maps.inflight, 1u << slot_bits);

    struct bpf_program* prog;
    bpf_object__for_each_program(prog, probes->skel_->obj) {
      auto [prog_mode, tracepoint] = SplitSection(bpf_program__section_name(prog));
      bool missing = false;
      for (const std::string& m : layout.missing) missing |= (m == tracepoint);
      bpf_program__set_autoload(prog, prog_mode == mode && !missing);
    }
    int err = mergewatch_bpf__load(probes->skel_);
    if (err != 0) {
      if (err == -EPERM) {
        *error_kind = ProbeError::kNoPrivilege;
        *error = std::string("the kernel refused BPF (") + strerror(-err) +
                 "): run as root or with CAP_BPF and CAP_PERFMON; check kernel.unprivileged_bpf_disabled and "
                 "lockdown" + LibbpfTail();
        return nullptr;
      }
      failures += std::string("\n") + mode + ": " + strerror(-err) + LibbpfTail();
      LogInfo(std::string("loading the ") + mode + " programs failed (" + strerror(-err) + "), trying the next mode");
      continue;
    }
    probes->mode_ = mode;
    bpf_object__for_each_program(prog, probes->skel_->obj) {
      if (!bpf_program__autoload(prog)) continue;
      auto [prog_mode, tracepoint] = SplitSection(bpf_program__section_name(prog));
      if (tracepoint == "block_bio_queue") {  // attached on demand: SetBioQueueTracing
        probes->bio_queue_program_ = prog;
        probes->programs_.push_back(ProgramStatus{tracepoint, prog_mode, false});
        continue;
      }
      struct bpf_link* link = bpf_program__attach(prog);
      ProgramStatus status{tracepoint, prog_mode, link != nullptr};
      if (link == nullptr) {
        std::string why = strerror(errno);
        for (const char* required : kRequiredTracepoints) {
          if (tracepoint == required) {
            *error_kind = ProbeError::kLoad;
            *error = "cannot attach to " + tracepoint + " (" + prog_mode + "): " + why + LibbpfTail();
            return nullptr;
          }
        }
        LogWarn("cannot attach to " + tracepoint + " (" + prog_mode + "): " + why);
      } else {
        probes->links_.push_back(link);
      }
      probes->programs_.push_back(status);
    }
    return probes;
  }
  *error_kind = ProbeError::kLoad;
  *error = (options.program_type == "auto" ? std::string("the BPF programs did not load in any mode:")
                                           : "the BPF programs did not load as " + options.program_type + ":") +
           failures;
  return nullptr;
}

bool BpfProbes::SetBioQueueTracing(bool wanted) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bio_queue_program_ == nullptr || wanted == (bio_queue_link_ != nullptr)) return false;
  if (wanted) {
    bio_queue_link_ = bpf_program__attach(bio_queue_program_);
    if (bio_queue_link_ == nullptr) {
      LogWarn(std::string("cannot attach to block_bio_queue: ") + strerror(errno) + LibbpfTail());
      return false;
    }
  } else {
    bpf_link__destroy(bio_queue_link_);
    bio_queue_link_ = nullptr;
  }
  for (ProgramStatus& p : programs_)
    if (p.tracepoint == "block_bio_queue") p.attached = wanted;
  return true;
}

BpfProbes::~BpfProbes() {
  if (bio_queue_link_ != nullptr) bpf_link__destroy(bio_queue_link_);
  for (struct bpf_link* link : links_) bpf_link__destroy(link);
  mergewatch_bpf__destroy(skel_);
}

std::vector<ProgramCost> BpfProbes::ProgramCosts() const {
  std::vector<ProgramCost> costs;
  struct bpf_program* prog = nullptr;
  bpf_object__for_each_program(prog, skel_->obj) {
    if (!bpf_program__autoload(prog)) continue;
    auto [mode, tracepoint] = SplitSection(bpf_program__section_name(prog));
    bpf_prog_info info{};
    uint32_t length = sizeof(info);
    if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &length) != 0) continue;
    costs.push_back(ProgramCost{tracepoint, mode, info.run_time_ns, info.run_cnt});
  }
  return costs;
}

size_t BpfProbes::attached_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return links_.size() + (bio_queue_link_ != nullptr ? 1 : 0);
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

  int stats_fd = bpf_map__fd(skel_->maps.dev_stats);
  std::vector<mw_dev_stats> per_cpu(static_cast<size_t>(ncpus));
  VisitEachKeyOnce<mw_dev_key>(
      [&](const mw_dev_key* prev, mw_dev_key* next) { return bpf_map_get_next_key(stats_fd, prev, next) == 0; },
      [&](const mw_dev_key& key) {
        // A key deleted between get_next_key and lookup is skipped, not an error.
        if (bpf_map_lookup_elem(stats_fd, &key, per_cpu.data()) != 0) return;
        mw_dev_stats& total = snapshot.stats[DevOpKey{key.major, key.minor, key.op, key.diskseq}];
        for (const mw_dev_stats& cpu : per_cpu) AccumulateStats(cpu, &total);
      });

  int origin_fd = bpf_map__fd(skel_->maps.origin_stats);
  std::vector<mw_origin_stats> origin_per_cpu(static_cast<size_t>(ncpus));
  VisitEachKeyOnce<mw_origin_key>(
      [&](const mw_origin_key* prev, mw_origin_key* next) {
        return bpf_map_get_next_key(origin_fd, prev, next) == 0;
      },
      [&](const mw_origin_key& okey) {
        if (bpf_map_lookup_elem(origin_fd, &okey, origin_per_cpu.data()) != 0) return;
        mw_origin_stats& total = snapshot.origins[OriginKey{okey.major, okey.minor, okey.origin_major,
                                                            okey.origin_minor, okey.op, okey.diskseq}];
        for (const mw_origin_stats& cpu : origin_per_cpu) {
          total.requests += cpu.requests;
          total.missed_merges += cpu.missed_merges;
        }
      });

  int counts_fd = bpf_map__fd(skel_->maps.event_counts);
  std::vector<uint64_t> counts(static_cast<size_t>(ncpus));
  for (uint32_t i = 0; i < MW_CNT_MAX; ++i) {
    if (bpf_map_lookup_elem(counts_fd, &i, counts.data()) != 0) continue;
    for (uint64_t v : counts) snapshot.event_counts[i] += v;
  }
  struct bpf_program* prog = nullptr;
  bpf_object__for_each_program(prog, skel_->obj) {
    if (!bpf_program__autoload(prog) || bpf_program__fd(prog) < 0) continue;
    bpf_prog_info info{};
    uint32_t length = sizeof(info);
    if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &length) == 0)
      snapshot.nested_runs_skipped += info.recursion_misses;
  }
  return snapshot;
}

void BpfProbes::Forget(const StaleKeys& keys) {
  std::lock_guard<std::mutex> maps_lock(maps_mutex_);  // never under a Read's walk (see Read)
  int stats_fd = bpf_map__fd(skel_->maps.dev_stats);
  for (const DevOpKey& k : keys.stats) {
    mw_dev_key key{k.major, k.minor, k.op, 0, k.diskseq};
    bpf_map_delete_elem(stats_fd, &key);  // ENOENT: already gone, fine
  }
  int origin_fd = bpf_map__fd(skel_->maps.origin_stats);
  for (const OriginKey& k : keys.origins) {
    mw_origin_key key{k.major, k.minor, k.origin_major, k.origin_minor, k.op, 0, k.diskseq};
    bpf_map_delete_elem(origin_fd, &key);
  }
}

}  // namespace mergewatch
