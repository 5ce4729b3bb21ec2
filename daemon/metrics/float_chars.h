// SPDX-License-Identifier: Apache-2.0
// std::to_chars for double, also where the C++ library lacks it: libstdc++ has it from GCC 11, and the
// release binaries are built with Debian 11's GCC 10 (glibc 2.31). With libstdc++ >= 11 these call
// std::to_chars; before, the same text comes from snprintf and strtod.
#pragma once

#include <charconv>
#include <string>

namespace mergewatch {

// std::to_chars(first, last, value, format): the shortest text that reads back as `value`, in
// scientific ("1.5e-07") or fixed ("0.25") form. Other formats (general, hex) are not supported here.
std::to_chars_result DoubleToChars(char* first, char* last, double value, std::chars_format format);

// std::to_chars(first, last, value, format, precision), which the standard defines as printf's %.*e,
// %.*f or %.*g (scientific, fixed, general) in the C locale.
std::to_chars_result DoubleToChars(char* first, char* last, double value, std::chars_format format, int precision);

namespace float_chars_internal {

// The fallback DoubleToChars(first, last, value, format) uses where std::to_chars has no double: built
// everywhere, so the unit tests compare it with std::to_chars where that has one. Finite values only
// for fixed (scientific also writes inf and nan as to_chars does).
std::to_chars_result ShortestWithPrintf(char* first, char* last, double value, std::chars_format format);

}  // namespace float_chars_internal
}  // namespace mergewatch
