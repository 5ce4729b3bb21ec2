// SPDX-License-Identifier: Apache-2.0
#include "detector/detector.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "source/departed_paths.h"

namespace mergewatch {
namespace {

// Requests of at most 8 sectors (4 KiB): the buckets up to le="4096".
constexpr uint32_t kSmallSlots = 12 - MW_SIZE_MIN_SHIFT + 1;

double Ratio(double part, double whole) { return whole > 0 ? part / whole : 0; }

// What merging would have built per request run: the runs' own bytes where BPF reported runs, else
// estimated from the missed merges (every run starts with a request that was not a missed merge: at
// least as many runs as such heads).
double MergedRequestBytes(uint64_t run_bytes, uint64_t runs, uint64_t missed, uint64_t requests,
                          double mean_request_bytes) {
  if (runs > 0) return Ratio(static_cast<double>(run_bytes), static_cast<double>(runs));
  if (missed == 0) return 0;
  const uint64_t run_heads = requests > missed ? requests - missed : 1;
  return mean_request_bytes * static_cast<double>(requests) / static_cast<double>(run_heads);
}

std::string Percent(double share) {
  char buf[16];
  snprintf(buf, sizeof(buf), "%.0f%%", share * 100);
  return buf;
}

std::string Number(double v, const char* format = "%.0f") {
  char buf[32];
  snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// Counters only grow within a window (resets restart the window in Update()); 0 if not.
uint64_t Sub(uint64_t now, uint64_t then) { return now >= then ? now - then : 0; }

}  // namespace

// An LVM snapshot: a dm device with a -cow layer below it (the uuid suffix LVM gives that layer).
bool IsSnapshot(const BlockDevice* upper, const Topology& topology) {
  if (upper == nullptr || upper->kind != DeviceKind::kDm) return false;
  for (const std::string& slave : upper->slaves)
    if (const BlockDevice* s = topology.FindByName(slave); s != nullptr && s->lvm_layer == "cow") return true;
  return false;
}

uint64_t SplitChunkBytes(const BlockDevice* upper, const Topology& topology, double mean_request_bytes) {
  if (upper == nullptr) return 0;
  if (upper->queue.chunk_bytes > 0) return upper->queue.chunk_bytes;
  if (!IsSnapshot(upper, topology) || mean_request_bytes < 512) return 0;
  // Chunks are powers of two (4 KiB to 512 KiB); a few foreign requests in the window move the mean.
  return uint64_t{1} << static_cast<unsigned>(std::lround(std::log2(mean_request_bytes)));
}

bool ParseDuration(const std::string& text, Duration* out) {
  size_t digits = 0;
  while (digits < text.size() && (isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  if (digits == 0 || digits == text.size()) return false;
  double value;
  try {
    value = std::stod(text.substr(0, digits));
  } catch (const std::exception&) {
    return false;
  }
  const std::string unit = text.substr(digits);
  double seconds_per_unit;
  if (unit == "ms") seconds_per_unit = 1e-3;
  else if (unit == "s") seconds_per_unit = 1;
  else if (unit == "m") seconds_per_unit = 60;
  else if (unit == "h") seconds_per_unit = 3600;
  else return false;
  *out = Duration(static_cast<int64_t>(std::llround(value * seconds_per_unit * 1e9)));
  return true;
}

bool ParseUpperRequirement(const std::string& text, UpperRequirement* out) {
  if (text == "dm") *out = UpperRequirement::kDm;
  else if (text == "any") *out = UpperRequirement::kAny;
  else if (text == "none") *out = UpperRequirement::kNone;
  else return false;
  return true;
}

CollapseDetector::CollapseDetector(CollapsePolicy policy)
    : policy_(std::move(policy)), lower_regex_(policy_.lower_devices, std::regex::extended) {}

bool CollapseDetector::IsCandidate(const BlockDevice& device) const {
  return !device.is_partition && std::regex_search(device.name, lower_regex_) &&
         !(policy_.excluded_device && policy_.excluded_device(device.name));
}

bool CollapseDetector::EligibleUpper(const BlockDevice& device) const {
  switch (policy_.require_upper) {
    case UpperRequirement::kDm: return device.kind == DeviceKind::kDm;
    case UpperRequirement::kAny: return device.kind == DeviceKind::kDm || device.kind == DeviceKind::kMd;
    case UpperRequirement::kNone: return true;
  }
  return false;
}

namespace {

bool AnyDecrease(uint64_t now, uint64_t then) { return now < then; }

}  // namespace

// The snapshot's counts summed per device name (read and write), with the per-pair counts by upper device.
CollapseDetector::Sample CollapseDetector::SampleOf(TimePoint now, const Snapshot& snapshot, const Topology& topology) {
  Sample sample{now, {}};
  // Data of a device's predecessor at the same major:minor (older diskseq) is not its own.
  // A native NVMe multipath path disk's requests count under its head namespace.
  // A path disk that has just left sysfs counts under its head until its keys are retired.
  const auto same_device = [&topology, &snapshot](uint32_t major, uint32_t minor, uint64_t diskseq) {
    return DeviceCountingKey(snapshot, topology, major, minor, diskseq);
  };
  for (const auto& [key, stats] : snapshot.origins) {
    const BlockDevice* device = same_device(key.major, key.minor, key.diskseq);
    const BlockDevice* origin = topology.Find(key.origin_major, key.origin_minor);
    if (device == nullptr || origin == nullptr || (key.op != MW_OP_READ && key.op != MW_OP_WRITE)) continue;
    // A multipath path's requests come remapped from its own head: no stacked device.
    if (origin->name == device->name) continue;
    sample.devices[device->name].origins[origin->name] +=
        PairTotals{stats.requests, stats.request_bytes, stats.missed_merges, stats.missed_merge_runs,
                   stats.missed_merge_run_bytes, stats.merges};
  }
  for (const auto& [key, stats] : snapshot.stats) {
    const BlockDevice* device = same_device(key.major, key.minor, key.diskseq);
    if (device == nullptr) continue;
    Totals& t = sample.devices[device->name];
    // Discards, write zeroes and flushes never merge like this, nor say what merging would build.
    if (key.op != MW_OP_READ && key.op != MW_OP_WRITE) continue;
    for (uint64_t v : stats.bio_size_slots) t.bios += v;
    t.bio_bytes += stats.bio_size_sum_bytes;
    for (uint32_t i = 0; i < MW_SIZE_SLOTS; ++i) {
      t.requests += stats.size_slots[i];
      if (i < kSmallSlots) t.small_requests += stats.size_slots[i];
    }
    t.request_bytes += stats.size_sum_bytes;
    t.missed += stats.missed_merges;
    t.runs += stats.missed_merge_runs;
    t.run_bytes += stats.missed_merge_run_bytes;
    t.back_merges += stats.back_merges;
    t.merges += stats.back_merges + stats.front_merges;
  }
  return sample;
}

void CollapseDetector::RestartWindowsOnReset(const Sample& sample) {
  // A counter that went down (a multipath path disk removed from its head's sums, a device
  // re-created, the BPF maps reloaded): the device's window restarts here. Every older sample
  // takes the new values, so no window spans the reset: the deltas are 0 until new I/O comes,
  // never a lifetime total taken as one window.
  if (samples_.empty()) return;
  const Sample& previous = samples_.back();
  for (const auto& [name, totals] : sample.devices) {
    auto it = previous.devices.find(name);
    if (it == previous.devices.end()) continue;
    const Totals& was = it->second;
    bool reset = AnyDecrease(totals.requests, was.requests) || AnyDecrease(totals.bios, was.bios) ||
                 AnyDecrease(totals.missed, was.missed) || AnyDecrease(totals.runs, was.runs) ||
                 AnyDecrease(totals.merges, was.merges) || AnyDecrease(totals.request_bytes, was.request_bytes);
    for (const auto& [origin, p] : was.origins) {
      auto now_it = totals.origins.find(origin);
      if (now_it == totals.origins.end() || AnyDecrease(now_it->second.requests, p.requests) ||
          AnyDecrease(now_it->second.missed, p.missed) || AnyDecrease(now_it->second.merges, p.merges))
        reset = true;
    }
    if (!reset) continue;
    for (Sample& older : samples_) older.devices[name] = totals;
  }
}

// Each device's counts over the window: the newest sample less the base (the oldest kept).
std::map<std::string, CollapseDetector::Totals> CollapseDetector::WindowDeltas() const {
  const Sample& base = samples_.front();
  const Sample& current = samples_.back();
  std::map<std::string, Totals> deltas;
  for (const auto& [name, totals] : current.devices) {
    auto it = base.devices.find(name);
    const Totals before = it != base.devices.end() ? it->second : Totals{};
    Totals delta{Sub(totals.requests, before.requests), Sub(totals.small_requests, before.small_requests),
                 Sub(totals.request_bytes, before.request_bytes), Sub(totals.missed, before.missed),
                 Sub(totals.back_merges, before.back_merges), Sub(totals.merges, before.merges),
                 Sub(totals.runs, before.runs), Sub(totals.run_bytes, before.run_bytes),
                 Sub(totals.bios, before.bios), Sub(totals.bio_bytes, before.bio_bytes), {}};
    for (const auto& [origin, p] : totals.origins) {
      auto was = before.origins.find(origin);
      const PairTotals b = was != before.origins.end() ? was->second : PairTotals{};
      delta.origins[origin] = PairTotals{Sub(p.requests, b.requests), Sub(p.request_bytes, b.request_bytes),
                                         Sub(p.missed, b.missed),     Sub(p.runs, b.runs),
                                         Sub(p.run_bytes, b.run_bytes), Sub(p.merges, b.merges)};
    }
    deltas[name] = std::move(delta);
  }
  return deltas;
}

void CollapseDetector::UpdateDisk(const std::string& name, const Totals& delta,
                                  const std::map<std::string, Totals>& deltas, TimePoint now, double seconds,
                                  const Topology& topology, std::map<PairKey, DiskState>* next,
                                  std::vector<CollapseEvent>* events) {
  const BlockDevice* device = topology.FindByName(name);
  const Totals& cumulative = samples_.back().devices.at(name);
  if (device == nullptr || !IsCandidate(*device) || cumulative.requests == 0) return;
  // One pair per upper device the disk's requests came from (remap chain), decided on that
  // device's own requests, missed merges, runs and merges.
  // Requests of an upper device the policy does not accept (md under --collapse.require-upper=dm)
  // stay in the rest, with no upper label.
  PairTotals attributed;
  for (const auto& [origin, p] : delta.origins) {
    const BlockDevice* upper = topology.FindByName(origin);
    if (upper == nullptr || !EligibleUpper(*upper)) continue;
    attributed += p;
    Step({name, origin}, now, EvaluatePair(origin, p, delta, seconds, deltas), seconds, topology, next, events);
  }
  // The rest: requests that came down no remap chain (I/O submitted to the disk or a
  // partition). Without any remap data at all (no stacked I/O yet, or a source without
  // remaps) the whole disk, with the upper device guessed from bio sizes.
  const bool remap_data = !cumulative.origins.empty();
  Totals rest = delta;
  rest.origins.clear();
  rest.requests = Sub(delta.requests, attributed.requests);
  rest.small_requests = std::min(delta.small_requests, rest.requests);
  rest.request_bytes = Sub(delta.request_bytes, attributed.request_bytes);
  rest.missed = Sub(delta.missed, attributed.missed);
  rest.runs = Sub(delta.runs, attributed.runs);
  rest.run_bytes = Sub(delta.run_bytes, attributed.run_bytes);
  rest.merges = Sub(delta.merges, attributed.merges);
  rest.back_merges = std::min(delta.back_merges, rest.merges);
  if (remap_data && rest.requests == 0 && !pairs_.count({name, ""})) return;
  CollapseEvidence e = Evaluate(name, rest, seconds, deltas, topology);
  if (remap_data) {
    e.upper.clear();
    e.upper_mean_bio_bytes = 0;
    e.upper_request_share = 0;
    e.upper_by_remap = true;
  }
  Step({name, ""}, now, e, seconds, topology, next, events);
}

std::vector<CollapseEvent> CollapseDetector::Update(TimePoint now, const Snapshot& snapshot,
                                                    const Topology& topology) {
  reduced_ = snapshot.reduced;
  Sample sample = SampleOf(now, snapshot, topology);
  RestartWindowsOnReset(sample);
  samples_.push_back(std::move(sample));
  // Keep the newest sample at or before the window's start as the base of the deltas.
  while (samples_.size() > 2 && samples_[1].time <= now - policy_.window) samples_.pop_front();
  const double seconds = std::chrono::duration<double>(samples_.back().time - samples_.front().time).count();
  const std::map<std::string, Totals> deltas = WindowDeltas();

  std::vector<CollapseEvent> events;
  std::map<PairKey, DiskState> next;
  for (const auto& [name, delta] : deltas) UpdateDisk(name, delta, deltas, now, seconds, topology, &next, &events);
  // A pair that disappeared takes its state with it: nothing stays raised for a ghost.
  for (const auto& [key, state] : pairs_) {
    if (state.raised && !next.count(key))
      events.push_back(
          {false, false, key.first, state.upper, "merge collapse cleared on " + key.first + ": device removed"});
    if (state.split_raised && !next.count(key))
      events.push_back({false, true, key.first, state.upper,
                        "I/O split ticket cleared on " + key.first + " (under " + key.second + "): device removed"});
  }
  pairs_ = std::move(next);
  return events;
}

void CollapseDetector::Step(const PairKey& key, TimePoint now, CollapseEvidence evidence, double seconds,
                            const Topology& topology, std::map<PairKey, DiskState>* next,
                            std::vector<CollapseEvent>* events) {
  const std::string& name = key.first;
  DiskState state = pairs_.count(key) ? pairs_.at(key) : DiskState{};
  state.evidence = std::move(evidence);
  state.condition = seconds > 0 && Condition(state.evidence);
  // The alert's upper label stays put while raised, and otherwise follows the upper
  // device that last showed bios: a label that flips would end one series and start another.
  // Not past what makes the guess void: remap data deciding it, or the device gone (a label
  // naming a removed LV, kept from before any remap, was seen on a disk reused for md RAID0).
  if (!key.second.empty()) {
    state.upper = key.second;
  } else if (!state.raised && (state.evidence.upper_mean_bio_bytes > 0 || state.upper.empty() ||
                               state.evidence.upper_by_remap || topology.FindByName(state.upper) == nullptr)) {
    state.upper = state.evidence.upper;
  }
  if (state.condition) {
    state.has_healthy_since = false;
    if (!state.has_condition_since) {
      state.has_condition_since = true;
      state.condition_since = now;
    }
    if (!state.raised && now - state.condition_since >= policy_.raise_after) {
      state.raised = true;
      if (key.second.empty()) state.upper = state.evidence.upper;
      events->push_back({true, false, name, state.upper, Describe(true, name, state.evidence, topology)});
    }
  } else {
    state.has_condition_since = false;
    if (state.raised) {
      if (!state.has_healthy_since) {
        state.has_healthy_since = true;
        state.healthy_since = now;
      }
      if (now - state.healthy_since >= policy_.clear_after) {
        state.raised = false;
        state.has_healthy_since = false;
        events->push_back({false, false, name, state.upper, Describe(false, name, state.evidence, topology)});
      }
    }
  }
  state.diagnosis = state.condition || state.raised ? Diagnose(name, state.evidence, topology) : Diagnosis{};
  StepSplit(key, now, topology, &state, events);
  (*next)[key] = std::move(state);
}

void CollapseDetector::StepSplit(const PairKey& key, TimePoint now, const Topology& topology, DiskState* state,
                                 std::vector<CollapseEvent>* events) const {
  const std::string& disk = key.first;
  // One cause at a time: a collapse page, or the max_sectors_capped finding, names the cause of the
  // small requests; reduced evidence cannot tell a split from a collapse (the diskstats source sees no
  // missed merges). Each withdraws the ticket at once. Only remap pairs: the upper device is known.
  std::string veto;
  if (state->condition || state->raised) veto = "the merge-collapse page names the cause";
  else if (std::find(split_vetoes_.begin(), split_vetoes_.end(), disk) != split_vetoes_.end())
    veto = "the queue finding max_sectors_capped names the cause";
  else if (state->evidence.reduced || reduced_) veto = "reduced evidence (diskstats source)";
  state->split_condition = veto.empty() && !key.second.empty() && SplitCondition(state->evidence, policy_);
  const std::string where = disk + " (under " + key.second + ")";
  if (state->split_condition) {
    state->has_split_healthy_since = false;
    if (!state->has_split_since) {
      state->has_split_since = true;
      state->split_since = now;
    }
  } else {
    state->has_split_since = false;
    if (state->split_raised && !state->has_split_healthy_since) {
      state->has_split_healthy_since = true;
      state->split_healthy_since = now;
    }
  }
  if (state->split_condition || state->split_raised) {
    state->split_diagnosis = DiagnoseSplit(disk, state->evidence, topology);
    state->split_chunk_bytes =
        SplitChunkBytes(topology.FindByName(key.second), topology, state->evidence.mean_request_bytes);
  } else {
    state->split_diagnosis = Diagnosis{};
    state->split_chunk_bytes = 0;
  }
  const Diagnosis& d = state->split_diagnosis;
  if (!state->split_raised && state->split_condition && now - state->split_since >= policy_.raise_after) {
    state->split_raised = true;
    events->push_back({true, true, disk, key.second,
                       "I/O split on " + where + ": " + d.evidence + ". Cause: " + d.cause + ". Remedy: " + d.remedy});
  } else if (state->split_raised && (!veto.empty() || (state->has_split_healthy_since &&
                                                       now - state->split_healthy_since >= policy_.clear_after))) {
    state->split_raised = false;
    state->has_split_healthy_since = false;
    // The window's evidence now (often an empty window once the reads ended), not the onset's sentence.
    const CollapseEvidence& e = state->evidence;
    events->push_back({false, true, disk, key.second,
                       "I/O split ticket cleared on " + where + (veto.empty() ? "" : " (" + veto + ")") + ": " +
                           Number(e.requests_per_second) + " requests/s, mean request " +
                           Number(e.mean_request_bytes) + " bytes, " + Percent(e.missed_share) + " missed merges, " +
                           Percent(e.merge_share) + " merged"});
  }
}

namespace {

// The window counts both evaluations read their ratios from: the disk's, or one pair's.
struct WindowCounts {
  uint64_t requests, request_bytes, missed, merges, back_merges, runs, run_bytes;
};

void SetShares(const WindowCounts& c, double seconds, CollapseEvidence* e) {
  e->window_seconds = seconds;
  e->requests = c.requests;
  e->requests_per_second = Ratio(static_cast<double>(c.requests), seconds);
  e->missed_share = Ratio(static_cast<double>(c.missed), static_cast<double>(c.requests));
  e->merge_share = Ratio(static_cast<double>(c.merges), static_cast<double>(c.requests + c.merges));
  e->back_merges_per_second = Ratio(static_cast<double>(c.back_merges), seconds);
  // The size each request was made with (block_getrq): what the disk dispatched, unless bios merged
  // into it later, which the merge share then shows.
  e->mean_request_bytes = Ratio(static_cast<double>(c.request_bytes), static_cast<double>(c.requests));
  e->runs_reported = c.runs > 0;
  e->merged_request_bytes = MergedRequestBytes(c.run_bytes, c.runs, c.missed, c.requests, e->mean_request_bytes);
}

}  // namespace

CollapseEvidence CollapseDetector::EvaluatePair(const std::string& origin, const PairTotals& p, const Totals& disk,
                                                double seconds, const std::map<std::string, Totals>& deltas) const {
  CollapseEvidence e;
  // A pair's merges are not told back from front: all of them stand for its back merges.
  SetShares({p.requests, p.request_bytes, p.missed, p.merges, p.merges, p.runs, p.run_bytes}, seconds, &e);
  // Request sizes are not kept per pair: the disk's share of requests of at most 4 KiB (informative only).
  e.small_share = Ratio(static_cast<double>(disk.small_requests), static_cast<double>(disk.requests));
  e.upper = origin;
  auto it = deltas.find(origin);
  if (it != deltas.end())
    e.upper_mean_bio_bytes = Ratio(static_cast<double>(it->second.bio_bytes), static_cast<double>(it->second.bios));
  e.upper_request_share =
      std::min(1.0, Ratio(static_cast<double>(p.requests), static_cast<double>(std::max(disk.requests, p.requests))));
  return e;
}

CollapseEvidence CollapseDetector::Evaluate(const std::string& disk, const Totals& delta, double seconds,
                                            const std::map<std::string, Totals>& deltas,
                                            const Topology& topology) const {
  CollapseEvidence e;
  SetShares({delta.requests, delta.request_bytes, delta.missed, delta.merges, delta.back_merges, delta.runs,
             delta.run_bytes},
            seconds, &e);
  e.small_share = Ratio(static_cast<double>(delta.small_requests), static_cast<double>(delta.requests));
  e.reduced = reduced_;
  if (const BlockDevice* device = topology.FindByName(disk)) {
    e.nomerges = device->queue.nomerges;
    e.max_request_bytes = static_cast<double>(device->queue.max_sectors_kb) * 1024;
    // Merging happens in the paths' queues: the worst path's setting, and the smallest request
    // any path can build (a path's limit may be set lower than its head's by hand).
    double smallest_path_limit = 0;
    for (const std::string& path : device->multipath_paths)
      if (const BlockDevice* p = topology.FindByName(path)) {
        e.nomerges = std::max(e.nomerges, p->queue.nomerges);
        const double limit = static_cast<double>(p->queue.max_sectors_kb) * 1024;
        if (limit > 0 && (smallest_path_limit == 0 || limit < smallest_path_limit)) smallest_path_limit = limit;
      }
    if (smallest_path_limit > 0) e.max_request_bytes = smallest_path_limit;
  }

  // The upper device the disk's requests came from, by the remap chain: the device they
  // were first submitted to (for an LVM snapshot the snapshot itself, not the -real/-cow
  // layers its 4 KiB chunks pass through). Without remapped requests in the window, the
  // upper device whose bios are largest.
  uint64_t best_origin_requests = 0;
  for (const std::string& upper : topology.UpperDevices(disk)) {
    const BlockDevice* device = topology.FindByName(upper);
    if (device == nullptr) continue;
    if (!EligibleUpper(*device)) continue;
    auto it = deltas.find(upper);
    double mean = it != deltas.end() ? Ratio(static_cast<double>(it->second.bio_bytes),
                                             static_cast<double>(it->second.bios))
                                     : 0;
    auto from = delta.origins.find(upper);
    const uint64_t origin_requests = from != delta.origins.end() ? from->second.requests : 0;
    if (origin_requests > 0 || best_origin_requests > 0) {
      if (origin_requests > best_origin_requests) {
        best_origin_requests = origin_requests;
        e.upper = upper;
        e.upper_mean_bio_bytes = mean;
        e.upper_request_share = Ratio(static_cast<double>(origin_requests), static_cast<double>(delta.requests));
      }
      continue;
    }
    // With no bios anywhere (yet), name the top of the stack rather than a layer inside it.
    const bool on_top = device->holders.empty();
    const BlockDevice* chosen = e.upper.empty() ? nullptr : topology.FindByName(e.upper);
    if (e.upper.empty() || mean > e.upper_mean_bio_bytes ||
        (mean == e.upper_mean_bio_bytes && on_top && chosen != nullptr && !chosen->holders.empty())) {
      e.upper = upper;
      e.upper_mean_bio_bytes = mean;
    }
  }
  return e;
}

bool ReducedCondition(const CollapseEvidence& e, const CollapsePolicy& policy) {
  if (e.requests_per_second < policy.min_requests_per_second || e.mean_request_bytes <= 0) return false;
  if (e.merge_share > policy.max_merge_share) return false;
  const bool upper_is_larger =
      e.upper_mean_bio_bytes > 0 && e.upper_mean_bio_bytes >= policy.min_upper_size_ratio * e.mean_request_bytes;
  const bool merging_off_small = e.nomerges == 2 && e.max_request_bytes > 0 &&
                                 e.mean_request_bytes * policy.min_run_size_ratio <= e.max_request_bytes;
  if (!upper_is_larger && !merging_off_small) return false;
  return policy.require_upper == UpperRequirement::kNone || !e.upper.empty();
}

bool SplitCondition(const CollapseEvidence& e, const CollapsePolicy& policy) {
  if (e.reduced || e.upper.empty() || e.mean_request_bytes <= 0) return false;
  if (e.requests_per_second < policy.min_requests_per_second) return false;
  // Merging could not rejoin them: about no missed merges (a contiguous predecessor still mergeable)
  // and about no merges. With either, the collapse detector or the kernel has the pieces.
  if (e.missed_share > policy.max_merge_share || e.merge_share > policy.max_merge_share) return false;
  if (e.mean_request_bytes >= policy.split_max_piece_bytes) return false;
  return e.upper_mean_bio_bytes > 0 && e.upper_mean_bio_bytes >= policy.min_upper_size_ratio * e.mean_request_bytes;
}

bool CollapseDetector::Condition(const CollapseEvidence& e) const {
  if (e.reduced) return ReducedCondition(e, policy_);
  if (e.requests_per_second < policy_.min_requests_per_second) return false;
  if (e.missed_share < policy_.min_missed_share) return false;
  if (e.merge_share > policy_.max_merge_share) return false;
  // The harm is many requests where merging would have built few large ones, whatever the
  // size of each: relative, so 8 and 16 KiB snapshot chunks count like 4 KiB ones, and
  // requests already near the queue limits (runs capped there) never do.
  if (e.merged_request_bytes < policy_.min_run_size_ratio * e.mean_request_bytes || e.mean_request_bytes <= 0)
    return false;
  const bool upper_is_larger =
      e.upper_mean_bio_bytes >= policy_.min_upper_size_ratio * e.mean_request_bytes && e.upper_mean_bio_bytes > 0;
  if (policy_.require_upper != UpperRequirement::kNone) return !e.upper.empty() && upper_is_larger;
  // Without a required upper device, a stacked one that shows its bios still has to be larger.
  return e.upper_mean_bio_bytes == 0 || upper_is_larger;
}

CollapseDetector::Diagnosis CollapseDetector::Diagnose(const std::string& disk, const CollapseEvidence& e,
                                                      const Topology& topology) const {
  const BlockDevice* device = topology.FindByName(disk);
  int nomerges = device != nullptr ? device->queue.nomerges : -1;
  // A native NVMe multipath head is bio-based: merging happens in its path disks' queues,
  // so theirs are the nomerges that matter (the same value on all, or the worst one).
  std::vector<std::string> queues{disk};
  if (device != nullptr && !device->multipath_paths.empty()) {
    queues = device->multipath_paths;
    nomerges = -1;
    for (const std::string& path : queues) {
      const BlockDevice* p = topology.FindByName(path);
      if (p != nullptr) nomerges = std::max(nomerges, p->queue.nomerges);
    }
  }
  std::string evidence = e.reduced ? Number(e.requests_per_second) + " requests/s, " + Percent(e.merge_share) +
                                        " merged, mean request " + Number(e.mean_request_bytes) +
                                        " bytes (diskstats: reduced evidence, per-request sizes and missed "
                                        "merges unseen)"
                                  : Number(e.requests_per_second) + " requests/s, " + Percent(e.missed_share) +
                         " missed merges, " + Number(e.back_merges_per_second, "%.1f") +
                         " back merges/s, mean request " + Number(e.mean_request_bytes) +
                         " bytes where merging would have built " + Number(e.merged_request_bytes) + " (" +
                         (e.runs_reported ? "contiguous runs" : "estimated from the missed share") + "), " +
                         Percent(e.small_share) + " at most 4 KiB";
  if (!e.upper.empty() && e.upper_request_share > 0)
    evidence += ", " + Percent(e.upper_request_share) + " of them remapped from " + e.upper;
  if (!e.upper.empty() && e.upper_mean_bio_bytes > 0)
    evidence += e.reduced ? ", " + e.upper + "'s own diskstats: mean I/O " + Number(e.upper_mean_bio_bytes) + " bytes"
                          : ", " + e.upper + " receives " + Number(e.upper_mean_bio_bytes) + "-byte bios";
  std::string where = disk + (e.upper.empty() ? "" : " (under " + e.upper + ")");
  if (queues.size() > 1 || queues[0] != disk) {
    where += " (multipath paths";
    for (const std::string& q : queues) where += " " + q;
    where += ")";
  }
  std::string queue_names;
  for (const std::string& q : queues) queue_names += (queue_names.empty() ? "" : ",") + q;
  // One source for cause and remedy: the onset line, /status and `mergewatch status` all read it.
  const BlockDevice* lower = topology.FindByName(queues[0]);
  const Remedy r = CollapseRemedy({queues, nomerges, lower != nullptr ? lower->queue.scheduler : "", e.upper,
                                   e.mean_request_bytes});
  return {where, evidence, r.cause, r.remedy, "; nomerges=" + std::to_string(nomerges) + " on " + queue_names};
}

std::string CollapseDetector::Describe(bool onset, const std::string& disk, const CollapseEvidence& e,
                                       const Topology& topology) const {
  const Diagnosis d = Diagnose(disk, e, topology);
  if (!onset) return "merge collapse cleared on " + d.where + ": " + d.evidence + d.cleared_suffix;
  return "merge collapse on " + d.where + ": " + d.evidence + ". Cause: " + d.cause + ". Remedy: " + d.remedy;
}

// The split ticket's words: the evidence, the piece size against the upper device's chunk as sysfs shows it
// (no dm ioctl: the unit's own privileges), and the remedy for that kind of device.
CollapseDetector::Diagnosis CollapseDetector::DiagnoseSplit(const std::string& disk, const CollapseEvidence& e,
                                                           const Topology& topology) const {
  Diagnosis d;
  d.where = disk + " (under " + e.upper + ")";
  d.evidence = e.upper + " receives " + Number(e.upper_mean_bio_bytes) + "-byte bios, " + disk + " gets them as " +
               Number(e.mean_request_bytes) + "-byte requests (" +
               Number(Ratio(e.upper_mean_bio_bytes, e.mean_request_bytes), "%.0f") + " times smaller), " +
               Number(e.requests_per_second) + " requests/s, " + Percent(e.missed_share) + " missed merges, " +
               Percent(e.merge_share) + " merged: each piece was issued before the next existed, so no merge "
               "setting joins them";
  const BlockDevice* upper = topology.FindByName(e.upper);
  const bool snapshot = IsSnapshot(upper, topology);
  const uint64_t chunk = SplitChunkBytes(upper, topology, e.mean_request_bytes);
  const std::string piece = Number(e.mean_request_bytes) + "-byte pieces";
  if (upper != nullptr && upper->kind == DeviceKind::kMd) {
    d.cause = e.upper + " cuts its bios into " + piece + "; its chunk is " + Number(static_cast<double>(chunk)) +
              " bytes (md/chunk_size)";
    d.remedy = "a larger chunk on " + e.upper + " (mdadm --grow /dev/" + e.upper +
               " --chunk=512, or recreate it with a larger --chunk)";
  } else if (snapshot) {
    // The chunk size is in the snapshot's table only (a dm ioctl, beyond the unit's privileges): a
    // snapshot cuts reads at its chunks, so the piece size seen at the disk is it.
    d.cause = e.upper + " cuts its bios into " + piece + "; its chunk is " + Number(static_cast<double>(chunk)) +
              " bytes (the piece size seen at the disk: an LVM snapshot cuts each read at its chunks)";
    d.remedy = "recreate the snapshot with larger chunks (lvcreate -s -c 64k or larger), or use a thin snapshot; "
               "nomerges and the scheduler cannot join these pieces";
  } else {
    d.cause = e.upper + " cuts its bios into " + piece +
              (chunk > 0 ? "; its chunk is " + Number(static_cast<double>(chunk)) + " bytes (queue/chunk_sectors)"
                         : std::string("; sysfs shows no chunk size for it"));
    d.remedy = "a larger chunk or stripe size on " + e.upper + "; nomerges and the scheduler cannot join these pieces";
  }
  return d;
}

Remedy CollapseRemedy(const RemedyInput& in) {
  std::string names, paths;
  for (const std::string& q : in.queues) {
    names += (names.empty() ? "" : ",") + q;
    paths += (paths.empty() ? "" : " ") + ("/sys/block/" + q + "/queue/nomerges");
  }
  const std::string set_zero =
      in.queues.size() == 1 ? "echo 0 > " + paths : "for q in " + paths + "; do echo 0 > $q; done";
  Remedy r;
  if (in.nomerges == 2) {
    // blk_queue_nomerges(): no plug merge, no software-queue merge, no scheduler merge.
    r.cause = "nomerges=2 on " + names + " (the block layer attempts no merge at all)";
    r.remedy = set_zero;
    if (!in.upper.empty() && in.mean_request_bytes > 0)
      r.remedy += " (" + in.upper + " cuts its bios into " + Number(in.mean_request_bytes) +
                  "-byte pieces, its chunk or stripe size; merging joins them again at the disk)";
  } else if (in.nomerges == 1) {
    // QUEUE_FLAG_NOXMERGES: elv_merge() skips the scheduler's hash lookup and tries only its one-hit
    // last_merge; the plug still merges. The misses counted here are those lookups.
    r.cause = "nomerges=1 on " + names +
              " (the I/O scheduler looks up no merge candidate but its last one, elv_merge(): the contiguous "
              "requests it did not look up are the missed merges)";
    r.remedy = set_zero;
  } else if (in.nomerges == 0 && in.scheduler == "kyber") {
    r.cause = "the kyber scheduler on " + names +
              " merges a bio only with requests in the submitting CPU's software queue (kyber_bio_merge()): "
              "contiguous I/O submitted from several CPUs stays unmerged";
    r.remedy = "echo mq-deadline > /sys/block/" + in.queues[0] + "/queue/scheduler (or none)";
  } else if (in.nomerges == 0 && in.scheduler == "bfq") {
    r.cause = "the bfq scheduler on " + names +
              " refuses merges across its per-process queues (bfq_allow_bio_merge()): contiguous I/O from several "
              "processes or cgroups stays unmerged";
    r.remedy = "echo mq-deadline > /sys/block/" + in.queues[0] + "/queue/scheduler (or none)";
  } else if (in.nomerges == 0) {
    // Bios split by the block layer carry REQ_NOMERGE and are never counted as missed merges here
    // (merge_rules.h refuses them), so a split is never the cause of this page.
    r.cause = "nomerges=0 on " + names +
              " allows merging, yet contiguous mergeable requests went down separately in one plug or scheduler "
              "queue; on Linux 6.13 to 6.15 without the stable fix \"block: use plug request list tail for "
              "one-shot backmerge attempt\" the plug tries its oldest request only (e70c301faece)";
    r.remedy = "update the kernel to one with that fix (6.16, or a 6.12/6.15 stable release carrying it); "
               "nomerges and the scheduler are not the cause";
  } else {
    r.cause = "could not read " + paths;
    r.remedy = "check " + paths;
  }
  return r;
}

std::vector<DiskVerdict> CollapseDetector::Verdicts() const {
  std::vector<DiskVerdict> out;
  std::map<PairKey, size_t> labels;  // one series per (device, upper) label pair
  for (const auto& [key, state] : pairs_) {
    DiskVerdict v;
    v.device = key.first;
    v.condition = state.condition;
    v.raised = state.raised;
    v.upper = state.upper;
    v.evidence = state.evidence;
    v.evidence_text = state.diagnosis.evidence;
    v.cause = state.diagnosis.cause;
    v.remedy = state.diagnosis.remedy;
    v.split_condition = state.split_condition;
    v.split_raised = state.split_raised;
    v.split_chunk_bytes = state.split_chunk_bytes;
    v.split_evidence_text = state.split_diagnosis.evidence;
    v.split_cause = state.split_diagnosis.cause;
    v.split_remedy = state.split_diagnosis.remedy;
    auto [it, fresh] = labels.emplace(PairKey{v.device, v.upper}, out.size());
    if (fresh) {
      out.push_back(std::move(v));
    } else if (!key.second.empty() || v.raised) {  // a guessed label met a remap pair: the pair wins
      out[it->second] = std::move(v);
    }
  }
  std::sort(out.begin(), out.end(), [](const DiskVerdict& a, const DiskVerdict& b) {
    return std::tie(a.device, a.upper) < std::tie(b.device, b.upper);
  });
  return out;
}

}  // namespace mergewatch
