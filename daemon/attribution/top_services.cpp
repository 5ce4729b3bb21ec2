// SPDX-License-Identifier: Apache-2.0
#include "attribution/top_services.h"

#include <algorithm>

namespace mergewatch {

ServiceCounters ServiceWindow::Advance(const ServiceCounters& now) {
  ServiceCounters window;
  if (primed_) {
    for (const auto& [key, value] : now) {
      auto last = last_.find(key);
      const uint64_t delta = last == last_.end() || value < last->second ? value : value - last->second;
      if (delta > 0) window[key] = delta;
    }
  }
  last_ = now;
  primed_ = true;
  return window;
}

namespace {

// One pair's services (requests per label), most requests first, ties by label.
PairServices Rank(const DevicePair& pair, const std::map<std::string, uint64_t>& per_label) {
  PairServices out;
  out.pair = pair;
  std::vector<ServiceShare> all;
  for (const auto& [cgroup, requests] : per_label) {
    ServiceShare s;
    s.cgroup = cgroup;
    s.requests = requests;
    all.push_back(std::move(s));
    out.requests += requests;
  }
  // The map is in label order, so a stable sort by requests alone breaks ties by label.
  std::stable_sort(all.begin(), all.end(),
                   [](const ServiceShare& a, const ServiceShare& b) { return a.requests > b.requests; });
  ServiceShare other;
  other.other = true;
  other.cgroup = kOtherCgroup;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i < kTopServices) {
      out.services.push_back(std::move(all[i]));
    } else {
      other.requests += all[i].requests;
    }
  }
  out.services.push_back(std::move(other));
  for (ServiceShare& s : out.services) s.share = static_cast<double>(s.requests) / static_cast<double>(out.requests);
  return out;
}

}  // namespace

std::vector<PairServices> TopServices(const ServiceCounters& window, const std::set<DevicePair>& collapsed,
                                      const CgroupLabeler& label) {
  // The counters are ordered by pair, so each pair's cgroups are one run of the map.
  std::vector<PairServices> result;
  auto it = window.begin();
  while (it != window.end()) {
    const DevicePair pair = it->first.pair;
    const bool wanted = collapsed.count(pair) > 0;
    std::map<std::string, uint64_t> per_label;
    for (; it != window.end() && it->first.pair == pair; ++it) {
      if (wanted && it->second > 0) per_label[label(it->first.cgroup)] += it->second;
    }
    if (!per_label.empty()) result.push_back(Rank(pair, per_label));
  }
  return result;
}

}  // namespace mergewatch
