// SPDX-License-Identifier: Apache-2.0
#include "topology/topology_namer.h"

namespace mergewatch {

const std::string* ExactTopologyName(const Topology& topology, uint32_t major, uint32_t minor, uint64_t diskseq) {
  if (diskseq == 0) return nullptr;
  const BlockDevice* device = topology.Find(major, minor);
  if (device == nullptr || device->hidden || device->is_partition || !device->multipath_head.empty() ||
      device->diskseq != diskseq)
    return nullptr;
  return &device->name;
}

std::optional<std::string> TopologyNamer::NameOf(uint32_t major, uint32_t minor, uint64_t diskseq) {
  if (topology_ != nullptr) {
    if (const std::string* name = ExactTopologyName(*topology_, major, minor, diskseq)) return *name;
  }
  return fallback_.NameOf(major, minor, diskseq);
}

void TopologyNames::Distrust() {
  std::lock_guard<std::mutex> lock(mutex_);
  trusted_ = false;
}

void TopologyNames::Publish(std::shared_ptr<const Topology> topology, bool rescan_pending) {
  std::lock_guard<std::mutex> lock(mutex_);
  topology_ = std::move(topology);
  trusted_ = events_unread_ && !rescan_pending;
}

// Why a trusted topology never names a key wrongly, and a removed device still leaves /metrics
// within 1 s, although a uevent can arrive at any moment of the scrape:
// - The order. The main loop clears `trusted_` before it reads the socket (Distrust), and the
//   scrape looks at the socket before it reads `trusted_`. A block event queued before the
//   scrape's poll() is either still unread (the poll sees it) or already being read, and then
//   `trusted_` was cleared before: either way this scrape asks sysfs. `trusted_` is set again
//   only by a Publish after the rescan that followed the event (the kernel updates sysfs before
//   it sends the event: device_del removes dev/block/M:m and the class link before KOBJ_REMOVE),
//   or at once after a drain that held no block event and no overrun.
// - An event queued after the poll: this scrape names from a topology one event old. The only
//   names it gives from it are exact (major, minor, diskseq) matches (ExactTopologyName): the
//   same disk, never a successor on the same number, so no number is attributed to another
//   device. What it can show is a device removed during the scrape itself; the next scrape sees
//   the event. The bound is the scrape in flight, not the 100-500 ms debounce, so the 1 s rule
//   holds with the same margin as with sysfs alone.
// - A diskseq changed by disk_force_media_change (a loop detach, a media change) sends its
//   uevent just before the increment (measured on 6.18: DISK_MEDIA_CHANGE=1 carries the old
//   DISKSEQ, the file reads one more right after). The rescan comes at least 100 ms after an
//   event (the debouncer's quiet time), long after the increment. After an overrun it runs at
//   once; the increment is the next statement in the kernel, the rescan a poll wakeup and a
//   full scan later.
TopologyNamer TopologyNames::ForScrape() {
  if (!events_unread_ || events_unread_()) return TopologyNamer(nullptr, fallback_);
  std::lock_guard<std::mutex> lock(mutex_);
  return TopologyNamer(trusted_ ? topology_ : nullptr, fallback_);
}

}  // namespace mergewatch
