// SPDX-License-Identifier: Apache-2.0
#include "topology/block_ids.h"

namespace mergewatch {

const char* OpLabel(uint32_t raw_op) {
  switch (raw_op) {
    case 0: return "read";          // REQ_OP_READ
    case 1: return "write";         // REQ_OP_WRITE
    case 2: return "flush";         // REQ_OP_FLUSH
    case 3: return "discard";       // REQ_OP_DISCARD
    case 9: return "write_zeroes";  // REQ_OP_WRITE_ZEROES
    default: return "other";
  }
}

}  // namespace mergewatch
