// SPDX-License-Identifier: Apache-2.0
#include "device_view.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "metrics/metric_names.h"

namespace mergewatch::cli {
namespace {

namespace names = mergewatch::metric_names;

const std::string kBucket = "_bucket", kCount = "_count", kSum = "_sum";

// name is family + suffix?
bool Is(const std::string& name, const char* family, const std::string& suffix = "") {
  const size_t n = std::char_traits<char>::length(family);
  return name.size() == n + suffix.size() && name.compare(0, n, family) == 0 && name.compare(n, std::string::npos, suffix) == 0;
}

// Folds one sample of a histogram family into h; true when it was one.
bool AddHistogramSample(const Sample& s, const char* family, Histogram* h) {
  if (Is(s.name, family, kBucket)) {
    const std::string& le = s.Label("le");
    double bound;
    if (le == "+Inf") bound = HUGE_VAL;
    else {
      char* end = nullptr;
      bound = std::strtod(le.c_str(), &end);
      if (le.empty() || end != le.c_str() + le.size()) return true;  // a bucket without a bound: skipped
    }
    h->cumulative[bound] += s.value;
    return true;
  }
  if (Is(s.name, family, kCount)) {
    h->count += s.value;
    return true;
  }
  if (Is(s.name, family, kSum)) {
    h->sum += s.value;
    return true;
  }
  return false;
}

double Rate(double before, double after, double seconds) {
  if (seconds <= 0) return 0;
  return (after >= before ? after - before : after) / seconds;
}

double Delta(double before, double after) { return after >= before ? after - before : after; }

// A volume's view, by its origin label; false for any other family.
bool ReadVolumeSample(const Sample& s, Counters* volume) {
  if (Is(s.name, names::kRemappedDispatchedRequestsTotal)) {
    volume->volume_requests += s.value;
    return true;
  }
  if (Is(s.name, names::kRemappedDispatchedBytesTotal)) {
    volume->volume_bytes += s.value;
    return true;
  }
  return AddHistogramSample(s, names::kRemappedRequestLatencySeconds, &volume->volume_latency);
}

}  // namespace

ScrapeFacts ReadScrape(const std::vector<Sample>& samples) {
  ScrapeFacts facts;
  auto device = [&facts](const std::string& name) -> DeviceFacts& {
    DeviceFacts& d = facts.devices[name];
    if (d.name.empty()) {
      d.name = name;
      d.disk = name;
    }
    return d;
  };
  for (const Sample& s : samples) {
    if (s.name.compare(0, 11, "mergewatch_") != 0) continue;
    const std::string& name = s.Label("device");
    if (Is(s.name, names::kBuildInfo)) {
      facts.version = s.Label("version");
      continue;
    }
    if (name.empty()) continue;
    if (Is(s.name, names::kDeviceInfo)) {
      DeviceFacts& d = device(name);
      d.kind = s.Label("kind");
      if (!s.Label("disk").empty()) d.disk = s.Label("disk");
      d.dm_name = s.Label("dm_name");
    } else if (Is(s.name, names::kDeviceHolderInfo)) {
      device(name).holders.push_back(s.Label("holder"));
      device(s.Label("holder"));
    } else if (Is(s.name, names::kQueueNomerges)) {
      device(name).queue.nomerges = static_cast<int>(s.value);
    } else if (Is(s.name, names::kQueueMaxSectorsBytes)) {
      device(name).queue.max_sectors_kb = s.value / 1024;
    } else if (Is(s.name, names::kQueueRotational)) {
      device(name).queue.rotational = static_cast<int>(s.value);
    } else if (Is(s.name, names::kQueueSchedulerInfo)) {
      if (s.value == 1) device(name).queue.scheduler = s.Label("scheduler");
    } else if (Is(s.name, names::kMergeCollapse)) {
      if (s.value == 1) facts.collapsed[name] = s.Label("upper");
    } else if (Is(s.name, names::kBioMergesTotal)) {
      DeviceFacts& d = device(name);
      (s.Label("kind") == "front" ? d.counters.front_merges : d.counters.back_merges) += s.value;
      d.has_series = true;
    } else if (Is(s.name, names::kMissedMergesTotal)) {
      device(name).counters.missed_merges += s.value;
    } else if (!s.Label("origin").empty() && ReadVolumeSample(s, &device(s.Label("origin")).counters)) {
      continue;
    } else {
      DeviceFacts& d = device(name);
      if (AddHistogramSample(s, names::kRequestSizeBytes, &d.counters.request_size) ||
          AddHistogramSample(s, names::kRequestLatencySeconds, &d.counters.latency) ||
          AddHistogramSample(s, names::kBioSizeBytes, &d.counters.bio_size)) {
        d.has_series = true;
      } else if (d.kind.empty() && d.holders.empty() && !d.has_series && d.queue.nomerges < 0) {
        facts.devices.erase(name);  // a family this command does not read made no device
      }
    }
  }
  return facts;
}

Histogram Delta(const Histogram& before, const Histogram& after) {
  if (after.count < before.count) return after;  // reset
  Histogram d;
  d.count = after.count - before.count;
  d.sum = after.sum - before.sum;
  for (const auto& [bound, count] : after.cumulative) {
    auto it = before.cumulative.find(bound);
    d.cumulative[bound] = count - (it != before.cumulative.end() ? it->second : 0);
  }
  return d;
}

double Quantile(const Histogram& delta, double q) {
  if (delta.count <= 0 || delta.cumulative.empty()) return NAN;
  if (!std::isfinite(delta.cumulative.begin()->first)) return NAN;  // only +Inf: no shape known
  const double rank = q * delta.count;
  double lower = 0, below = 0, highest_finite = 0;
  for (const auto& [bound, cumulative] : delta.cumulative) {
    if (!std::isfinite(bound)) return highest_finite;
    highest_finite = bound;
    if (cumulative >= rank && cumulative > below) return lower + (bound - lower) * (rank - below) / (cumulative - below);
    lower = bound;
    below = cumulative;
  }
  return highest_finite;
}

std::vector<std::pair<double, double>> Shares(const Histogram& delta) {
  std::vector<std::pair<double, double>> out;
  if (delta.count <= 0) return out;
  double below = 0;
  for (const auto& [bound, cumulative] : delta.cumulative) {
    if (cumulative > below) out.emplace_back(bound, (cumulative - below) / delta.count);
    below = cumulative;
  }
  return out;
}

namespace {

// Children in lsblk's sense: partitions of a disk, then the devices built on it.
struct DeviceGraph {
  std::map<std::string, std::vector<std::string>> children;
  std::set<std::string> has_parent;
};

DeviceGraph GraphOf(const ScrapeFacts& after) {
  DeviceGraph g;
  for (const auto& [name, d] : after.devices) {
    if (d.disk != name && after.devices.count(d.disk)) {
      g.children[d.disk].push_back(name);
      g.has_parent.insert(name);
    }
  }
  for (const auto& [name, d] : after.devices) {
    for (const std::string& holder : d.holders) {
      if (!after.devices.count(holder)) continue;
      g.children[name].push_back(holder);
      g.has_parent.insert(holder);
    }
  }
  for (auto& [name, list] : g.children) {
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
  }
  return g;
}

// The devices a verdict or a finding names.
struct Marks {
  std::set<std::string> active, pending, flagged;
};

Marks MarksOf(const View& view) {
  Marks m;
  for (const Verdict& v : view.verdicts) {
    if (v.active) m.active.insert(v.device);
    else if (v.state == "pending") m.pending.insert(v.device);
  }
  for (const Finding& f : view.findings) m.flagged.insert(f.device);
  return m;
}

// A daemon without /status: the collapse gauge is all there is.
std::vector<Verdict> VerdictsFromGauge(const ScrapeFacts& after) {
  std::vector<Verdict> verdicts;
  for (const auto& [device, upper] : after.collapsed) {
    Verdict v;
    v.kind = "merge_collapse";
    v.device = device;
    v.upper = upper;
    v.state = "collapsed";
    v.active = true;
    verdicts.push_back(v);
  }
  return verdicts;
}

DeviceRow MakeRow(const std::string& name, const std::string& prefix, const ScrapeFacts& before,
                  const ScrapeFacts& after, double seconds, const Marks& marks) {
  const DeviceFacts& a = after.devices.at(name);
  auto b_it = before.devices.find(name);
  const DeviceFacts b = b_it != before.devices.end() ? b_it->second : DeviceFacts{};
  DeviceRow r;
  r.name = name;
  r.kind = a.kind;
  r.dm_name = a.dm_name;
  r.tree_prefix = prefix;
  r.holders = a.holders;
  r.queue = a.queue;
  r.before = b.counters;
  r.after = a.counters;
  const Histogram sizes = Delta(b.counters.request_size, a.counters.request_size);
  const Histogram bios = Delta(b.counters.bio_size, a.counters.bio_size);
  const Histogram latency = Delta(b.counters.latency, a.counters.latency);
  r.request_based = !a.counters.request_size.cumulative.empty() || a.counters.request_size.count > 0;
  r.bio_based = !a.counters.bio_size.cumulative.empty() || a.counters.bio_size.count > 0;
  r.requests_per_second = seconds > 0 ? sizes.count / seconds : 0;
  r.mean_request_bytes = sizes.count > 0 ? sizes.sum / sizes.count : NAN;
  r.bios_per_second = seconds > 0 ? bios.count / seconds : 0;
  r.mean_bio_bytes = bios.count > 0 ? bios.sum / bios.count : NAN;
  r.merges_per_second = Rate(b.counters.back_merges + b.counters.front_merges,
                             a.counters.back_merges + a.counters.front_merges, seconds);
  r.missed_merges_per_second = Rate(b.counters.missed_merges, a.counters.missed_merges, seconds);
  r.missed_merge_ratio =
      sizes.count > 0 ? std::min(1.0, Delta(b.counters.missed_merges, a.counters.missed_merges) / sizes.count) : 0;
  r.latency_p50_seconds = Quantile(latency, 0.5);
  r.latency_p99_seconds = Quantile(latency, 0.99);
  if (!r.request_based && a.counters.volume_requests > 0) {
    const double requests = Delta(b.counters.volume_requests, a.counters.volume_requests);
    const Histogram volume_latency = Delta(b.counters.volume_latency, a.counters.volume_latency);
    r.volume = true;
    r.requests_per_second = seconds > 0 ? requests / seconds : 0;
    r.mean_request_bytes = requests > 0 ? Delta(b.counters.volume_bytes, a.counters.volume_bytes) / requests : NAN;
    r.latency_p50_seconds = Quantile(volume_latency, 0.5);
    r.latency_p99_seconds = Quantile(volume_latency, 0.99);
  }
  r.request_sizes = Shares(sizes);
  r.bio_sizes = Shares(bios);
  r.collapsed = marks.active.count(name) > 0;
  r.pending = marks.pending.count(name) > 0;
  r.finding = marks.flagged.count(name) > 0;
  return r;
}

}  // namespace

View BuildView(const ScrapeFacts& before, const ScrapeFacts& after, double seconds, const StatusDoc& status,
               bool all) {
  View view;
  view.seconds = seconds;
  view.version = !status.version.empty() ? status.version : after.version;
  view.verdicts = status.served ? status.verdicts : VerdictsFromGauge(after);
  view.findings = status.findings;
  const DeviceGraph graph = GraphOf(after);
  const Marks marks = MarksOf(view);

  // Whether a subtree holds anything worth showing (depth-capped: sysfs cannot loop, a hostile
  // scrape can).
  std::function<bool(const std::string&, int)> interesting = [&](const std::string& name, int depth) {
    if (depth > 16) return false;
    const DeviceFacts& d = after.devices.at(name);
    if (d.has_series || marks.active.count(name) || marks.pending.count(name) || marks.flagged.count(name))
      return true;
    auto it = graph.children.find(name);
    if (it == graph.children.end()) return false;
    for (const std::string& c : it->second)
      if (interesting(c, depth + 1)) return true;
    return false;
  };

  // lsblk's drawing: each level adds "├─" or "└─", and "│ " or "  " below it.
  std::function<void(const std::string&, const std::string&, const std::string&, int)> walk =
      [&](const std::string& name, const std::string& prefix, const std::string& indent, int depth) {
        view.tree.push_back(MakeRow(name, prefix, before, after, seconds, marks));
        if (depth > 16) return;
        auto it = graph.children.find(name);
        if (it == graph.children.end()) return;
        std::vector<std::string> shown;
        for (const std::string& c : it->second)
          if (all || interesting(c, depth + 1) || interesting(name, depth)) shown.push_back(c);
        for (size_t i = 0; i < shown.size(); ++i) {
          const bool last = i + 1 == shown.size();
          walk(shown[i], indent + (last ? "└─" : "├─"), indent + (last ? "  " : "│ "), depth + 1);
        }
      };
  for (const auto& [name, d] : after.devices) {
    if (graph.has_parent.count(name)) continue;
    if (all || interesting(name, 0)) walk(name, "", "", 0);
  }
  return view;
}

int ExitStatusOf(const View& view) {
  for (const Verdict& v : view.verdicts)
    if (v.active) return 1;
  return view.findings.empty() ? 0 : 3;
}

}  // namespace mergewatch::cli
