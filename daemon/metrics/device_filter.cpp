// SPDX-License-Identifier: Apache-2.0
#include "metrics/device_filter.h"

#include <algorithm>
#include <map>

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
  std::map<std::string, bool> memo;  // one regex run per device and scrape
  for (prometheus::MetricFamily& family : *families) {
    auto& metrics = family.metric;
    metrics.erase(std::remove_if(metrics.begin(), metrics.end(),
                                 [&](const prometheus::ClientMetric& metric) {
                                   for (const prometheus::ClientMetric::Label& label : metric.label) {
                                     if (label.name != "device") continue;
                                     auto it = memo.find(label.value);
                                     if (it == memo.end())
                                       it = memo.emplace(label.value, filter.Excluded(label.value)).first;
                                     return it->second;
                                   }
                                   return false;
                                 }),
                  metrics.end());
  }
}

}  // namespace mergewatch
