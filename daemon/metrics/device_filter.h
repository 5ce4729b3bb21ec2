// SPDX-License-Identifier: Apache-2.0
// --devices.include / --devices.exclude: which devices get series, by kernel name, with
// node_exporter's semantics (--collector.diskstats.device-include/-exclude): a regular
// expression searched in the name (anchor it with ^...$ to match whole names), the two
// mutually exclusive. Applied to every family at scrape time, by the `device` label: other
// labels naming a device (upper, origin, holder) are left alone, so an excluded dm device
// still shows as the upper of a page on a disk that is not excluded.
#pragma once

#include <prometheus/metric_family.h>

#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

namespace mergewatch {

// ram, zram and floppy devices carry no I/O worth a series. Loop devices do (snaps, containers),
// so unlike node_exporter's default they are kept.
inline constexpr char kDefaultDeviceExclude[] = "^(z?ram|fd)[0-9]+$";

class DeviceFilter {
 public:
  DeviceFilter() = default;  // keeps every device
  // One of include or exclude (the other empty). ECMAScript syntax (\d, [[:alpha:]], (?:...)),
  // close to Go's RE2 that node_exporter's patterns are written in. False with `error` on a bad one.
  static bool Make(const std::string& include, const std::string& exclude, DeviceFilter* filter, std::string* error);
  // The regular expression runs once per name for the filter's lifetime (every scrape asks again
  // for the same few hundred names); thread-safe, as scrapes run on several HTTP workers.
  bool Excluded(const std::string& device) const;
  bool KeepsEveryDevice() const { return !include_ && !exclude_; }
  std::string Describe() const;  // for the start-up log

 private:
  // Names come from sysfs and departed devices; past this many the memo starts again.
  static constexpr size_t kMaxRemembered = 4096;
  struct Memo {
    std::mutex mutex;
    std::unordered_map<std::string, bool> excluded;
  };
  bool Match(const std::string& device) const;

  std::shared_ptr<const std::regex> include_, exclude_;
  std::string include_text_, exclude_text_;
  std::shared_ptr<Memo> memo_ = std::make_shared<Memo>();
};

// Drops every series whose `device` label the filter excludes (families left empty stay, with
// their HELP and TYPE, as a scrape with no such device would have them).
void DropExcludedDevices(const DeviceFilter& filter, std::vector<prometheus::MetricFamily>* families);

}  // namespace mergewatch
