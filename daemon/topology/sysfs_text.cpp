// SPDX-License-Identifier: Apache-2.0
#include "topology/sysfs_text.h"

#include <sstream>

#include "topology/block_ids.h"
#include "topology/topology.h"

namespace mergewatch {
namespace {

// dev_t limits of the kernel-internal encoding (abi.h): a value outside them cannot match any
// BPF-reported device.
constexpr uint32_t kMaxMajor = MW_MAJORMASK;
constexpr uint32_t kMaxMinor = MW_MINORMASK;

// "LVM-" followed by the VG uuid and LV uuid, 32 chars each, no dashes.
constexpr size_t kLvmUuidIdLength = 4 + 64;

}  // namespace

namespace topology_internal {

std::string Trim(const std::string& s) {
  const char* kSpace = " \t\r\n";
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string::npos) return "";
  const size_t last = s.find_last_not_of(kSpace);
  return s.substr(first, last - first + 1);
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string Basename(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  return slash == std::string::npos ? rel : rel.substr(slash + 1);
}

std::string Dirname(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  return slash == std::string::npos ? "" : rel.substr(0, slash);
}

std::optional<std::pair<uint32_t, uint32_t>> ParseDevNumber(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return std::nullopt;
  const auto major = ParseDecimal<uint32_t>(text.substr(0, colon), 0, kMaxMajor);
  const auto minor = ParseDecimal<uint32_t>(text.substr(colon + 1), 0, kMaxMinor);
  if (!major || !minor) return std::nullopt;
  return std::make_pair(*major, *minor);
}

std::string DevNumberText(uint32_t major, uint32_t minor) {
  return std::to_string(major) + ":" + std::to_string(minor);
}

void AppendWarning(std::vector<std::string>* warnings, std::string warning) {
  if (warnings != nullptr) warnings->push_back(std::move(warning));
}

}  // namespace topology_internal

// ---------------------------------------------------------------------------
// The parsers topology.h declares.

using topology_internal::StartsWith;
using topology_internal::Trim;

std::optional<LvmName> ParseLvmName(const std::string& dm_name, const std::string& dm_uuid) {
  if (!StartsWith(dm_uuid, "LVM-") || dm_uuid.size() < kLvmUuidIdLength) return std::nullopt;
  // Same walk as lvm2's dm_split_lvm_name(): "--" is a literal '-', a single
  // '-' ends a part.
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < dm_name.size(); ++i) {
    if (dm_name[i] != '-') {
      parts.back() += dm_name[i];
    } else if (i + 1 < dm_name.size() && dm_name[i + 1] == '-') {
      parts.back() += '-';
      ++i;
    } else {
      parts.emplace_back();
    }
  }
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() || parts[1].empty()) {
    return std::nullopt;
  }
  LvmName lvm{parts[0], parts[1], ""};
  // The uuid suffix is authoritative ("LVM-<ids>-real"); a name without a
  // layer part but a uuid with one (or the reverse) is still accepted.
  if (dm_uuid.size() > kLvmUuidIdLength + 1 && dm_uuid[kLvmUuidIdLength] == '-') {
    lvm.layer = dm_uuid.substr(kLvmUuidIdLength + 1);
  }
  return lvm;
}

std::optional<std::string> ParseScheduler(const std::string& content) {
  const size_t open = content.find('[');
  if (open != std::string::npos) {
    const size_t close = content.find(']', open + 1);
    if (close == std::string::npos || close == open + 1) return std::nullopt;
    return content.substr(open + 1, close - open - 1);
  }
  if (Trim(content) == "none") return std::string("none");
  return std::nullopt;
}

std::vector<std::string> ParseSchedulerList(const std::string& content) {
  std::vector<std::string> names;
  std::istringstream words(content);
  std::string word;
  while (words >> word) {
    if (word.size() >= 2 && word.front() == '[' && word.back() == ']') word = word.substr(1, word.size() - 2);
    if (!word.empty()) names.push_back(word);
  }
  return names;
}

std::optional<std::string> MultipathHeadOf(const std::string& name) {
  // nvme<S>c<C>n<N>, each a decimal number.
  auto digits = [&name](size_t at) {
    size_t end = at;
    while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
    return end;
  };
  if (!StartsWith(name, "nvme")) return std::nullopt;
  const size_t subsys_end = digits(4);
  if (subsys_end == 4 || subsys_end >= name.size() || name[subsys_end] != 'c') return std::nullopt;
  const size_t ctrl_end = digits(subsys_end + 1);
  if (ctrl_end == subsys_end + 1 || ctrl_end >= name.size() || name[ctrl_end] != 'n') return std::nullopt;
  const size_t ns_end = digits(ctrl_end + 1);
  if (ns_end == ctrl_end + 1 || ns_end != name.size()) return std::nullopt;
  return name.substr(0, subsys_end) + name.substr(ctrl_end);
}

}  // namespace mergewatch
