// SPDX-License-Identifier: Apache-2.0
// Loads and attaches the BPF programs in a short-lived child process, which hands the map,
// program and link descriptors back over a socketpair (SCM_RIGHTS) and exits.
//
// Why a child: libbpf parses the kernel's whole BTF (5.5 MB, ~12 MiB at its peak) to find
// each tp_btf program's attach target, and we parse it once more for the tracepoint arities.
// Done in-process, that peak stays the daemon's VmHWM for its whole life (19 MiB against
// ~10 MiB steady; BENCHMARKS.md, "Peak RSS"). The child's memory goes away with it. Links and
// maps are kernel objects counted by their descriptors: the child's exit closes its copies,
// the parent's copies keep everything attached until it closes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <linux/types.h>

#include "mergewatch/abi.h"

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

// log2 of the in-flight table's size: --bpf.inflight-entries rounded up to a power of two.
uint32_t InflightSlotBits(uint32_t entries);

// Reads the layout from a BTF file; false with a message if the file is not usable BTF.
bool ReadTracepointLayout(const std::string& btf_path, TracepointLayout* layout, std::string* error);

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
  std::string error;  // set when kind != kNone; then there are no descriptors
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
// OOM killer's, said with strerror(ENOMEM) so that BpfFailureCanPass() takes it for the memory cause.
std::string DescribeLoaderExit(int status, bool killed_by_us);

// The most descriptors one reply may carry (the kernel's SCM_MAX_FD).
constexpr size_t kMaxReplyFds = 253;
// How long the parent waits for the child's answer before killing it.
constexpr int kLoaderTimeoutMs = 120'000;

// Forks the loader, waits for its reply (or EOF or the timeout), reaps it. Always returns a
// reply: on any failure of the child itself, kind is kLoad with the reason.
LoadReply LoadInChild(const ProbeOptions& options);

}  // namespace mergewatch
