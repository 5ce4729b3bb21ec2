// SPDX-License-Identifier: Apache-2.0
// Identities the kernel hands out for block I/O: device numbers and request operations.
#pragma once

#include <linux/types.h>

#include <cstdint>
#include <string>

#include "mergewatch/abi.h"

namespace mergewatch {

// Kernel-internal dev_t, as tracepoint dev/old_dev fields carry it (MW_MKDEV, abi.h).
constexpr uint32_t KernelDevMajor(uint64_t dev) { return static_cast<uint32_t>(dev >> MW_MINORBITS); }
constexpr uint32_t KernelDevMinor(uint64_t dev) { return static_cast<uint32_t>(dev & MW_MINORMASK); }
constexpr uint64_t KernelMkdev(uint32_t major, uint32_t minor) {
  return (static_cast<uint64_t>(major) << MW_MINORBITS) | minor;
}

// The `op` label for a raw REQ_OP_* value (cmd_flags & REQ_OP_MASK): read, write, flush, discard and
// write_zeroes (MW_OP_*, abi.h); everything else (secure erase, zone operations, driver passthrough)
// is "other".
const char* OpLabel(uint32_t raw_op);

}  // namespace mergewatch
