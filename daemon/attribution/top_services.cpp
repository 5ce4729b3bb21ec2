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

// One pair's services, most requests first, ties by CgroupRef.
PairServices Rank(const DevicePair& pair, std::vector<ServiceShare> all) {
  PairServices out;
  out.pair = pair;
  for (const ServiceShare& s : all) out.requests += s.requests;
  std::sort(all.begin(), all.end(), [](const ServiceShare& a, const ServiceShare& b) {
    return a.requests != b.requests ? a.requests > b.requests : a.cgroup < b.cgroup;
  });
  ServiceShare other;
  other.other = true;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i < kTopServices) {
      out.services.push_back(all[i]);
    } else {
      other.requests += all[i].requests;
    }
  }
  out.services.push_back(other);
  for (ServiceShare& s : out.services) s.share = static_cast<double>(s.requests) / static_cast<double>(out.requests);
  return out;
}

}  // namespace

std::vector<PairServices> TopServices(const ServiceCounters& window, const std::set<DevicePair>& collapsed) {
  // The counters are ordered by pair, so each pair's cgroups are one run of the map.
  std::vector<PairServices> result;
  auto it = window.begin();
  while (it != window.end()) {
    const DevicePair pair = it->first.pair;
    std::vector<ServiceShare> all;
    for (; it != window.end() && it->first.pair == pair; ++it) {
      if (it->second == 0) continue;
      ServiceShare s;
      s.cgroup = it->first.cgroup;
      s.requests = it->second;
      all.push_back(s);
    }
    if (all.empty() || collapsed.count(pair) == 0) continue;
    result.push_back(Rank(pair, std::move(all)));
  }
  return result;
}

}  // namespace mergewatch
