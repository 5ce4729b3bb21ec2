// SPDX-License-Identifier: Apache-2.0
// Text for the world outside: names from the kernel (device names may hold any byte) made valid
// UTF-8, one-to-one. Below every other part of the daemon: the log, the exposition and /status use it.
#pragma once

#include <string>

namespace mergewatch {

// Valid UTF-8 passes through unchanged, except '\': every byte that is not part of a valid
// UTF-8 sequence (stray continuation bytes, overlong forms, surrogates, > U+10FFFF, a cut-off
// sequence) becomes the four characters \xHH, and a backslash becomes \x5c so that the
// mapping stays one-to-one: two different names never share a label value. This is the
// escaping dmsetup itself uses for mangled names (dmsetup --manglename hex).
std::string LabelText(const std::string& bytes);

}  // namespace mergewatch
