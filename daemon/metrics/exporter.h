// SPDX-License-Identifier: Apache-2.0
// Turns a map snapshot into Prometheus metric families at scrape time.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <linux/types.h>

#include "topology/device_namer.h"
#include "source/snapshot.h"
#include "topology/topology_namer.h"

namespace mergewatch {

// Facts about the daemon itself that an operator needs to trust the numbers.
struct DaemonStatus {
  std::string version;
  std::string kernel_release;
  uint32_t inflight_capacity = 0;
};

// Pure: the same snapshot, names and status always give the same families.
// Devices the namer cannot resolve are left out and counted in
// mergewatch_unresolved_devices; ops that share a label are summed.
std::vector<prometheus::MetricFamily> BuildMetricFamilies(const Snapshot& snapshot, DeviceNamer& namer,
                                                          const DaemonStatus& status);

// Histogram of power-of-two buckets: slot i has upper bound 2^(min_shift+i) / per_unit (1e9
// for nanoseconds -> seconds), the last slot is the overflow that only +Inf covers.
// The bounds are the doubles nearest to the decimal values (2^k ns / 1e9); how they are
// printed is RenderExposition's business (exposition.h).
prometheus::ClientMetric::Histogram Log2Histogram(const __u64* slots, size_t slot_count, uint64_t sum,
                                                  int min_shift, double per_unit);

// The prometheus-cpp Collectable: reads a snapshot per scrape and names its devices with the
// namer `names` hands that scrape. A failed read becomes a metric (and a log line), not a
// failed scrape.
class MetricsCollector final : public prometheus::Collectable {
 public:
  MetricsCollector(SnapshotSource& source, TopologyNames& names, DaemonStatus status);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  SnapshotSource& source_;
  TopologyNames& names_;
  const DaemonStatus status_;
  mutable std::mutex mutex_;
  mutable uint64_t scrape_errors_ = 0;
};

}  // namespace mergewatch
