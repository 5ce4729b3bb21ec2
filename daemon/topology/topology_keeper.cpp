// SPDX-License-Identifier: Apache-2.0
#include "topology/topology_keeper.h"

#include <vector>

#include "log.h"

namespace mergewatch {

TopologyKeeper::TopologyKeeper(std::string sysfs_root, Duration refresh, Clock clock,
                               std::function<bool(const std::string&)> queue_watched)
    : sysfs_root_(std::move(sysfs_root)),
      refresh_(refresh),
      clock_(std::move(clock)),
      queue_watch_(sysfs_root_, std::move(queue_watched)) {
  Rescan();
}

void TopologyKeeper::OnScan(std::function<void(std::shared_ptr<const Topology>)> on_scan) {
  on_scan_ = std::move(on_scan);
  on_scan_(current_);
}

void TopologyKeeper::Rescan() {
  std::vector<std::string> warnings;
  current_ = std::make_shared<const Topology>(Topology::Scan(sysfs_root_, &warnings));
  last_scan_ = clock_();
  queue_watch_.Follow(*current_);
  if (on_scan_) on_scan_(current_);
  for (const std::string& w : warnings) {
    if (reported_warnings_.insert(w).second) LogWarn("sysfs: " + w);
  }
  if (current_->devices().empty() && !reported_empty_) {
    LogWarn("no block devices found under " + sysfs_root_ + "/block: check --path.sysfs");
    reported_empty_ = true;
  }
}

void TopologyKeeper::RefreshIfDue(bool unknown_device_seen) {
  const Duration since = clock_() - last_scan_;
  if (since >= refresh_) {
    LogDebug("rescanning block devices: --topology.refresh-interval elapsed");
    Rescan();
  } else if (const std::string changed = queue_watch_.Changed(*current_); !changed.empty()) {
    LogInfo("queue setting changed: " + changed + "; rescanning block devices");
    Rescan();
  } else if (unknown_device_seen && since >= std::chrono::seconds(1)) {
    LogDebug("rescanning block devices: BPF reported a device the last scan did not show");
    Rescan();
  }
}

}  // namespace mergewatch
