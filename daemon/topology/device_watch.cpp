// SPDX-License-Identifier: Apache-2.0
#include "topology/device_watch.h"

#include <poll.h>

#include "log.h"

namespace mergewatch {

DeviceWatch::DeviceWatch() : planner_(kEventQuiet, kEventMaxDelay) {
  std::string error;
  source_ = DeviceEventSource::Open(&error);
  if (source_) {
    LogInfo("watching block device uevents (receive buffer " + std::to_string(source_->receive_buffer_bytes()) +
            " bytes)");
  } else {
    LogWarn("no device events (" + error + "): new and removed devices are seen only at the periodic rescan "
            "(--topology.refresh-interval), on SIGHUP and when BPF reports an unknown device");
  }
}

bool DeviceWatch::Unread() const {
  pollfd p{fd(), POLLIN, 0};
  return poll(&p, 1, 0) != 0;  // an error of poll() itself counts as unread: sysfs is always right
}

void DeviceWatch::OnReadable(TimePoint now, TopologyNames* names, const TopologyKeeper& topology) {
  names->Distrust();
  const DrainResult drained = source_->Drain();
  if (drained.overrun) LogWarn("device events lost (netlink receive buffer overran): rescanning every block device");
  planner_.Add(drained, now);
  names->Publish(topology.current(), planner_.pending());
}

}  // namespace mergewatch
