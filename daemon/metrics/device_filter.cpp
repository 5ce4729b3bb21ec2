// SPDX-License-Identifier: Apache-2.0
#include "metrics/device_filter.h"

#include <algorithm>
#include <string_view>
#include <utility>

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

namespace {

// Whether each series' device is excluded, for one scrape. A scrape names the same few hundred
// devices thousands of times, and most families list them in the order the family before did
// (the topology's families are filled device by device): the device at the same position of the
// previous family is compared first, then the previous series', and only then is the filter's
// memo asked. Owned copies of the names: remove_if moves the series, and their label strings.
class ScrapeDeviceAnswers {
 public:
  explicit ScrapeDeviceAnswers(const DeviceFilter& filter) : filter_(filter) {}

  void StartFamily() {
    previous_family_.swap(this_family_);
    this_family_.clear();
  }

  bool Excluded(const std::string& device) {
    const size_t position = this_family_.size();
    bool excluded;
    if (position < previous_family_.size() && previous_family_[position].first == device)
      excluded = previous_family_[position].second;
    else if (!this_family_.empty() && this_family_.back().first == device)
      excluded = this_family_.back().second;
    else
      excluded = filter_.Excluded(device);
    this_family_.emplace_back(device, excluded);
    return excluded;
  }

 private:
  const DeviceFilter& filter_;
  std::vector<std::pair<std::string, bool>> previous_family_, this_family_;  // each series' device, in order
};

}  // namespace

void DropExcludedDevices(const DeviceFilter& filter, std::vector<prometheus::MetricFamily>* families) {
  if (filter.KeepsEveryDevice()) return;
  ScrapeDeviceAnswers answers(filter);
  constexpr std::string_view kDeviceLabel = "device";
  for (prometheus::MetricFamily& family : *families) {
    answers.StartFamily();
    auto& metrics = family.metric;
    metrics.erase(std::remove_if(metrics.begin(), metrics.end(),
                                 [&](const prometheus::ClientMetric& metric) {
                                   for (const prometheus::ClientMetric::Label& label : metric.label)
                                     if (label.name == kDeviceLabel) return answers.Excluded(label.value);
                                   return false;
                                 }),
                  metrics.end());
  }
}

}  // namespace mergewatch
