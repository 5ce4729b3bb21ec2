// SPDX-License-Identifier: Apache-2.0
#include "metrics/device_filter.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

namespace mergewatch {

bool DeviceFilter::Make(const std::string& include, const std::string& exclude, DeviceFilter* filter,
                        std::string* error) {
  DeviceFilter made;
  auto compile = [error](const std::string& pattern, const char* flag, std::shared_ptr<const std::regex>* out) {
    try {
      *out = std::make_shared<const std::regex>(pattern, std::regex::ECMAScript);
      return true;
    } catch (const std::regex_error& e) {
      *error = std::string(flag) + " is not a valid regular expression: \"" + pattern + "\" (" + e.what() + ")";
      return false;
    }
  };
  if (!include.empty() && !exclude.empty()) {
    *error = "--devices.include and --devices.exclude are mutually exclusive";
    return false;
  }
  if (!include.empty() && !compile(include, "--devices.include", &made.include_)) return false;
  if (!exclude.empty() && !compile(exclude, "--devices.exclude", &made.exclude_)) return false;
  made.include_text_ = include;
  made.exclude_text_ = exclude;
  *filter = std::move(made);
  return true;
}

bool DeviceFilter::Excluded(const std::string& device) const {
  if (KeepsEveryDevice()) return false;
  std::lock_guard<std::mutex> lock(memo_->mutex);
  auto it = memo_->excluded.find(device);
  if (it != memo_->excluded.end()) return it->second;
  if (memo_->excluded.size() >= kMaxRemembered) memo_->excluded.clear();
  return memo_->excluded.emplace(device, Match(device)).first->second;
}

bool DeviceFilter::Match(const std::string& device) const {
  if (exclude_ && std::regex_search(device, *exclude_)) return true;
  if (include_ && !std::regex_search(device, *include_)) return true;
  return false;
}

std::string DeviceFilter::Describe() const {
  if (include_) return "only devices matching --devices.include=" + include_text_;
  if (exclude_) return "devices matching --devices.exclude=" + exclude_text_ + " left out";
  return "every device";
}

void DropExcludedDevices(const DeviceFilter& filter, std::vector<prometheus::MetricFamily>* families) {
  if (filter.KeepsEveryDevice()) return;
  // A scrape's series name the same few hundred devices thousands of times, mostly several in a
  // row: the previous series' answer first, then this scrape's own table, then the filter's memo.
  // Owned copies: remove_if moves the series, and the label strings with them.
  std::unordered_map<std::string, bool> seen;
  std::string previous;
  bool has_previous = false, previous_excluded = false;
  auto excluded = [&](const std::string& device) {
    if (has_previous && device == previous) return previous_excluded;
    auto it = seen.find(device);
    if (it == seen.end()) it = seen.emplace(device, filter.Excluded(device)).first;
    previous = device;
    has_previous = true;
    previous_excluded = it->second;
    return previous_excluded;
  };
  constexpr std::string_view kDeviceLabel = "device";
  for (prometheus::MetricFamily& family : *families) {
    auto& metrics = family.metric;
    metrics.erase(std::remove_if(metrics.begin(), metrics.end(),
                                 [&](const prometheus::ClientMetric& metric) {
                                   for (const prometheus::ClientMetric::Label& label : metric.label)
                                     if (label.name == kDeviceLabel) return excluded(label.value);
                                   return false;
                                 }),
                  metrics.end());
  }
}

}  // namespace mergewatch
