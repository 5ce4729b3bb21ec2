// SPDX-License-Identifier: Apache-2.0
#include "metrics/exporter.h"

#include <array>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "metrics/metric_names.h"
#include "topology/block_ids.h"
#include "log.h"

namespace mergewatch {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(const std::string& name, const std::string& help, MetricType type) {
  MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

ClientMetric Labeled(std::vector<ClientMetric::Label> labels) {
  ClientMetric metric;
  metric.label = std::move(labels);
  return metric;
}

ClientMetric GaugeValue(std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric metric = Labeled(std::move(labels));
  metric.gauge.value = value;
  return metric;
}

ClientMetric CounterValue(std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric metric = Labeled(std::move(labels));
  metric.counter.value = value;
  return metric;
}

constexpr double kNanosecondsPerSecond = 1e9;

const char* const kCounterNames[MW_CNT_MAX] = {"inflight_map_full",    "device_map_full", "complete_without_issue",
                                               "request_without_disk", "origin_map_full", "complete_not_seen",
                                               "flush",                "passthrough"};

// One sysfs lookup per device and scrape, however many ops and origins it has.
class ScrapeNames {
 public:
  explicit ScrapeNames(DeviceNamer& namer) : namer_(namer) {}
  std::optional<std::string> Of(uint32_t major, uint32_t minor, uint64_t diskseq) {
    auto key = std::make_tuple(major, minor, diskseq);
    auto it = memo_.find(key);
    if (it == memo_.end()) it = memo_.emplace(key, namer_.NameOf(major, minor, diskseq)).first;
    return it->second;
  }

 private:
  DeviceNamer& namer_;
  std::map<std::tuple<uint32_t, uint32_t, uint64_t>, std::optional<std::string>> memo_;
};

}  // namespace

namespace {

// The upper bounds of the slots but the last, computed once per scrape for all histograms of a kind.
std::vector<double> Log2Bounds(size_t slot_count, int min_shift, double per_unit) {
  std::vector<double> bounds;
  bounds.reserve(slot_count - 1);
  for (size_t i = 0; i + 1 < slot_count; ++i) bounds.push_back(std::ldexp(1.0, min_shift + static_cast<int>(i)) / per_unit);
  return bounds;
}

// slots has bounds.size() + 1 entries.
void FillLog2Histogram(const __u64* slots, const std::vector<double>& bounds, uint64_t sum, double per_unit,
                       ClientMetric::Histogram* histogram) {
  histogram->bucket.resize(bounds.size());
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cumulative += slots[i];
    histogram->bucket[i] = {cumulative, bounds[i]};
  }
  // The serializer appends le="+Inf" = sample_count; it includes the overflow slot.
  histogram->sample_count = cumulative + slots[bounds.size()];
  histogram->sample_sum = static_cast<double>(sum) / per_unit;
}

}  // namespace

ClientMetric::Histogram Log2Histogram(const __u64* slots, size_t slot_count, uint64_t sum, int min_shift,
                                      double per_unit) {
  ClientMetric::Histogram histogram;
  FillLog2Histogram(slots, Log2Bounds(slot_count, min_shift, per_unit), sum, per_unit, &histogram);
  return histogram;
}

namespace {

// The per-device families: one series per (device, op) each, built from the summed stats.
struct DeviceFamilies {
  MetricFamily size, latency, queue_latency, bio_size, merges, missed, missed_runs, missed_run_bytes, latency_lost;
  MetricFamily timed_by, untimed;
};

DeviceFamilies MakeDeviceFamilies(bool reduced) {
  DeviceFamilies f;
  f.size = Family(metric_names::kRequestSizeBytes,
                             "Size of each request dispatched to the driver (block_rq_issue).",
                             MetricType::Histogram);
  if (reduced)
    f.size.help = "Requests completed and their bytes (diskstats: count and sum exact, per-request sizes unseen, so "
                "only le=\"+Inf\").";
  f.latency = Family(metric_names::kRequestLatencySeconds,
                                "Device time of each request, from dispatch (block_rq_issue) to its final completion.",
                                MetricType::Histogram);
  f.queue_latency =
      Family("mergewatch_request_queue_latency_seconds",
             "Time from scheduler insert (block_rq_insert) to dispatch; only requests that were inserted.",
             MetricType::Histogram);
  f.bio_size = Family(metric_names::kBioSizeBytes,
                                 "Size of each bio a bio-based device (dm, md) received (block_bio_queue).",
                                 MetricType::Histogram);
  f.merges = Family(metric_names::kBioMergesTotal,
                               "Bios merged into an existing request (block_bio_backmerge/frontmerge).",
                               MetricType::Counter);
  f.missed = Family(metric_names::kMissedMergesTotal,
                               "New requests for bios the kernel could have back-merged and did not: contiguous with the "
                               "newest request of the same queue in the submitting task's plug, or with a request in the "
                               "I/O scheduler, and mergeable by the kernel's rules (flags, cgroup, priority, limits).",
                               MetricType::Counter);
  f.missed_runs = Family("mergewatch_missed_merge_runs_total",
                                    "Runs of contiguous mergeable bios (one plug or scheduler queue) that held at "
                                    "least one missed merge: the requests merging would have built.",
                                    MetricType::Counter);
  f.missed_run_bytes = Family("mergewatch_missed_merge_run_bytes_total",
                                         "Bytes of those runs, each capped by the queue limits: divided by "
                                         "mergewatch_missed_merge_runs_total, the request size merging would have built.",
                                         MetricType::Counter);

  f.latency_lost =
      Family("mergewatch_request_latency_lost_total",
             "Requests of mergewatch_request_size_bytes whose latency sample was lost, by reason: inflight_map_full "
             "(no in-flight slot at dispatch), complete_not_seen (dispatched again, or its slot taken over after "
             "60 s, with no completion seen: the kernel ran no completion program for it); both are the in-flight "
             "table's (queues with an I/O scheduler). Once I/O stops, the request count equals the latency count "
             "plus these plus mergewatch_request_latency_untimed.",
             MetricType::Counter);
  f.timed_by = Family("mergewatch_request_latency_timed_total",
                      "Latency samples of mergewatch_request_latency_seconds by the clock that timed them: "
                      "kernel_stamp (the kernel's dispatch stamp, rq->io_start_time_ns, where it is within 1 us of "
                      "the dispatch), dispatch_clock (the dispatch's own clock, stored without a read), "
                      "inflight_table (the in-flight table: queues with an I/O scheduler).",
                      MetricType::Counter);
  f.untimed = Family("mergewatch_request_latency_untimed",
                     "Requests of mergewatch_request_size_bytes neither timed, nor in "
                     "mergewatch_request_latency_lost_total, nor in flight (/sys/block/X/inflight): completions no "
                     "program saw, derived at each read. Exact once I/O stops; while it runs, off by the requests "
                     "that completed during the read.",
                     MetricType::Gauge);

  return f;
}

// (device, op label) -> summed stats; std::map keeps the output order stable.
using StatsByLabel = std::map<std::pair<std::string, std::string>, mw_dev_stats>;
// device name -> the kernel's requests in flight {reads, writes}, over the disks counting under it.
using InFlightByName = std::map<std::string, std::array<uint64_t, 2>>;

// The untimed figure of one series: the direction's requests in flight are not lost (an op label that
// is not "read" writes: rq_data_dir() of write, discard and write zeroes alike). Subtracting the whole
// direction from each of its op labels may say 0 too soon while I/O runs, never too much at rest.
uint64_t UntimedNotInFlight(const mw_dev_stats& stats, const std::string& op_label, const InFlightByName& in_flight,
                            const std::string& device) {
  const uint64_t untimed = UntimedRequests(stats);
  const auto it = in_flight.find(device);
  if (it == in_flight.end()) return untimed;
  const uint64_t flying = it->second[op_label == "read" ? 0 : 1];
  return untimed > flying ? untimed - flying : 0;
}

void AddDeviceSeries(const StatsByLabel& by_label, bool reduced, const InFlightByName& in_flight,
                     DeviceFamilies* f) {
  // Every series is built in place in its family's vector, which never grows past its first
  // allocation; the bounds are the same for every histogram of a kind.
  for (MetricFamily* family :
       {&f->size, &f->latency, &f->queue_latency, &f->bio_size, &f->missed, &f->missed_runs, &f->missed_run_bytes})
    family->metric.reserve(by_label.size());
  f->merges.metric.reserve(2 * by_label.size());
  f->latency_lost.metric.reserve(2 * by_label.size());
  f->timed_by.metric.reserve(3 * by_label.size());
  f->untimed.metric.reserve(by_label.size());
  const std::vector<double> size_bounds = Log2Bounds(MW_SIZE_SLOTS, MW_SIZE_MIN_SHIFT, 1.0);
  const std::vector<double> latency_bounds = Log2Bounds(MW_LAT_SLOTS, MW_LAT_MIN_SHIFT, kNanosecondsPerSecond);
  const auto add = [](MetricFamily* family, const std::vector<ClientMetric::Label>& labels) -> ClientMetric& {
    family->metric.emplace_back();
    family->metric.back().label = labels;
    return family->metric.back();
  };
  std::vector<ClientMetric::Label> base(2), with_kind(3), with_reason(3), with_clock(3);
  base[0].name = with_kind[0].name = with_reason[0].name = with_clock[0].name = "device";
  base[1].name = with_kind[1].name = with_reason[1].name = with_clock[1].name = "op";
  with_kind[2].name = "kind";
  with_reason[2].name = "reason";
  with_clock[2].name = "clock";
  for (const auto& [labels, stats] : by_label) {
    base[0].value = with_kind[0].value = with_reason[0].value = with_clock[0].value = labels.first;
    base[1].value = with_kind[1].value = with_reason[1].value = with_clock[1].value = labels.second;
    uint64_t issued = 0, bios = 0;
    for (uint64_t v : stats.size_slots) issued += v;
    for (uint64_t v : stats.bio_size_slots) bios += v;

    // Reduced evidence (diskstats): count and sum exact under le="+Inf" only, merges without
    // back/front, nothing it cannot see (latency, missed merges, runs; a dm device's own diskstats
    // count its split pieces on 6.1, not the bios it received: no mergewatch_bio_size_bytes).
    if (reduced) {
      if (issued > 0) {
        ClientMetric::Histogram& h = add(&f->size, base).histogram;
        h.sample_count = issued;
        h.sample_sum = static_cast<double>(stats.size_sum_bytes);
        with_kind[2].value = "all";
        add(&f->merges, with_kind).counter.value = static_cast<double>(stats.back_merges + stats.front_merges);
      }
      continue;
    }
    // Request-based devices have dispatches; bio-based ones only bios. Emit what the device has.
    if (issued > 0) {
      FillLog2Histogram(stats.size_slots, size_bounds, stats.size_sum_bytes, 1.0, &add(&f->size, base).histogram);
      FillLog2Histogram(stats.latency_slots, latency_bounds, stats.latency_sum_ns, kNanosecondsPerSecond,
                        &add(&f->latency, base).histogram);
      // Only requests that went through block_rq_insert have a queue time: with the none
      // scheduler that is almost none, and 30 empty series per device are not worth a scrape.
      uint64_t queued = 0;
      for (uint64_t v : stats.queue_latency_slots) queued += v;
      if (queued > 0)
        FillLog2Histogram(stats.queue_latency_slots, latency_bounds, stats.queue_latency_sum_ns,
                          kNanosecondsPerSecond, &add(&f->queue_latency, base).histogram);
      add(&f->missed, base).counter.value = static_cast<double>(stats.missed_merges);
      add(&f->missed_runs, base).counter.value = static_cast<double>(stats.missed_merge_runs);
      add(&f->missed_run_bytes, base).counter.value = static_cast<double>(stats.missed_merge_run_bytes);
      with_reason[2].value = "inflight_map_full";
      add(&f->latency_lost, with_reason).counter.value = static_cast<double>(stats.latency_lost_inflight_full);
      with_reason[2].value = "complete_not_seen";
      add(&f->latency_lost, with_reason).counter.value = static_cast<double>(stats.latency_lost_not_seen);
      with_clock[2].value = "kernel_stamp";
      add(&f->timed_by, with_clock).counter.value = static_cast<double>(stats.timed_kernel_stamp);
      with_clock[2].value = "dispatch_clock";
      add(&f->timed_by, with_clock).counter.value = static_cast<double>(stats.timed_dispatch_clock);
      with_clock[2].value = "inflight_table";
      add(&f->timed_by, with_clock).counter.value = static_cast<double>(stats.timed_inflight_table);
      add(&f->untimed, base).gauge.value =
          static_cast<double>(UntimedNotInFlight(stats, labels.second, in_flight, labels.first));
    }
    if (issued > 0 || stats.back_merges > 0 || stats.front_merges > 0) {
      with_kind[2].value = "back";
      add(&f->merges, with_kind).counter.value = static_cast<double>(stats.back_merges);
      with_kind[2].value = "front";
      add(&f->merges, with_kind).counter.value = static_cast<double>(stats.front_merges);
    }
    if (bios > 0)
      FillLog2Histogram(stats.bio_size_slots, size_bounds, stats.bio_size_sum_bytes, 1.0,
                        &add(&f->bio_size, base).histogram);
  }

}

// mergewatch_remapped_requests_total and _missed_merges_total, by (device, origin, op), and the volume's
// own view beside them: its requests and bytes as dispatched and their device latency.
template <typename NameOf>
std::vector<MetricFamily> RemapFamilies(const Snapshot& snapshot, ScrapeNames& names, const NameOf& name_of) {
  MetricFamily remapped = Family("mergewatch_remapped_requests_total",
                                 "Requests created at the device for bios first submitted to origin, a device "
                                 "stacked above it (block_bio_remap chain): which dm/md device its requests come from.",
                                 MetricType::Counter);
  MetricFamily remapped_missed = Family("mergewatch_remapped_missed_merges_total",
                                        "Of mergewatch_remapped_requests_total, the requests that were missed merges.",
                                        MetricType::Counter);
  MetricFamily dispatched = Family(
      metric_names::kRemappedDispatchedRequestsTotal,
      "Requests dispatched to the device (block_rq_issue) whose first bio came from origin: the volume's "
      "requests. Over a device's origins they sum to its mergewatch_request_size_bytes_count for stacked I/O.",
      MetricType::Counter);
  MetricFamily dispatched_bytes = Family(metric_names::kRemappedDispatchedBytesTotal,
                                         "Bytes of mergewatch_remapped_dispatched_requests_total at dispatch: the "
                                         "volume's mean request size is their ratio.",
                                         MetricType::Counter);
  MetricFamily latency = Family(metric_names::kRemappedRequestLatencySeconds,
                                "Device time (dispatch to completion) of the requests whose first bio came from "
                                "origin: the volume's latency at the device, in mergewatch_request_latency_seconds' "
                                "buckets.",
                                MetricType::Histogram);
  std::map<std::tuple<std::string, std::string, std::string>, mw_origin_stats> by_origin;
  for (const auto& [key, stats] : snapshot.origins) {
    std::optional<std::string> device = name_of(key.major, key.minor, key.diskseq);
    std::optional<std::string> origin = names.Of(key.origin_major, key.origin_minor, 0);
    // A multipath path's requests come remapped from its own head, under whose name they
    // already count: that is no stacked device, and "origin = device" would say nothing.
    if (!device || !origin || *device == *origin) continue;
    AccumulateOrigin(stats, &by_origin[{*device, *origin, OpLabel(key.op)}]);
  }
  const std::vector<double> latency_bounds = Log2Bounds(MW_LAT_SLOTS, MW_LAT_MIN_SHIFT, kNanosecondsPerSecond);
  for (const auto& [labels, stats] : by_origin) {
    std::vector<ClientMetric::Label> l = {
        {"device", std::get<0>(labels)}, {"origin", std::get<1>(labels)}, {"op", std::get<2>(labels)}};
    remapped.metric.push_back(CounterValue(l, static_cast<double>(stats.requests)));
    remapped_missed.metric.push_back(CounterValue(l, static_cast<double>(stats.missed_merges)));
    dispatched.metric.push_back(CounterValue(l, static_cast<double>(stats.dispatched)));
    dispatched_bytes.metric.push_back(CounterValue(l, static_cast<double>(stats.dispatched_bytes)));
    ClientMetric volume;
    volume.label = l;
    FillLog2Histogram(stats.latency_slots, latency_bounds, stats.latency_sum_ns, kNanosecondsPerSecond,
                      &volume.histogram);
    latency.metric.push_back(std::move(volume));
  }

  std::vector<MetricFamily> out;
  for (MetricFamily* f : {&remapped, &remapped_missed, &dispatched, &dispatched_bytes, &latency})
    out.push_back(std::move(*f));
  return out;
}

// What the daemon says of itself and its programs: build info, attached programs, dropped events,
// non-I/O requests, the in-flight capacity, devices it could not name.
std::vector<MetricFamily> DaemonFamilies(const Snapshot& snapshot, const DaemonStatus& status, size_t unresolved) {
  MetricFamily build = Family(metric_names::kBuildInfo, "Version of mergewatchd and the kernel it runs on.",
                              MetricType::Gauge);
  build.metric.push_back(GaugeValue({{"version", status.version}, {"kernel", status.kernel_release}}, 1));

  MetricFamily programs = Family("mergewatch_bpf_program_attached",
                                 "1 if the BPF program on this tracepoint is attached, 0 if attaching failed or it "
                                 "is not needed now (block_bio_queue: no dm/md device stacked); mode is tp_btf or "
                                 "raw_tp.",
                                 MetricType::Gauge);
  for (const ProgramStatus& p : snapshot.programs)
    programs.metric.push_back(GaugeValue({{"tracepoint", p.tracepoint}, {"mode", p.mode}}, p.attached ? 1 : 0));

  MetricFamily events = Family("mergewatch_bpf_events_dropped_total",
                               "Events the BPF programs could not account, by reason. complete_without_issue counts "
                               "data completions whose dispatch was not seen (requests in flight when the daemon "
                               "started); complete_not_seen counts requests dispatched again with no completion seen since "
                               "(the kernel did not run the completion program); program_nested counts runs the kernel "
                               "skipped because the same program was "
                               "already running on that CPU (an interrupt's completion on top of another); flushes and "
                               "passthrough commands are not in it.",
                               MetricType::Counter);
  for (int i = 0; i < MW_CNT_FIRST_NOT_LOST && !snapshot.reduced; ++i)
    events.metric.push_back(
        CounterValue({{"reason", kCounterNames[i]}}, static_cast<double>(snapshot.event_counts[i])));
  if (!snapshot.reduced)
    events.metric.push_back(
        CounterValue({{"reason", "program_nested"}}, static_cast<double>(snapshot.nested_runs_skipped)));
  MetricFamily not_io = Family("mergewatch_non_io_requests_total",
                               "Requests dispatched that are not block I/O and are in no size or latency histogram: "
                               "flush (REQ_OP_FLUSH, empty flushes and the flush sequences of FUA/PREFLUSH writes), "
                               "passthrough (SG_IO, NVMe admin and ioctl commands).",
                               MetricType::Counter);
  for (int i = MW_CNT_FIRST_NOT_LOST; i < MW_CNT_MAX; ++i)
    if (!snapshot.reduced || i == MW_CNT_FLUSH)  // diskstats counts flushes, never passthrough
      not_io.metric.push_back(CounterValue({{"kind", kCounterNames[i]}}, static_cast<double>(snapshot.event_counts[i])));

  MetricFamily capacity = Family("mergewatch_bpf_inflight_capacity",
                                 "Slots of the in-flight table (--bpf.inflight-entries rounded up to a power of two); "
                                 "each request may use one of two, a request finding both busy is not counted (inflight_map_full).",
                                 MetricType::Gauge);
  if (!snapshot.reduced) capacity.metric.push_back(GaugeValue({}, status.inflight_capacity));

  MetricFamily unresolved_family = Family("mergewatch_unresolved_devices",
                                          "Devices with BPF data but no entry in sysfs now (removed, or a wrong "
                                          "--path.sysfs); their series are not exported.",
                                          MetricType::Gauge);
  unresolved_family.metric.push_back(GaugeValue({}, static_cast<double>(unresolved)));

  std::vector<MetricFamily> out;
  out.reserve(6);
  for (MetricFamily* f : {&build, &programs, &events, &not_io, &capacity, &unresolved_family})
    out.push_back(std::move(*f));
  return out;
}

}  // namespace

std::vector<MetricFamily> BuildMetricFamilies(const Snapshot& snapshot, DeviceNamer& namer,
                                              const DaemonStatus& status) {
  StatsByLabel by_label;
  std::map<std::pair<uint32_t, uint32_t>, bool> unresolved;
  ScrapeNames names(namer);
  // A path disk that has just left sysfs counts under its head until its keys are retired.
  const auto name_of = [&names, &snapshot](uint32_t major, uint32_t minor, uint64_t diskseq) {
    return CountingDevice(snapshot, major, minor, diskseq,
                          [&names](uint32_t ma, uint32_t mi, uint64_t seq) { return names.Of(ma, mi, seq); });
  };
  for (const auto& [key, stats] : snapshot.stats) {
    std::optional<std::string> name = name_of(key.major, key.minor, key.diskseq);
    if (!name) {
      unresolved[{key.major, key.minor}] = true;
      continue;
    }
    auto [it, inserted] = by_label.try_emplace({*name, OpLabel(key.op)}, mw_dev_stats{});
    AccumulateStats(stats, &it->second);
  }
  InFlightByName in_flight;
  for (const auto& [disk, counts] : snapshot.in_flight) {
    std::optional<std::string> name = name_of(disk.major, disk.minor, disk.diskseq);
    if (!name) continue;
    std::array<uint64_t, 2>& sum = in_flight[*name];
    sum[0] += counts[0];
    sum[1] += counts[1];
  }
  DeviceFamilies device = MakeDeviceFamilies(snapshot.reduced);
  AddDeviceSeries(by_label, snapshot.reduced, in_flight, &device);
  std::vector<MetricFamily> remap = RemapFamilies(snapshot, names, name_of);
  std::vector<MetricFamily> own = DaemonFamilies(snapshot, status, unresolved.size());

  std::vector<MetricFamily> families;
  families.reserve(18);  // and the collector's scrape errors
  for (MetricFamily* f : {&device.size, &device.latency, &device.latency_lost, &device.timed_by, &device.untimed,
                          &device.queue_latency,
                          &device.bio_size, &device.merges, &device.missed, &device.missed_runs,
                          &device.missed_run_bytes})
    families.push_back(std::move(*f));
  for (MetricFamily& f : remap) families.push_back(std::move(f));
  for (MetricFamily& f : own) families.push_back(std::move(f));
  return families;
}

MetricsCollector::MetricsCollector(SnapshotSource& source, TopologyNames& names, DaemonStatus status)
    : source_(source), names_(names), status_(std::move(status)) {}

std::vector<MetricFamily> MetricsCollector::Collect() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<MetricFamily> families;
  try {
    const Snapshot snapshot = source_.Read();
    // Decided after the map read, the slow part: as close to the names' use as it can be.
    TopologyNamer namer = names_.ForScrape();
    families = BuildMetricFamilies(snapshot, namer, status_);
  } catch (const std::exception& e) {
    ++scrape_errors_;
    LogError(std::string("scrape failed: ") + e.what());
    families.clear();
  }
  MetricFamily errors = Family("mergewatch_scrape_errors_total",
                               "Scrapes that failed to read the BPF maps; the log says why.", MetricType::Counter);
  errors.metric.push_back(CounterValue({}, static_cast<double>(scrape_errors_)));
  families.push_back(std::move(errors));
  return families;
}

}  // namespace mergewatch
