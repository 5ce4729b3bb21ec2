// SPDX-License-Identifier: Apache-2.0
// Loads and attaches the BPF programs in a short-lived child process, which hands the map,
// program and link descriptors back over a socketpair (SCM_RIGHTS) and exits. The child is this
// binary started again in loader mode (posix_spawn of /proc/self/exe, RunLoaderMode), never a
// fork of the daemon: a fork while an HTTP thread holds a lock (the logger's, malloc's) would
// leave the child waiting on it forever.
//
// Why a child: libbpf parses the kernel's whole BTF (5.5 MB, ~12 MiB at its peak) to find
// each tp_btf program's attach target, and we parse it once more for the tracepoint arities.
// Done in-process, that peak stays the daemon's VmHWM for its whole life (19 MiB against
// ~10 MiB steady; BENCHMARKS.md, "Peak RSS"). The child's memory goes away with it. Links and
// maps are kernel objects counted by their descriptors: the child's exit closes its copies,
// the parent's copies keep everything attached until it closes them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <linux/types.h>
#include <sys/types.h>

#include "clock.h"
#include "mergewatch/abi.h"

struct btf;  // libbpf's, <bpf/btf.h>

namespace mergewatch {

// --bpf.program-type: auto (tp_btf, falling back to raw_tp), or only one of them.
enum class ProgramType { kAuto, kTpBtf, kRawTp };
const char* ProgramTypeName(ProgramType type);  // "auto", "tp_btf", "raw_tp"
bool ParseProgramType(const std::string& text, ProgramType* out);

// --bpf.request-clock: how requests on queues without an I/O scheduler are timed (bpf/request_clock.bpf.h).
// kAuto: the kernel's dispatch stamp where it will be exact, else the dispatch clock table; kDispatch: the
// table always; kTable: the in-flight table of the scheduler path for every queue (as before 2026-12).
enum class RequestClock { kAuto, kDispatch, kTable };
const char* RequestClockName(RequestClock clock);  // "auto", "dispatch", "table"
bool ParseRequestClock(const std::string& text, RequestClock* out);

struct ProbeOptions {
  std::string btf_path = "/sys/kernel/btf/vmlinux";
  uint32_t inflight_entries = MW_DEFAULT_INFLIGHT_ENTRIES;
  ProgramType program_type = ProgramType::kAuto;
  RequestClock request_clock = RequestClock::kAuto;
  std::string sysfs_root = "/sys";     // --path.sysfs: where the kernel's lockdown file is read
  // Who is behind a remap chain (bpf/handlers.bpf.h, chain_cgroup): the cgroup2 root's id, whose
  // tasks are kernel threads, and whether a bio's blkcg id is a cgroup2 one (CgroupRootOf()).
  uint64_t cgroup_root_id = 1;
  bool blkcg_on_cgroup2 = false;
  // Tests only (--debug.bpf-loader-hang): the loader process sleeps instead of loading, until the
  // daemon gives up on it at kLoaderTimeout.
  bool loader_hangs = false;
};

// Why loading failed, so main can pick the exit code and the advice. kLockdown: the kernel's
// confidentiality lockdown refuses what the programs need (bpf_probe_read_kernel); a source
// without BPF can stand in, retrying cannot help. kTimeout: the loader process did not answer
// within kLoaderTimeout and was killed (never sent by a loader: the daemon decides it).
enum class ProbeError { kNone, kNoBtf, kNoPrivilege, kLoad, kLockdown, kTimeout };

// A failed load: why (kind), the errno behind it where one was (0 otherwise), what to tell the operator.
struct ProbeFailure {
  ProbeError kind = ProbeError::kNone;
  int error_number = 0;
  std::string message;
};

// Whether a failed BPF load may succeed later by itself: a loader that did not answer in time, memory
// (ENOMEM: a memlock or cgroup limit, a full kernel, the OOM killer) or a busy resource (EBUSY). Never a
// missing privilege, lockdown, missing BTF or a program the verifier refuses: those need an operator.
bool BpfFailureCanPass(const ProbeFailure& failure);

// The kernel's lockdown mode from <sysfs_root>/kernel/security/lockdown ("none [integrity] confidentiality"
// -> "integrity"); "" where the file is absent (no lockdown LSM, securityfs not mounted). Under
// "confidentiality" the verifier refuses our programs (EINVAL on 6.1: the kernel-read helpers are withheld),
// which the load error alone does not say: the loader reads it once and calls that failure kLockdown.
std::string LockdownMode(const std::string& sysfs_root);

// What the loader learns about the running kernel from its BTF and one probe load (pure data, so the choice of
// program variants below can be tested with a made-up kernel).
struct KernelFeatures {
  // Argument count of each block tracepoint the kernel has (btf_trace_<tp> prototype);
  // a tracepoint that is absent is not in the map.
  std::map<std::string, int> tracepoint_arity;
  // enum bpf_func_id has BPF_FUNC_get_current_task_btf (v5.11+). The programs choose by a
  // CO-RE relocation against the same BTF (core_fixes.bpf.h); this is for the log.
  bool current_task_btf = false;
  // The running kernel's verifier takes BPF_CMPXCHG (v5.12+): not in BTF, so the loader probes it with a
  // load (ReadKernelFeatures leaves it false). Picks how block_rq_insert/issue claim in-flight slots.
  bool compare_exchange = false;
  // The bits of QUEUE_FLAG_STATS (request_queue->queue_flags) and RQF_STATS (request->rq_flags), -1 if
  // unknown: read from the BTF's enumerators (v6.11+), else the values they had as #defines (KernelStampBits).
  int queue_flag_stats_bit = -1;
  int rqf_stats_bit = -1;
  bool stamp_bits_from_btf = false;
};

// The bits of QUEUE_FLAG_STATS and RQF_STATS into *features: the BTF's enumerators (any enum, named or not),
// else, where the BTF has neither, the values of the kernels that #defined them; -1 both if it has only one.
void KernelStampBits(const struct btf* btf, KernelFeatures* features);

// Reads the features from a BTF file; false with a message if it is not a kernel's BTF with
// block tracepoints.
bool ReadKernelFeatures(const std::string& btf_path, KernelFeatures* features, std::string* error);

// One program of the BPF object, as libbpf names it.
struct ProgramId {
  std::string name;     // btf_rq_insert, raw_rq_insert_q, ...
  std::string section;  // tp_btf/block_rq_insert, ...
};

// Which programs to load for `mode` (tp_btf or raw_tp) on a kernel with `features`: per
// tracepoint, the variant whose argument layout matches the kernel's prototype (no suffix: the
// v5.11+ layout; _q: the older one with the request_queue first); of the v5.11+ layout, where a
// _store variant exists (the slot claim by plain store), that one unless the kernel has
// compare-and-exchange.
struct VariantPlan {
  std::vector<std::string> load;     // program names to load
  std::vector<std::string> missing;  // tracepoints the kernel does not have
  // Tracepoints whose prototype matches no variant ("block_getrq has 5 arguments; ...").
  std::vector<std::string> unknown_layout;
  std::vector<std::string> old_layout;  // tracepoints served by a _q variant
};
VariantPlan ChooseVariants(const std::string& mode, const KernelFeatures& features,
                           const std::vector<ProgramId>& programs);

// log2 of the in-flight table's size: --bpf.inflight-entries rounded up to a power of two.
uint32_t InflightSlotBits(uint32_t entries);

// One loaded program. Descriptors are owned by whoever holds the LoadReply.
struct LoadedProgram {
  std::string tracepoint;  // block_rq_issue, ...
  std::string mode;        // tp_btf or raw_tp
  int prog_fd = -1;
  int link_fd = -1;  // -1: loaded, not attached (block_bio_queue, attached on demand; or attach failed)
};

// What the loader child answers: an error, or every descriptor the daemon needs afterwards.
struct LoadReply {
  ProbeError kind = ProbeError::kNone;
  std::string error;      // set when kind != kNone; then there are no descriptors
  int error_number = 0;   // the errno behind the failure, where one was
  std::string mode;
  int dev_stats_fd = -1;
  int origin_stats_fd = -1;
  int event_counts_fd = -1;
  // The object's other maps (the in-flight table, .rodata, ...): the programs keep them alive
  // anyway, but the daemon holds them too, so /proc/PID/fdinfo shows every map it uses.
  std::vector<int> other_map_fds;
  std::vector<LoadedProgram> programs;
};

// Closes every descriptor of the reply and marks them -1.
void CloseReplyFds(LoadReply* reply);

// Pure core of the wire format. Encode returns the bytes and appends the descriptors to send,
// in the order the bytes refer to them (by index). Decode checks everything (magic, lengths,
// each received descriptor referred to exactly once, nothing left over) and on success gives
// the received descriptors to *reply; on failure they are untouched (the caller closes them).
std::string EncodeLoadReply(const LoadReply& reply, std::vector<int>* fds);
bool DecodeLoadReply(const std::string& bytes, const std::vector<int>& fds, LoadReply* reply, std::string* error);

// The loader child's wait status in words: "exited with status 3", "was killed by signal 11 (Segmentation fault)".
std::string DescribeWaitStatus(int status);
// The same, for the failure message: a SIGKILL the daemon did not send (killed_by_us false) is the
// OOM killer's, and says so.
std::string DescribeLoaderExit(int status, bool killed_by_us);
// The errno a loader's end stands for: ENOMEM for the OOM killer's SIGKILL (the memory cause, which can
// pass: BpfFailureCanPass), else 0.
int LoaderExitErrno(int status, bool killed_by_us);

// The most descriptors one reply may carry (the kernel's SCM_MAX_FD).
constexpr size_t kMaxReplyFds = 253;
// How long the daemon waits for the loader's answer before killing it. A load takes about a
// second (the verifier on nine programs); the bound stays well below the unit's WatchdogSec (30 s)
// and TimeoutStartSec (60 s), so a hung load at start ends in diskstats or an exit long before
// systemd would kill the daemon.
constexpr Duration kLoaderTimeout = std::chrono::seconds(20);

// argv[1] of the loader mode; main() hands such a command line to RunLoaderMode.
constexpr const char* kLoaderModeFlag = "--internal.bpf-loader";
// The loader mode's exit status for a command line it does not take.
constexpr int kLoaderUsageExit = 2;
// The loader process's main: loads, sends the reply over descriptor 3, returns the exit status.
int RunLoaderMode(int argc, const char* const* argv);

// One load in flight: the loader process and its socket. The daemon's main loop polls fd() beside
// its other descriptors and calls Finish once it is readable or deadline() has passed, so a load
// never blocks the loop (the watchdog and the scrapes go on while the verifier runs or a load hangs).
class LoaderProcess {
 public:
  // Starts the loader. A process that could not start is returned finished: fd() is -1 and
  // Finish() returns the reason at once.
  static std::unique_ptr<LoaderProcess> Start(const ProbeOptions& options, TimePoint now);
  // Readable once the answer (or the loader's end: EOF) is there; -1 if it never started.
  int fd() const { return sock_; }
  TimePoint deadline() const { return deadline_; }
  // Reads the answer and reaps the loader; with give_up (the deadline passed) kills it first and
  // returns kTimeout. Call once.
  LoadReply Finish(bool give_up);
  // Kills and reaps a loader still running, closing what it sent.
  ~LoaderProcess();
  LoaderProcess(const LoaderProcess&) = delete;
  LoaderProcess& operator=(const LoaderProcess&) = delete;

 private:
  LoaderProcess() = default;
  pid_t pid_ = -1;
  int sock_ = -1;
  TimePoint deadline_{};
  LoadReply result_;  // the failure, when the process never started
};

// Starts the loader and waits for it (kLoaderTimeout at most). Always returns a reply: on any
// failure of the child itself, kind is kLoad (kTimeout when it did not answer) with the reason.
LoadReply LoadInChild(const ProbeOptions& options);

}  // namespace mergewatch
