// SPDX-License-Identifier: Apache-2.0
// The text the topology reader gets from sysfs, parsed: attribute contents and the kernel's
// device names. Pure (no file is read here), so each rule is tested on its own strings; the
// public parsers (ParseScheduler, ParseLvmName, MultipathHeadOf, ...) are declared in
// topology.h and defined in sysfs_text.cpp, the helpers the other readers share below.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace mergewatch {
namespace topology_internal {

// `s` without leading and trailing blanks (space, tab, CR, LF): sysfs ends attributes with '\n'.
std::string Trim(const std::string& s);

bool StartsWith(const std::string& s, const std::string& prefix);

// Last and all-but-last components of a '/'-separated relative path ("" for the dirname of a
// single component).
std::string Basename(const std::string& rel);
std::string Dirname(const std::string& rel);

// Whole string must be a decimal number in [min, max]; no sign, no junk.
template <typename T>
std::optional<T> ParseDecimal(const std::string& text, T min, T max) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  if (value < min || value > max) return std::nullopt;
  return value;
}

// The content of a "dev" file, "<major>:<minor>", each within the kernel-internal dev_t limits
// (abi.h): a value outside them cannot match any BPF-reported device.
std::optional<std::pair<uint32_t, uint32_t>> ParseDevNumber(const std::string& text);

// "259:3", as a "dev" file writes it.
std::string DevNumberText(uint32_t major, uint32_t minor);

// Appends to `warnings` unless it is nullptr (every reader takes an optional warnings list).
void AppendWarning(std::vector<std::string>* warnings, std::string warning);

}  // namespace topology_internal
}  // namespace mergewatch
