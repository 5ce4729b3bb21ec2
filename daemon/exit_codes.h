// SPDX-License-Identifier: Apache-2.0
// Process exit codes: each startup failure has its own, documented in docs/operations.md ("Exit codes").
#pragma once

namespace mergewatch {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,         // unexpected runtime failure
  kExitUsage = 2,           // unknown flag or bad flag value
  kExitNoBtf = 3,           // no usable kernel BTF at --path.btf
  kExitNoPrivilege = 4,     // not allowed to load BPF (needs root or CAP_BPF+CAP_PERFMON)
  kExitListen = 5,          // cannot listen on --web.listen-address (port in use, bad address)
  kExitBpfLoad = 6,         // BPF programs failed to load or attach for another reason
};

}  // namespace mergewatch
