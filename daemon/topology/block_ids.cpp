// SPDX-License-Identifier: Apache-2.0
#include "topology/block_ids.h"

namespace mergewatch {

const char* OpLabel(uint32_t raw_op) {
  switch (raw_op) {
    case MW_OP_READ: return "read";
    case MW_OP_WRITE: return "write";
    case MW_OP_FLUSH: return "flush";
    case MW_OP_DISCARD: return "discard";
    case MW_OP_WRITE_ZEROES: return "write_zeroes";
    default: return "other";
  }
}

}  // namespace mergewatch
