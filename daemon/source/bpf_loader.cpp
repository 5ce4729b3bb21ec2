// SPDX-License-Identifier: Apache-2.0
#include "source/bpf_loader.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <mutex>
#include <set>

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

// The argument counts of each tracepoint's two layouts: v5.11+ (no request_queue) and before
// (the request_queue first); mergewatch.bpf.c has a program for each (the _q ones: before).
struct TracepointLayouts {
  const char* tracepoint;
  int new_arity;
  int old_arity;
};
constexpr TracepointLayouts kTracepointLayouts[] = {
    {"block_rq_insert", 1, 2},     {"block_rq_issue", 1, 2},       {"block_rq_requeue", 1, 2},
    {"block_rq_complete", 3, 3},   {"block_bio_backmerge", 1, 3},  {"block_bio_frontmerge", 1, 3},
    {"block_bio_queue", 1, 2},     {"block_getrq", 1, 3},          {"block_bio_remap", 3, 4},
};

// Does `enum name` (of any size) have a value called `value`? What bpf_core_enum_value_exists
// asks libbpf in the BPF programs, asked again here of the same BTF file to log the choice.
bool EnumHasValue(const struct btf* btf, const char* name, const char* value) {
  for (int kind : {static_cast<int>(BTF_KIND_ENUM), static_cast<int>(BTF_KIND_ENUM64)}) {
    const int id = btf__find_by_name_kind(btf, name, kind);
    if (id < 0) continue;
    const struct btf_type* type = btf__type_by_id(btf, id);
    const int n = btf_vlen(type);
    for (int i = 0; i < n; ++i) {
      const uint32_t name_off = kind == BTF_KIND_ENUM ? btf_enum(type)[i].name_off : btf_enum64(type)[i].name_off;
      const char* s = btf__name_by_offset(btf, name_off);
      if (s != nullptr && strcmp(s, value) == 0) return true;
    }
  }
  return false;
}

// The value of the enumerator `name` in any enum of the BTF, named or not (QUEUE_FLAG_* is an anonymous
// enum since v6.11, RQF_* bits were one in v6.11-v6.13); -1 if none has it.
long long EnumeratorValue(const struct btf* btf, const char* name) {
  const uint32_t types = btf__type_cnt(btf);
  for (uint32_t id = 1; id < types; ++id) {
    const struct btf_type* type = btf__type_by_id(btf, id);
    if (type == nullptr || !(btf_is_enum(type) || btf_is_enum64(type))) continue;
    const int n = btf_vlen(type);
    for (int i = 0; i < n; ++i) {
      const bool is64 = btf_is_enum64(type);
      const uint32_t name_off = is64 ? btf_enum64(type)[i].name_off : btf_enum(type)[i].name_off;
      const char* s = btf__name_by_offset(btf, name_off);
      if (s == nullptr || strcmp(s, name) != 0) continue;
      return is64 ? static_cast<long long>(btf_enum64_value(btf_enum64(type) + i)) : btf_enum(type)[i].val;
    }
  }
  return -1;
}

// Where blk_mq_start_request() says the kernel stamped a request (bpf/request_clock.bpf.h). Enumerators since
// v6.11: commit 55177adf1837 ("block: Make QUEUE_FLAG_x as an enum") and 5f89154e8e9e ("block: Use enum to
// define RQF_x bit indexes"). Before, #defines the BTF does not carry: QUEUE_FLAG_STATS 20 and RQF_STATS
// (1 << 17), as in the sources of Debian's 5.10 and 6.1 (docs/design/request-clock.md).
void ReadStampBits(const struct btf* btf, KernelFeatures* features) {
  const long long queue_flag = EnumeratorValue(btf, "QUEUE_FLAG_STATS");
  const long long rqf = EnumeratorValue(btf, "__RQF_STATS");
  features->stamp_bits_from_btf = queue_flag >= 0 && rqf >= 0;
  if (features->stamp_bits_from_btf && queue_flag < 64 && rqf < 32) {
    features->queue_flag_stats_bit = static_cast<int>(queue_flag);
    features->rqf_stats_bit = static_cast<int>(rqf);
  } else if (queue_flag < 0 && rqf < 0) {
    features->queue_flag_stats_bit = 20;
    features->rqf_stats_bit = 17;
  }
}

std::pair<std::string, std::string> SplitSection(const char* section) {
  std::string s = section != nullptr ? section : "";
  size_t slash = s.find('/');
  if (slash == std::string::npos) return {s, ""};
  return {s.substr(0, slash), s.substr(slash + 1)};
}

}  // namespace

const char* ProgramTypeName(ProgramType type) {
  switch (type) {
    case ProgramType::kTpBtf: return "tp_btf";
    case ProgramType::kRawTp: return "raw_tp";
    case ProgramType::kAuto: break;
  }
  return "auto";
}

const char* RequestClockName(RequestClock clock) {
  switch (clock) {
    case RequestClock::kDispatch: return "dispatch";
    case RequestClock::kTable: return "table";
    case RequestClock::kAuto: break;
  }
  return "auto";
}

bool ParseRequestClock(const std::string& text, RequestClock* out) {
  for (RequestClock c : {RequestClock::kAuto, RequestClock::kDispatch, RequestClock::kTable}) {
    if (text == RequestClockName(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

bool ParseProgramType(const std::string& text, ProgramType* out) {
  for (ProgramType t : {ProgramType::kAuto, ProgramType::kTpBtf, ProgramType::kRawTp}) {
    if (text == ProgramTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

namespace {

LoadReply Failure(ProbeError kind, std::string error, int error_number = 0) {
  LoadReply reply;
  reply.kind = kind;
  reply.error = std::move(error);
  reply.error_number = error_number;
  return reply;
}

constexpr const char* kOldLayoutSuffix = "_q";
constexpr const char* kStoreClaimSuffix = "_store";

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() > suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool CanPass(int error_number) { return error_number == ENOMEM || error_number == EBUSY; }

LoadReply LockdownFailure(const std::string& sysfs_root, const std::string& details) {
  return Failure(ProbeError::kLockdown,
                 "kernel lockdown (confidentiality) refuses BPF reads: the kernel refuses bpf_probe_read_kernel to "
                 "every BPF program, and mergewatch's programs need it (" + sysfs_root +
                     "/kernel/security/lockdown: confidentiality)" + details);
}

#ifndef BPF_ATOMIC
#define BPF_ATOMIC 0xc0
#endif
#ifndef BPF_CMPXCHG
#define BPF_CMPXCHG (0xf0 | 0x01)  // with BPF_FETCH, as the kernel defines it
#endif

// Whether the running kernel's verifier takes a 64-bit compare-and-exchange (v5.12, commit 5ffa25502b5a):
// it loads a socket filter of five instructions doing one on its stack. Any refusal (EINVAL before
// v5.12, or anything else) answers no, which only picks the plain-store variants.
bool VerifierTakesCompareExchange() {
  const bpf_insn program[] = {
      {BPF_ST | BPF_MEM | BPF_DW, BPF_REG_10, 0, -8, 0},                 // *(u64 *)(fp - 8) = 0
      {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0},                 // r0 = 0 (the expected value)
      {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_1, 0, 0, 1},                 // r1 = 1
      {BPF_STX | BPF_ATOMIC | BPF_DW, BPF_REG_10, BPF_REG_1, -8, BPF_CMPXCHG},  // r0 = cmpxchg(fp - 8, r0, r1)
      {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},
  };
  const int fd = bpf_prog_load(BPF_PROG_TYPE_SOCKET_FILTER, "mw_cmpxchg", "GPL", program,
                               sizeof(program) / sizeof(program[0]), nullptr);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// What must hold before any program is opened: the kernel's BTF (read into *features) and the
// privilege to load. A failure's reply, or kind kNone.
LoadReply CheckPrerequisites(const ProbeOptions& options, KernelFeatures* features) {
  std::string error;
  if (access(options.btf_path.c_str(), R_OK) != 0 || !ReadKernelFeatures(options.btf_path, features, &error)) {
    if (error.empty()) error = "cannot read kernel BTF from " + options.btf_path + ": " + strerror(errno);
    error.append(". mergewatchd needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (/sys/kernel/btf/vmlinux), "
                 "or --path.btf pointing at the running kernel's BTF");
    return Failure(ProbeError::kNoBtf, error);
  }
  if (options.request_clock == RequestClock::kAuto) {
    if (features->queue_flag_stats_bit < 0)
      LogWarn("kernel BTF names one of QUEUE_FLAG_STATS and __RQF_STATS but not the other: requests on queues "
              "without a scheduler are timed by the dispatch clock table, never by the kernel's stamps");
    else if (!features->stamp_bits_from_btf)
      LogInfo("kernel BTF has no QUEUE_FLAG_STATS or __RQF_STATS enumerator (before v6.11): the kernel's stamps are "
              "read at QUEUE_FLAG_STATS bit 20 and RQF_STATS bit 17");
  }
  if (!features->current_task_btf)
    LogInfo("kernel BTF has no bpf_get_current_task_btf (before v5.11): the plug is read with "
            "bpf_get_current_task and bpf_probe_read_kernel");
  if (!HasBpfPrivilege()) {
    return Failure(ProbeError::kNoPrivilege,
                   "not privileged to load BPF: run as root, or grant CAP_BPF, CAP_PERFMON (kernel 5.8+) and "
                   "CAP_SYS_RESOURCE; before 5.8 CAP_SYS_ADMIN is needed");
  }
  features->compare_exchange = VerifierTakesCompareExchange();
  if (!features->compare_exchange)
    LogInfo("the kernel's BPF verifier has no compare-and-exchange (before v5.12): in-flight slots are claimed with "
            "a plain store, so two CPUs claiming one slot at once leave a request untimed (counted only host-wide, "
            "as complete_without_issue)");
  return LoadReply{};
}

// Opens the object for `mode` with the variants the kernel's tracepoint layouts call for set to load;
// null with *failure set when it cannot be opened or a required tracepoint's layout is unknown.
mergewatch_bpf* OpenForMode(const ProbeOptions& options, const KernelFeatures& features, const char* mode,
                            LoadReply* failure) {
  LIBBPF_OPTS(bpf_object_open_opts, open_opts);
  // Always named, the default too: a CO-RE type absent from the kernel's BTF (core_fixes.bpf.h's
  // hd_struct___old on 5.11+) sends libbpf looking through the modules' BTF, which needs
  // BPF_BTF_GET_NEXT_ID and so CAP_SYS_ADMIN; Debian 12's libbpf 1.1 fails the whole load on that
  // EPERM, so the unit (CAP_BPF and CAP_PERFMON only) ran on diskstats. With the vmlinux BTF named,
  // libbpf relocates against it alone (measured: loads as the unit's user). No program of ours reads a
  // module's types.
  open_opts.btf_custom_path = options.btf_path.c_str();
  mergewatch_bpf* skel = mergewatch_bpf__open_opts(&open_opts);
  if (skel == nullptr) {
    const int cause = errno;
    *failure = Failure(ProbeError::kLoad, std::string("cannot open the BPF object: ") + strerror(cause) + LibbpfTail(),
                       cause);
    return nullptr;
  }
  const uint32_t slot_bits = InflightSlotBits(options.inflight_entries);
  skel->rodata->inflight_slot_bits = slot_bits;
  skel->rodata->cgroup_root_id = options.cgroup_root_id;
  skel->rodata->blkcg_on_cgroup2 = options.blkcg_on_cgroup2 ? 1 : 0;
  bpf_map__set_max_entries(skel->maps.inflight, 1u << slot_bits);
  bpf_map__set_max_entries(skel->maps.dispatch_clock, 1u << slot_bits);
  const bool stamps_known = features.queue_flag_stats_bit >= 0 && features.rqf_stats_bit >= 0;
  switch (options.request_clock) {
    case RequestClock::kTable: skel->rodata->request_clock = MW_CLOCK_TABLE; break;
    case RequestClock::kDispatch: skel->rodata->request_clock = MW_CLOCK_DISPATCH; break;
    case RequestClock::kAuto:
      skel->rodata->request_clock = stamps_known ? MW_CLOCK_STAMPS : MW_CLOCK_DISPATCH;
      break;
  }
  if (stamps_known) {
    skel->rodata->queue_flag_stats_bit = static_cast<uint32_t>(features.queue_flag_stats_bit);
    skel->rodata->rqf_stats_bit = static_cast<uint32_t>(features.rqf_stats_bit);
  }

  struct bpf_program* prog;
  std::vector<ProgramId> programs;
  bpf_object__for_each_program(prog, skel->obj)
      programs.push_back(ProgramId{bpf_program__name(prog), bpf_program__section_name(prog)});
  const VariantPlan plan = ChooseVariants(mode, features, programs);
  if (std::string(mode) == "tp_btf" || options.program_type == ProgramType::kRawTp) {  // said once, not per mode
    for (const std::string& tp : plan.missing) LogWarn("kernel has no tracepoint " + tp + "; not attached");
    for (const std::string& why : plan.unknown_layout) LogWarn("not attached: " + why);
    if (!plan.old_layout.empty()) {
      std::string list;
      for (const std::string& tp : plan.old_layout) list += (list.empty() ? "" : ", ") + tp;
      LogInfo("tracepoints with the request_queue argument first (the layout before v5.11): " + list);
    }
  }
  for (const char* required : kRequiredTracepoints) {
    for (const std::string& why : plan.unknown_layout) {
      if (why.compare(0, strlen(required) + 1, std::string(required) + " ") == 0) {
        mergewatch_bpf__destroy(skel);
        *failure = Failure(ProbeError::kLoad, "unknown argument layout of a required tracepoint: " + why);
        return nullptr;
      }
    }
  }
  bpf_object__for_each_program(prog, skel->obj) {
    bool wanted = false;
    for (const std::string& name : plan.load) wanted |= (name == bpf_program__name(prog));
    bpf_program__set_autoload(prog, wanted);
  }
  return skel;
}

// The reply of a loaded skeleton: its maps' descriptors, and each program attached (block_bio_queue
// is attached on demand: SetBioQueueTracing). A required tracepoint that does not attach fails it.
LoadReply AttachLoaded(mergewatch_bpf* skel, const char* mode) {
  LoadReply reply;
  reply.mode = mode;
  reply.dev_stats_fd = bpf_map__fd(skel->maps.dev_stats);
  reply.origin_stats_fd = bpf_map__fd(skel->maps.origin_stats);
  reply.event_counts_fd = bpf_map__fd(skel->maps.event_counts);
  struct bpf_map* map;
  bpf_object__for_each_map(map, skel->obj) {
    const int fd = bpf_map__fd(map);
    if (fd >= 0 && fd != reply.dev_stats_fd && fd != reply.origin_stats_fd && fd != reply.event_counts_fd)
      reply.other_map_fds.push_back(fd);
  }
  struct bpf_program* prog;
  bpf_object__for_each_program(prog, skel->obj) {
    if (!bpf_program__autoload(prog)) continue;
    auto [prog_mode, tracepoint] = SplitSection(bpf_program__section_name(prog));
    LoadedProgram loaded{tracepoint, prog_mode, bpf_program__fd(prog), -1};
    if (tracepoint != "block_bio_queue") {
      struct bpf_link* link = bpf_program__attach(prog);
      if (link == nullptr) {
        const int cause = errno;
        std::string why = strerror(cause);
        for (const char* required : kRequiredTracepoints) {
          if (tracepoint == required)
            return Failure(ProbeError::kLoad,
                           "cannot attach to " + tracepoint + " (" + prog_mode + "): " + why + LibbpfTail(), cause);
        }
        LogWarn("cannot attach to " + tracepoint + " (" + prog_mode + "): " + why);
      } else {
        loaded.link_fd = bpf_link__fd(link);
      }
    }
    reply.programs.push_back(loaded);
  }
  return reply;
}

// The whole load, as it ran in-process before the loader child existed: tp_btf, then raw_tp (or the
// one --bpf.program-type pins). Runs in the child: on success the skeleton is left open on purpose
// (its descriptors are what the child sends; the child's exit closes its copies).
LoadReply LoadHere(const ProbeOptions& options) {
  KernelFeatures features;
  if (LoadReply failed = CheckPrerequisites(options, &features); failed.kind != ProbeError::kNone) return failed;
  const bool confidentiality = LockdownMode(options.sysfs_root) == "confidentiality";
  std::string failures;
  std::string causes;  // one line: "tp_btf: <strerror>; raw_tp: <strerror>"
  int failed_errno = 0;  // the last mode's, or one that can pass (ENOMEM, EBUSY) where a mode had one
  for (const char* mode : {"tp_btf", "raw_tp"}) {
    if (options.program_type != ProgramType::kAuto && ProgramTypeName(options.program_type) != std::string(mode))
      continue;
    LoadReply failure;
    mergewatch_bpf* skel = OpenForMode(options, features, mode, &failure);
    if (skel == nullptr) return failure;
    const int err = mergewatch_bpf__load(skel);
    if (err == 0) return AttachLoaded(skel, mode);
    mergewatch_bpf__destroy(skel);
    if (err == -EPERM) {
      if (confidentiality) return LockdownFailure(options.sysfs_root, LibbpfTail());
      return Failure(ProbeError::kNoPrivilege,
                     std::string("the kernel refused BPF (") + strerror(-err) +
                         "): run as root or with CAP_BPF and CAP_PERFMON; check kernel.unprivileged_bpf_disabled "
                         "and lockdown" + LibbpfTail(),
                     EPERM);
    }
    if (!CanPass(failed_errno)) failed_errno = -err;
    failures += std::string("\n") + mode + ": " + strerror(-err) + LibbpfTail();
    causes += std::string(causes.empty() ? "" : "; ") + mode + ": " + strerror(-err);
    LogInfo(std::string("loading the ") + mode + " programs failed (" + strerror(-err) + "), trying the next mode");
  }
  if (confidentiality) return LockdownFailure(options.sysfs_root, failures);
  // The first line names each mode's cause: mergewatch_detection_info's reason label keeps only that line.
  return Failure(ProbeError::kLoad,
                 (options.program_type == ProgramType::kAuto
                      ? std::string("the BPF programs did not load in any mode (")
                      : std::string("the BPF programs did not load as ") + ProgramTypeName(options.program_type) + " (") +
                     causes + "):" + failures,
                 failed_errno);
}

// ---- wire format: "MWL2", then fields; integers little-endian u32, strings u32 length + bytes,
// descriptors as u32 indices into the SCM_RIGHTS array (0xffffffff: none).

constexpr char kMagic[4] = {'M', 'W', 'L', '2'};  // 2: an error carries its errno
constexpr uint32_t kNoFd = 0xffffffffu;
// Bounds a reply to what one SOCK_SEQPACKET message carries (the default socket buffer is ~208 KiB).
constexpr size_t kMaxErrorBytes = 64 * 1024;
constexpr size_t kMaxReplyBytes = 160 * 1024;
constexpr uint32_t kMaxPrograms = 64;
constexpr uint32_t kMaxMaps = 64;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutString(std::string* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
void PutFd(std::string* out, int fd, std::vector<int>* fds) {
  if (fd < 0) {
    PutU32(out, kNoFd);
    return;
  }
  PutU32(out, static_cast<uint32_t>(fds->size()));
  fds->push_back(fd);
}

class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  bool U32(uint32_t* v) {
    if (bytes_.size() - pos_ < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool String(std::string* s, size_t max) {
    uint32_t n;
    if (!U32(&n) || n > max || bytes_.size() - pos_ < n) return false;
    s->assign(bytes_, pos_, n);
    pos_ += n;
    return true;
  }
  bool AtEnd() const { return pos_ == bytes_.size(); }

 private:
  const std::string& bytes_;
  size_t pos_ = 0;
};

void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds) close(fd);
}

// Sends one message: the bytes and the descriptors together.
bool SendReply(int sock, const std::string& bytes, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxReplyFds));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent;
  do sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (sent < 0 && errno == EINTR);
  return sent == static_cast<ssize_t>(bytes.size());
}

// The loader process's whole life, from RunLoaderMode: load, answer, exit. `hang` (a test hook)
// sleeps until the daemon kills it at the bound instead.
int LoadAndAnswer(int sock, const ProbeOptions& options) {
  if (options.loader_hangs) {
    LogInfo("BPF loader: --debug.bpf-loader-hang: sleeping until mergewatchd gives up on this load");
    for (;;) pause();
  }
  int code = 2;  // an exception even while answering: the parent reports this exit status
  try {
    LoadReply reply;
    try {
      reply = LoadHere(options);
    } catch (const std::bad_alloc& e) {
      reply = Failure(ProbeError::kLoad, std::string("the BPF loader failed: ") + e.what(), ENOMEM);
    } catch (const std::exception& e) {
      reply = Failure(ProbeError::kLoad, std::string("the BPF loader failed: ") + e.what());
    }
    std::vector<int> fds;
    std::string bytes = EncodeLoadReply(reply, &fds);
    if (fds.size() > kMaxReplyFds || bytes.size() > kMaxReplyBytes) {
      fds.clear();
      bytes = EncodeLoadReply(Failure(ProbeError::kLoad, "the loader's reply is too large (" +
                                                             std::to_string(reply.programs.size()) + " programs)"),
                              &fds);
    }
    code = SendReply(sock, bytes, fds) ? 0 : 1;
  } catch (...) {
  }
  return code;
}

// One message from the child, its descriptors into *fds (close-on-exec). Called once the socket
// is readable. False with a reason on EOF (the child died without answering) or a truncated message.
bool ReceiveReply(int sock, std::string* bytes, std::vector<int>* fds, std::string* error) {
  bytes->assign(kMaxReplyBytes + 1, '\0');
  iovec iov{bytes->data(), bytes->size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxReplyFds));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t got;
  do got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (got < 0 && errno == EINTR);
  if (got < 0) {
    *error = std::string("recvmsg: ") + strerror(errno);
    return false;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->push_back(fd);
    }
  }
  if (got == 0) {
    *error = "it closed the connection without an answer";
    return false;
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(got) > kMaxReplyBytes) {
    *error = "its answer was truncated";
    return false;
  }
  bytes->resize(static_cast<size_t>(got));
  return true;
}

}  // namespace

void KernelStampBits(const struct btf* btf, KernelFeatures* features) { ReadStampBits(btf, features); }

uint32_t InflightSlotBits(uint32_t entries) {
  uint32_t bits = 1;
  while ((1u << bits) < entries && bits < 31) ++bits;
  return bits;
}

bool ReadKernelFeatures(const std::string& btf_path, KernelFeatures* features, std::string* error) {
  struct btf* btf = btf__parse(btf_path.c_str(), nullptr);
  if (btf == nullptr) {
    *error = "cannot read kernel BTF from " + btf_path + ": " + strerror(errno);
    return false;
  }
  if (TracepointArity(btf, "block_rq_issue") < 0) {
    btf__free(btf);
    *error = btf_path + " has no btf_trace_block_rq_issue: not the BTF of a kernel with block tracepoints";
    return false;
  }
  features->tracepoint_arity.clear();
  for (const TracepointLayouts& t : kTracepointLayouts) {
    const int arity = TracepointArity(btf, t.tracepoint);
    if (arity >= 0) features->tracepoint_arity[t.tracepoint] = arity;
  }
  features->current_task_btf = EnumHasValue(btf, "bpf_func_id", "BPF_FUNC_get_current_task_btf");
  KernelStampBits(btf, features);
  btf__free(btf);
  return true;
}

VariantPlan ChooseVariants(const std::string& mode, const KernelFeatures& features,
                           const std::vector<ProgramId>& programs) {
  VariantPlan plan;
  std::set<std::string> names;
  for (const ProgramId& p : programs) names.insert(p.name);
  for (const TracepointLayouts& t : kTracepointLayouts) {
    auto found = features.tracepoint_arity.find(t.tracepoint);
    bool old_layout = false;
    if (found == features.tracepoint_arity.end()) {
      plan.missing.push_back(t.tracepoint);
      continue;
    }
    if (found->second == t.old_arity && t.old_arity != t.new_arity) {
      old_layout = true;
      plan.old_layout.push_back(t.tracepoint);
    } else if (found->second != t.new_arity) {
      plan.unknown_layout.push_back(std::string(t.tracepoint) + " has " + std::to_string(found->second) +
                                    " arguments; mergewatchd knows " + std::to_string(t.new_arity) +
                                    (t.old_arity != t.new_arity ? " and " + std::to_string(t.old_arity) : ""));
      continue;
    }
    for (const ProgramId& p : programs) {
      auto [prog_mode, tracepoint] = SplitSection(p.section.c_str());
      if (prog_mode != mode || tracepoint != t.tracepoint) continue;
      const bool q_variant = EndsWith(p.name, kOldLayoutSuffix);
      const bool store_variant = EndsWith(p.name, kStoreClaimSuffix);
      bool wanted;
      if (old_layout)
        wanted = q_variant;
      else if (q_variant)
        wanted = false;
      else if (store_variant)
        wanted = !features.compare_exchange;
      else  // the compare-and-exchange program, or the only one of its layout
        wanted = features.compare_exchange || names.count(p.name + kStoreClaimSuffix) == 0;
      if (wanted) plan.load.push_back(p.name);
    }
  }
  return plan;
}

std::string LockdownMode(const std::string& sysfs_root) {
  std::ifstream in(sysfs_root + "/kernel/security/lockdown");
  std::string text;
  if (!std::getline(in, text)) return "";
  const size_t open = text.find('['), close = text.find(']');
  return open != std::string::npos && close != std::string::npos && close > open
             ? text.substr(open + 1, close - open - 1)
             : "";
}

bool BpfFailureCanPass(const ProbeFailure& failure) {
  // A loader that did not answer in time may answer next time (a verifier slowed by a loaded host).
  if (failure.kind == ProbeError::kTimeout) return true;
  return failure.kind == ProbeError::kLoad && CanPass(failure.error_number);
}

void CloseReplyFds(LoadReply* reply) {
  for (int* fd : {&reply->dev_stats_fd, &reply->origin_stats_fd, &reply->event_counts_fd}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  for (int fd : reply->other_map_fds) close(fd);
  reply->other_map_fds.clear();
  for (LoadedProgram& p : reply->programs) {
    if (p.link_fd >= 0) close(p.link_fd);
    if (p.prog_fd >= 0) close(p.prog_fd);
    p.link_fd = p.prog_fd = -1;
  }
}

std::string EncodeLoadReply(const LoadReply& reply, std::vector<int>* fds) {
  std::string out(kMagic, sizeof(kMagic));
  PutU32(&out, static_cast<uint32_t>(reply.kind));
  if (reply.kind != ProbeError::kNone) {
    const std::string& e = reply.error;
    PutString(&out, e.size() > kMaxErrorBytes ? e.substr(0, kMaxErrorBytes) + "..." : e);
    PutU32(&out, static_cast<uint32_t>(reply.error_number));
    return out;
  }
  PutString(&out, reply.mode);
  PutFd(&out, reply.dev_stats_fd, fds);
  PutFd(&out, reply.origin_stats_fd, fds);
  PutFd(&out, reply.event_counts_fd, fds);
  PutU32(&out, static_cast<uint32_t>(reply.other_map_fds.size()));
  for (int fd : reply.other_map_fds) PutFd(&out, fd, fds);
  PutU32(&out, static_cast<uint32_t>(reply.programs.size()));
  for (const LoadedProgram& p : reply.programs) {
    PutString(&out, p.tracepoint);
    PutString(&out, p.mode);
    PutFd(&out, p.prog_fd, fds);
    PutFd(&out, p.link_fd, fds);
  }
  return out;
}

bool DecodeLoadReply(const std::string& bytes, const std::vector<int>& fds, LoadReply* reply, std::string* error) {
  Reader in(bytes);
  std::vector<bool> used(fds.size(), false);
  auto bad = [&](const std::string& why) {
    *error = "malformed answer: " + why;
    return false;
  };
  // Resolves an index; required descriptors may not be "none", none may be used twice.
  auto fd_at = [&](bool required, int* out) {
    uint32_t index;
    if (!in.U32(&index)) return false;
    if (index == kNoFd) {
      *out = -1;
      return !required;
    }
    if (index >= fds.size() || used[index]) return false;
    used[index] = true;
    *out = fds[index];
    return true;
  };
  if (bytes.size() < sizeof(kMagic) || bytes.compare(0, sizeof(kMagic), kMagic, sizeof(kMagic)) != 0)
    return bad("not a loader reply (" + std::to_string(bytes.size()) + " bytes)");
  LoadReply out;
  uint32_t kind;
  uint32_t magic_word;  // checked above; read to step over it
  if (!in.U32(&magic_word) || !in.U32(&kind) || kind > static_cast<uint32_t>(ProbeError::kLockdown))
    return bad("unknown error kind");
  out.kind = static_cast<ProbeError>(kind);
  if (out.kind != ProbeError::kNone) {
    if (!in.String(&out.error, kMaxErrorBytes + 3) || out.error.empty()) return bad("error without text");
    uint32_t error_number = 0;
    if (!in.U32(&error_number) || error_number > 4095) return bad("error without an errno");
    out.error_number = static_cast<int>(error_number);
    if (!fds.empty() || !in.AtEnd()) return bad("an error with descriptors or trailing bytes");
    *reply = std::move(out);
    return true;
  }
  if (!in.String(&out.mode, 16) || (out.mode != "tp_btf" && out.mode != "raw_tp")) return bad("unknown mode");
  if (!fd_at(true, &out.dev_stats_fd) || !fd_at(true, &out.origin_stats_fd) || !fd_at(true, &out.event_counts_fd))
    return bad("map descriptors");
  uint32_t other_maps;
  if (!in.U32(&other_maps) || other_maps > kMaxMaps) return bad("map count");
  for (uint32_t i = 0; i < other_maps; ++i) {
    int fd;
    if (!fd_at(true, &fd)) return bad("map " + std::to_string(i));
    out.other_map_fds.push_back(fd);
  }
  uint32_t count;
  if (!in.U32(&count) || count == 0 || count > kMaxPrograms) return bad("program count");
  for (uint32_t i = 0; i < count; ++i) {
    LoadedProgram p;
    if (!in.String(&p.tracepoint, 64) || p.tracepoint.empty() || !in.String(&p.mode, 16) ||
        !fd_at(true, &p.prog_fd) || !fd_at(false, &p.link_fd))
      return bad("program " + std::to_string(i));
    out.programs.push_back(std::move(p));
  }
  if (!in.AtEnd()) return bad("trailing bytes");
  for (size_t i = 0; i < used.size(); ++i)
    if (!used[i]) return bad("descriptor " + std::to_string(i) + " not referred to");
  *reply = std::move(out);
  return true;
}

int LoaderExitErrno(int status, bool killed_by_us) {
  // A memory cgroup at its limit may OOM-kill the process whose map allocation went over it, the
  // loader, instead of failing the allocation: the same cause as ENOMEM, which can pass, so
  // --source=auto tries again once the limit is raised.
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && !killed_by_us ? ENOMEM : 0;
}

std::string DescribeLoaderExit(int status, bool killed_by_us) {
  std::string text = DescribeWaitStatus(status);
  if (LoaderExitErrno(status, killed_by_us) == ENOMEM)
    text += " (not by mergewatchd: the OOM killer does that when a memory cgroup is at its limit; " +
            std::string(strerror(ENOMEM)) + ")";
  return text;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + (name != nullptr ? std::string(" (") + name + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

// ---- the loader process: this binary run again in loader mode (posix_spawn), so that the child
// starts single-threaded from main() and never runs code of the threaded daemon after a fork
// (a fork of the daemon while an HTTP thread held the logger's or malloc's lock would hang).

namespace {

// The loader's end of the socket in the child, where posix_spawn's dup2 puts it.
constexpr int kLoaderSocketFd = 3;

std::string LoaderExecutable() { return "/proc/self/exe"; }

// Closes every descriptor above the socket: a loader holds nothing of the daemon's (listening
// sockets passed by systemd have no close-on-exec flag).
void CloseInheritedDescriptors() {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, kLoaderSocketFd + 1, ~0u, 0) == 0) return;
#endif
  rlimit limit{};
  const rlim_t last = getrlimit(RLIMIT_NOFILE, &limit) == 0 ? std::min<rlim_t>(limit.rlim_cur, 65536) : 1024;
  for (rlim_t fd = kLoaderSocketFd + 1; fd < last; ++fd) close(static_cast<int>(fd));
}

bool ParseUnsigned(const char* text, unsigned long long max, unsigned long long* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || v > max) return false;
  *out = v;
  return true;
}

}  // namespace

int RunLoaderMode(int argc, const char* const* argv) {
  // argv: mergewatchd --internal.bpf-loader PARENT_PID BTF_PATH INFLIGHT_ENTRIES PROGRAM_TYPE LOG_LEVEL
  //       LOG_FORMAT HANG SYSFS_ROOT CGROUP_ROOT BLKCG_ON_CGROUP2 REQUEST_CLOCK; the socket at descriptor 3.
  unsigned long long parent = 0, entries = 0, level = 0, format = 0, hang = 0;
  unsigned long long cgroup_root = 0, blkcg_on_cgroup2 = 0;
  if (argc != 13 || !ParseUnsigned(argv[2], 1u << 30, &parent) || !ParseUnsigned(argv[4], 1u << 31, &entries) ||
      !ParseUnsigned(argv[6], static_cast<int>(LogLevel::kError), &level) ||
      !ParseUnsigned(argv[7], static_cast<int>(LogFormat::kJson), &format) || !ParseUnsigned(argv[8], 1, &hang) ||
      !ParseUnsigned(argv[10], UINT64_MAX, &cgroup_root) || !ParseUnsigned(argv[11], 1, &blkcg_on_cgroup2)) {
    fprintf(stderr, "%s: mergewatchd starts this mode itself; it is not for use by hand\n", kLoaderModeFlag);
    return kLoaderUsageExit;
  }
  // Should the daemon die while we load, the loader goes too instead of holding programs alone
  // (checked once more after the prctl: the daemon may have died before it).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != static_cast<pid_t>(parent)) return 1;
  CloseInheritedDescriptors();
  SetLogLevel(static_cast<LogLevel>(level));
  SetLogFormat(static_cast<LogFormat>(format));
  libbpf_set_print(LibbpfPrint);
  ProbeOptions options;
  options.btf_path = argv[3];
  options.inflight_entries = static_cast<uint32_t>(entries);
  if (!ParseProgramType(argv[5], &options.program_type)) {
    fprintf(stderr, "%s: unknown program type %s\n", kLoaderModeFlag, argv[5]);
    return kLoaderUsageExit;
  }
  options.loader_hangs = hang != 0;
  options.sysfs_root = argv[9];
  options.cgroup_root_id = cgroup_root;
  options.blkcg_on_cgroup2 = blkcg_on_cgroup2 != 0;
  if (!ParseRequestClock(argv[12], &options.request_clock)) {
    fprintf(stderr, "%s: unknown request clock %s\n", kLoaderModeFlag, argv[12]);
    return kLoaderUsageExit;
  }
  return LoadAndAnswer(kLoaderSocketFd, options);
}

std::unique_ptr<LoaderProcess> LoaderProcess::Start(const ProbeOptions& options, TimePoint now) {
  std::unique_ptr<LoaderProcess> process(new LoaderProcess);
  process->deadline_ = now + kLoaderTimeout;
  // The daemon's own calls (map reads) log through us instead of libbpf's raw default printer.
  libbpf_set_print(LibbpfPrint);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    const int cause = errno;
    process->result_ =
        Failure(ProbeError::kLoad, std::string("cannot create the BPF loader's socket: ") + strerror(cause), cause);
    return process;
  }
  const std::string parent = std::to_string(getpid());
  const std::string entries = std::to_string(options.inflight_entries);
  const std::string level = std::to_string(static_cast<int>(CurrentLogLevel()));
  const std::string format = std::to_string(static_cast<int>(CurrentLogFormat()));
  const std::string exe = LoaderExecutable();
  const std::string cgroup_root = std::to_string(options.cgroup_root_id);
  const char* argv[] = {exe.c_str(),     kLoaderModeFlag, parent.c_str(), options.btf_path.c_str(),
                        entries.c_str(), ProgramTypeName(options.program_type), level.c_str(), format.c_str(),
                        options.loader_hangs ? "1" : "0", options.sysfs_root.c_str(), cgroup_root.c_str(),
                        options.blkcg_on_cgroup2 ? "1" : "0", RequestClockName(options.request_clock), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  // dup2 onto 3 clears close-on-exec on the copy. A descriptor dup2'ed onto itself would keep the
  // flag (and the loader would start without its socket), so an end that is 3 already moves up first.
  int child_end = sv[1];
  if (child_end == kLoaderSocketFd) {
    child_end = fcntl(sv[1], F_DUPFD_CLOEXEC, kLoaderSocketFd + 1);
    close(sv[1]);
    sv[1] = child_end;
  }
  posix_spawn_file_actions_adddup2(&actions, child_end, kLoaderSocketFd);
  // The daemon blocks its signals in every thread and ignores SIGPIPE: the loader starts with
  // neither, so SIGKILL aside a SIGTERM from an operator ends it too.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  fflush(nullptr);
  pid_t pid = -1;
  const int err = child_end < 0 ? errno
                                : posix_spawn(&pid, exe.c_str(), &actions, &attr, const_cast<char* const*>(argv),
                                              environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (sv[1] >= 0) close(sv[1]);
  if (err != 0) {
    close(sv[0]);
    process->result_ =
        Failure(ProbeError::kLoad, "cannot start the BPF loader process (" + exe + "): " + strerror(err), err);
    return process;
  }
  process->pid_ = pid;
  process->sock_ = sv[0];
  return process;
}

LoaderProcess::~LoaderProcess() {
  if (pid_ > 0 || sock_ >= 0) {
    LoadReply reply = Finish(/*give_up=*/true);
    CloseReplyFds(&reply);
  }
}

LoadReply LoaderProcess::Finish(bool give_up) {
  if (pid_ <= 0) {
    if (sock_ >= 0) close(sock_);
    sock_ = -1;
    return std::move(result_);
  }
  std::string bytes, why;
  std::vector<int> fds;
  bool received = false;
  if (!give_up) {
    received = ReceiveReply(sock_, &bytes, &fds, &why);
  }
  close(sock_);
  sock_ = -1;
  if (give_up) kill(pid_, SIGKILL);  // the pid is ours until reaped below: no other process is hit
  int status = 0;
  pid_t reaped;
  // A child that answered exits at once; one that did not is killed above. Either way this is short.
  do reaped = waitpid(pid_, &status, 0);
  while (reaped < 0 && errno == EINTR);
  const pid_t pid = pid_;
  pid_ = -1;
  const std::string exit_text = reaped == pid ? DescribeLoaderExit(status, give_up) : std::string("could not be reaped");
  LoadReply reply;
  const bool decoded = received && DecodeLoadReply(bytes, fds, &reply, &why);
  if (!decoded) CloseAll(fds);
  const bool clean_exit = reaped == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (decoded && clean_exit) return reply;
  if (decoded) CloseReplyFds(&reply);
  if (give_up) {
    const auto bound = std::chrono::duration_cast<std::chrono::seconds>(kLoaderTimeout).count();
    return Failure(ProbeError::kTimeout, "the BPF loader process (pid " + std::to_string(pid) +
                                             ") did not answer within " + std::to_string(bound) +
                                             " s and was killed (a load takes about a second)");
  }
  return Failure(ProbeError::kLoad,
                 "the BPF loader process (pid " + std::to_string(pid) + ") " + exit_text + (why.empty() ? "" : ": " + why),
                 reaped == pid ? LoaderExitErrno(status, give_up) : 0);
}

LoadReply LoadInChild(const ProbeOptions& options) {
  const auto now = [] { return TimePoint(std::chrono::steady_clock::now().time_since_epoch()); };
  std::unique_ptr<LoaderProcess> process = LoaderProcess::Start(options, now());
  bool give_up = false;
  if (process->fd() >= 0) {
    for (;;) {
      const TimePoint left = process->deadline() - now();
      if (left <= TimePoint::zero()) {
        give_up = true;
        break;
      }
      pollfd pfd{process->fd(), POLLIN, 0};
      const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(left).count()) + 1;
      const int ready = poll(&pfd, 1, ms);
      if (ready > 0) break;
      if (ready < 0 && errno != EINTR) break;  // Finish reports what the socket says
    }
  }
  return process->Finish(give_up);
}

}  // namespace mergewatch
