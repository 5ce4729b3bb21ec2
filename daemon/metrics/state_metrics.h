// SPDX-License-Identifier: Apache-2.0
// Metrics about what the daemon derives rather than counts: the block topology from
// sysfs and the merge-collapse verdicts. Both are published by the main loop and read
// by scrapes.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <memory>
#include <mutex>
#include <vector>

#include "detector/detector.h"
#include "findings/queue_findings.h"
#include "metrics/device_filter.h"
#include "topology/topology.h"

namespace mergewatch {

// Pure: device info, stacking edges and queue settings of every device.
std::vector<prometheus::MetricFamily> TopologyFamilies(const Topology& topology);

// Pure: mergewatch_queue_config_finding, one series of value 1 per finding that holds.
std::vector<prometheus::MetricFamily> FindingFamilies(const std::vector<QueueFinding>& findings);

// Pure: mergewatch_merge_collapse and its evidence, one series per candidate disk.
std::vector<prometheus::MetricFamily> CollapseFamilies(const std::vector<DiskVerdict>& verdicts);
// mergewatch_io_split_finding{device,upper}: 1 per pair whose split ticket is raised, absent otherwise.
std::vector<prometheus::MetricFamily> SplitFamilies(const std::vector<DiskVerdict>& verdicts);

// Collect() gives the verdicts' and findings' families, which change every tick. The topology's
// families change only with a rescan (minutes apart, or on a device or queue change) and are a
// fifth of a scrape's series: TopologyText() renders them once per published topology.
class StateCollector final : public prometheus::Collectable {
 public:
  explicit StateCollector(DeviceFilter devices = {}) : devices_(std::move(devices)) {}
  void Publish(std::shared_ptr<const Topology> topology, std::vector<DiskVerdict> verdicts);
  // The findings of the latest topology scan (published by the scan, not by every tick).
  void PublishFindings(std::vector<QueueFinding> findings);
  std::vector<prometheus::MetricFamily> Collect() const override;
  // TopologyFamilies() of the topology last published, the filter's excluded devices dropped, as
  // exposition text: the same object until a new topology is published.
  std::shared_ptr<const std::string> TopologyText() const;
  // The verdicts last published (for /status).
  std::vector<DiskVerdict> Verdicts() const;
  // The findings last published (for /status).
  std::vector<QueueFinding> Findings() const;

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const Topology> topology_ = std::make_shared<Topology>();
  std::vector<DiskVerdict> verdicts_;
  std::vector<QueueFinding> findings_;
  const DeviceFilter devices_;
  mutable std::mutex rendered_mutex_;  // one scrape renders a new topology; the others wait for it
  mutable std::shared_ptr<const Topology> rendered_topology_;
  mutable std::shared_ptr<const std::string> rendered_text_;
};

}  // namespace mergewatch
