// SPDX-License-Identifier: Apache-2.0
// Device names for a scrape from the uevent-driven topology, without a system call per device,
// while that topology is known to be current; from sysfs (SysfsDeviceNamer) otherwise.
//
// The topology is current when the main loop has folded every block uevent the kernel sent
// into a rescan: the event socket is open, no rescan is pending (no event drained since the
// last scan, no overrun), and the socket holds nothing unread when the scrape begins (checked
// once per scrape: one poll(), not four system calls per device). Without device events (no
// AF_NETLINK) nothing tells that a device changed between rescans: sysfs names every key.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "topology/device_namer.h"
#include "topology/topology.h"

namespace mergewatch {

// Pure: the name a current topology gives a BPF key without asking sysfs, or nullptr when
// sysfs must be asked. Only an exact match: the visible whole disk at major:minor whose
// diskseq is the key's, non-zero. A diskseq is a counter the kernel never hands out twice
// (since 5.15) and a disk keeps its kernel name for its life, so such a match cannot be
// another disk, whatever happened since the scan. Without a diskseq (kernels before 5.15,
// the origin keys of remaps, partitions) a minor freed and reused would look the same; a
// multipath path disk is named after its head by the sysfs namer's rules: both go to sysfs.
const std::string* ExactTopologyName(const Topology& topology, uint32_t major, uint32_t minor, uint64_t diskseq);

// One scrape's namer: the topology (nullptr when it may not be trusted) for exact matches,
// `fallback` for every other key.
class TopologyNamer final : public DeviceNamer {
 public:
  TopologyNamer(std::shared_ptr<const Topology> topology, DeviceNamer& fallback)
      : topology_(std::move(topology)), fallback_(fallback) {}
  std::optional<std::string> NameOf(uint32_t major, uint32_t minor, uint64_t diskseq = 0) override;
  bool trusts_topology() const { return topology_ != nullptr; }

 private:
  std::shared_ptr<const Topology> topology_;
  DeviceNamer& fallback_;
};

// The topology the main loop publishes and whether scrapes may trust it. Thread-safe: the main
// loop calls Distrust and Publish, HTTP threads ForScrape.
class TopologyNames {
 public:
  // events_unread: true while the device event socket holds unread messages or a pending error
  // (ENOBUFS); called once per scrape from the scrape's thread. Empty when there are no device
  // events: then no topology is ever trusted.
  TopologyNames(DeviceNamer& fallback, std::function<bool()> events_unread)
      : fallback_(fallback), events_unread_(std::move(events_unread)) {}

  // Before the main loop reads the event socket: what it is about to read may change devices.
  void Distrust();
  // After every rescan and every drain of the socket: `topology` is current unless a rescan is
  // pending (events drained and not yet rescanned, or events lost).
  void Publish(std::shared_ptr<const Topology> topology, bool rescan_pending);
  // The namer for one scrape.
  TopologyNamer ForScrape();

 private:
  DeviceNamer& fallback_;
  const std::function<bool()> events_unread_;
  std::mutex mutex_;
  std::shared_ptr<const Topology> topology_;
  bool trusted_ = false;
};

}  // namespace mergewatch
