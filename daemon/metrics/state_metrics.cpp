// SPDX-License-Identifier: Apache-2.0
#include "metrics/state_metrics.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "metrics/exposition.h"
#include "metrics/metric_names.h"

namespace mergewatch {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily GaugeFamily(const std::string& name, const std::string& help) {
  MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = MetricType::Gauge;
  return family;
}

void AddGauge(MetricFamily* family, std::vector<ClientMetric::Label> labels, double value) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.gauge.value = value;
  family->metric.push_back(std::move(metric));
}

// A braced list of families would be copied, every series with it.
std::vector<MetricFamily> Moved(std::initializer_list<MetricFamily*> families) {
  std::vector<MetricFamily> out;
  out.reserve(families.size());
  for (MetricFamily* f : families) out.push_back(std::move(*f));
  return out;
}

}  // namespace

std::vector<MetricFamily> TopologyFamilies(const Topology& topology) {
  MetricFamily info = GaugeFamily(metric_names::kDeviceInfo,
                                  "Block device from sysfs: kind (nvme, scsi, virtio, loop, dm, md, other), whole "
                                  "disk, dm name and LVM volume group/volume/layer where present. Always 1.");
  MetricFamily holders = GaugeFamily(metric_names::kDeviceHolderInfo,
                                     "Stacking edge: holder is built on device (sysfs holders/). Always 1.");
  MetricFamily nomerges = GaugeFamily(metric_names::kQueueNomerges,
                                      "queue/nomerges: 0 all merges, 1 simple merges only, 2 no merging at all.");
  MetricFamily max_sectors = GaugeFamily(metric_names::kQueueMaxSectorsBytes,
                                         "queue/max_sectors_kb in bytes: the largest request merging may build.");
  MetricFamily max_segments = GaugeFamily("mergewatch_queue_max_segments", "queue/max_segments.");
  MetricFamily rotational = GaugeFamily(metric_names::kQueueRotational, "queue/rotational: 1 for spinning disks.");
  MetricFamily scheduler = GaugeFamily(metric_names::kQueueSchedulerInfo, "The active I/O scheduler. Always 1.");
  MetricFamily elevators = GaugeFamily("mergewatch_queue_schedulers_available",
                                       "Schedulers queue/scheduler lists other than none (built in or loaded): 0 means "
                                       "no elevator can be chosen without loading a module.");
  MetricFamily device_class = GaugeFamily("mergewatch_device_class_info",
                                          "Device class of a request-based whole disk, for kernel cohorts: rotational "
                                          "(queue/rotational 1), nvme (non-rotational NVMe), non_rotational (any other). "
                                          "Always 1.");

  for (MetricFamily* f : {&info, &nomerges, &max_sectors, &max_segments, &rotational, &scheduler})
    f->metric.reserve(topology.devices().size());
  for (const BlockDevice& d : topology.devices()) {
    AddGauge(&info,
             {{"device", d.name},
              {"kind", DeviceKindName(d.kind)},
              {"disk", d.disk},
              {"dm_name", d.dm_name},
              {"lvm_vg", d.lvm_vg},
              {"lvm_lv", d.lvm_lv},
              {"lvm_layer", d.lvm_layer}},
             1);
    for (const std::string& holder : d.holders) AddGauge(&holders, {{"device", d.name}, {"holder", holder}}, 1);
    if (d.is_partition) continue;  // queue settings belong to the whole disk
    if (d.queue.nomerges >= 0) AddGauge(&nomerges, {{"device", d.name}}, d.queue.nomerges);
    if (d.queue.max_sectors_kb > 0)
      AddGauge(&max_sectors, {{"device", d.name}}, static_cast<double>(d.queue.max_sectors_kb) * 1024);
    if (d.queue.max_segments > 0) AddGauge(&max_segments, {{"device", d.name}}, d.queue.max_segments);
    if (d.queue.rotational >= 0) AddGauge(&rotational, {{"device", d.name}}, d.queue.rotational);
    if (!d.queue.scheduler.empty())
      AddGauge(&scheduler, {{"device", d.name}, {"scheduler", d.queue.scheduler}}, 1);
    if (d.request_based && !d.queue.available_schedulers.empty()) {
      const auto& names = d.queue.available_schedulers;
      AddGauge(&elevators, {{"device", d.name}},
               static_cast<double>(names.size() - std::count(names.begin(), names.end(), "none")));
    }
    if (const char* cls = DeviceClassName(d)) AddGauge(&device_class, {{"device", d.name}, {"class", cls}}, 1);
  }
  return Moved({&info, &holders, &nomerges, &max_sectors, &max_segments, &rotational, &scheduler, &elevators,
                &device_class});
}

std::vector<MetricFamily> FindingFamilies(const std::vector<QueueFinding>& findings) {
  MetricFamily finding = GaugeFamily(
      "mergewatch_queue_config_finding",
      "1 while a queue setting that hurts holds on a request-based disk (absent otherwise): "
      "rotational_without_scheduler, merging_disabled_under_stack, max_sectors_capped. The log says the "
      "evidence and the remedy; docs/runbook.md has a section per finding.");
  for (const QueueFinding& f : findings) AddGauge(&finding, {{"device", f.device}, {"finding", f.finding}}, 1);
  return Moved({&finding});
}

std::vector<MetricFamily> CollapseFamilies(const std::vector<DiskVerdict>& verdicts) {
  MetricFamily collapse = GaugeFamily(
      metric_names::kMergeCollapse,
      "1 while the disk dispatches small requests one by one that could have been merged (after "
      "--collapse.raise-after), 0 otherwise. upper is the stacked device the disk's requests came from "
      "(block_bio_remap), else the one with the largest bios, or empty.");
  MetricFamily condition = GaugeFamily("mergewatch_collapse_condition",
                                       "1 while the collapse pattern holds over the current window, before hysteresis.");
  MetricFamily rate = GaugeFamily("mergewatch_collapse_requests_per_second",
                                  "Read and write requests dispatched per second over the detector window.");
  MetricFamily small = GaugeFamily("mergewatch_collapse_small_request_ratio",
                                   "Share of dispatched requests of at most 4 KiB (8 sectors) over the window.");
  MetricFamily missed = GaugeFamily("mergewatch_collapse_missed_merge_ratio",
                                    "Share of dispatched requests that were missed merges over the window.");
  MetricFamily merges = GaugeFamily("mergewatch_collapse_back_merges_per_second",
                                    "Bios back-merged per second over the window.");
  MetricFamily lower = GaugeFamily("mergewatch_collapse_lower_request_bytes",
                                   "Mean size of the requests the disk dispatched over the window.");
  MetricFamily merged = GaugeFamily("mergewatch_collapse_merged_request_bytes",
                                    "Mean size merging would have built over the window: the contiguous runs the "
                                    "missed merges formed (0 without missed merges).");
  MetricFamily upper = GaugeFamily("mergewatch_collapse_upper_bio_bytes",
                                   "Mean size of the bios the upper device received over the window.");
  MetricFamily upper_share = GaugeFamily("mergewatch_collapse_upper_request_ratio",
                                         "Share of the disk's requests over the window that were remapped from "
                                         "the upper device (block_bio_remap chain).");
  MetricFamily services = GaugeFamily(
      "mergewatch_collapse_service_request_ratio",
      "While the pair's collapse condition holds: the share of its requests over the window from each of its top "
      "3 cgroups (the submitting task's for reads and direct I/O, the bio's blkcg for page-cache writes with the "
      "io controller on; \"writeback\", \"kernel\", or \"\" on a cgroup v1 host) and \"other\" for the rest. "
      "Absent otherwise.");
  for (MetricFamily* f : {&collapse, &condition, &rate, &small, &missed, &merges, &lower, &merged})
    f->metric.reserve(verdicts.size());
  for (const DiskVerdict& v : verdicts) {
    const CollapseEvidence& e = v.evidence;
    // Every evidence gauge carries the pair's labels: the evidence is decided per (disk, upper device).
    const std::vector<ClientMetric::Label> pair = {{"device", v.device}, {"upper", v.upper}};
    AddGauge(&collapse, pair, v.raised ? 1 : 0);
    AddGauge(&condition, pair, v.condition ? 1 : 0);
    AddGauge(&rate, pair, e.requests_per_second);
    AddGauge(&small, pair, e.small_share);
    AddGauge(&missed, pair, e.missed_share);
    AddGauge(&merges, pair, e.back_merges_per_second);
    AddGauge(&lower, pair, e.mean_request_bytes);
    AddGauge(&merged, pair, e.merged_request_bytes);
    if (!v.upper.empty()) {
      AddGauge(&upper, pair, e.upper_mean_bio_bytes);
      AddGauge(&upper_share, pair, e.upper_request_share);
    }
    for (const ServiceShare& s : v.services)
      AddGauge(&services, {{"device", v.device}, {"upper", v.upper}, {"cgroup", s.cgroup}}, s.share);
  }
  return Moved(
      {&collapse, &condition, &rate, &small, &missed, &merges, &lower, &merged, &upper, &upper_share, &services});
}

std::vector<MetricFamily> SplitFamilies(const std::vector<DiskVerdict>& verdicts) {
  MetricFamily split = GaugeFamily(
      "mergewatch_io_split_finding",
      "1 while the upper device's bios reach the disk cut into pieces several times smaller that no merge "
      "setting can join (after --collapse.raise-after; absent otherwise): a ticket, not a page. The log and "
      "/status say the piece size, the upper device's chunk and the remedy; docs/runbook.md has a section.");
  for (const DiskVerdict& v : verdicts)
    if (v.split_raised) AddGauge(&split, {{"device", v.device}, {"upper", v.upper}}, 1);
  return Moved({&split});
}

void StateCollector::PublishFindings(std::vector<QueueFinding> findings) {
  std::lock_guard<std::mutex> lock(mutex_);
  findings_ = std::move(findings);
}

void StateCollector::Publish(std::shared_ptr<const Topology> topology, std::vector<DiskVerdict> verdicts) {
  std::lock_guard<std::mutex> lock(mutex_);
  topology_ = std::move(topology);
  verdicts_ = std::move(verdicts);
}

std::vector<DiskVerdict> StateCollector::Verdicts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return verdicts_;
}

std::vector<QueueFinding> StateCollector::Findings() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return findings_;
}

std::vector<MetricFamily> StateCollector::Collect() const {
  std::vector<DiskVerdict> verdicts;
  std::vector<QueueFinding> findings;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    verdicts = verdicts_;
    findings = findings_;
  }
  std::vector<MetricFamily> families = FindingFamilies(findings);
  std::vector<MetricFamily> collapse = CollapseFamilies(verdicts);
  families.reserve(families.size() + collapse.size());
  for (MetricFamily& f : collapse) families.push_back(std::move(f));
  for (MetricFamily& f : SplitFamilies(verdicts)) families.push_back(std::move(f));
  return families;
}

std::shared_ptr<const std::string> StateCollector::TopologyText() const {
  std::shared_ptr<const Topology> topology;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    topology = topology_;
  }
  std::lock_guard<std::mutex> lock(rendered_mutex_);
  if (topology != rendered_topology_) {  // topology_ is never null: the first call renders
    std::vector<MetricFamily> families = TopologyFamilies(*topology);
    DropExcludedDevices(devices_, &families);
    std::string text;
    ExpositionWriter().Write(families, &text);
    rendered_text_ = std::make_shared<const std::string>(std::move(text));
    rendered_topology_ = std::move(topology);
  }
  return rendered_text_;
}

}  // namespace mergewatch
