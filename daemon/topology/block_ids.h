// SPDX-License-Identifier: Apache-2.0
// Identities the kernel hands out for block I/O: device numbers and request operations.
#pragma once

#include <cstdint>
#include <string>

namespace mergewatch {

// Kernel-internal dev_t, as tracepoint dev/old_dev fields carry it: MKDEV(ma, mi) =
// ma << 20 | mi (include/linux/kdev_t.h, MINORBITS 20). Not the userspace st_rdev encoding.
constexpr uint32_t kKernelMinorBits = 20;
constexpr uint32_t KernelDevMajor(uint64_t dev) { return static_cast<uint32_t>(dev >> kKernelMinorBits); }
constexpr uint32_t KernelDevMinor(uint64_t dev) {
  return static_cast<uint32_t>(dev & ((1u << kKernelMinorBits) - 1));
}
constexpr uint64_t KernelMkdev(uint32_t major, uint32_t minor) {
  return (static_cast<uint64_t>(major) << kKernelMinorBits) | minor;
}

// The `op` label for a raw REQ_OP_* value (cmd_flags & REQ_OP_MASK). The values of
// read, write, flush, discard and write_zeroes have been stable since v4.10; everything
// else (secure erase, zone operations, driver passthrough) is "other".
const char* OpLabel(uint32_t raw_op);

}  // namespace mergewatch
