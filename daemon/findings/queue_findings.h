// SPDX-License-Identifier: Apache-2.0
// Queue settings that hurt, found from sysfs before any traffic shows them (the LinkedIn
// class: rotational RAID1 members left on `none` because the multi-queue schedulers were modules).
//
// Pure: everything comes from a Topology (already read from sysfs by topology/) and the kernel
// release string; the caller publishes the result as mergewatch_queue_config_finding and logs
// what changed. Findings apply to request-based whole disks only (loop devices included, md
// members are disks; rotational_without_scheduler leaves loop devices out), never to dm or md devices themselves, and never to a setting the driver
// itself chose (see FindQueueConfigProblems).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace mergewatch {

// The finding label values.
inline constexpr const char* kRotationalWithoutScheduler = "rotational_without_scheduler";
inline constexpr const char* kMergingDisabledUnderStack = "merging_disabled_under_stack";
inline constexpr const char* kMaxSectorsCapped = "max_sectors_capped";

// max_sectors_capped holds when max_sectors_kb * kMaxSectorsCapFactor <= the reference limit:
// a quarter of it or less, so each request the kernel would have built goes out as 4 or more.
inline constexpr uint64_t kMaxSectorsCapFactor = 4;

struct KernelVersion {
  int major = 0;
  int minor = 0;
  bool AtLeast(int want_major, int want_minor) const {
    return major > want_major || (major == want_major && minor >= want_minor);
  }
};

// "6.18.44-fc-v782" -> {6, 18}; nullopt when the release does not start with <major>.<minor>.
std::optional<KernelVersion> ParseKernelRelease(const std::string& release);

// The kernel's default upper bound of max_sectors_kb (BLK_DEF_MAX_SECTORS, later _CAP): 2560
// sectors (1280 KiB) since d2be537c3ba3 (v4.3), 8192 sectors (4096 KiB) since 9b8b84879d4a
// ("block: Increase BLK_DEF_MAX_SECTORS_CAP", v6.17). An unknown release takes the smaller.
uint64_t DefaultMaxSectorsCapKb(const std::optional<KernelVersion>& kernel);

// The value below which max_sectors_kb is compared: min(the default cap, max_hw_sectors_kb,
// optimal_io_size when the device reports one). Every default the kernel or sd picks is at
// least this. 0 when max_sectors_kb cannot be judged.
uint64_t MaxSectorsReferenceKb(const QueueSettings& queue, const std::optional<KernelVersion>& kernel);

struct QueueFinding {
  std::string device;
  std::string finding;   // one of the k* names above
  std::string evidence;  // the sysfs values that make it hold, for the log
  std::string remedy;    // what clears it
  bool operator==(const QueueFinding& o) const { return device == o.device && finding == o.finding; }
};

// Every finding that holds, sorted by device then finding:
// - rotational_without_scheduler: rotational 1 on a transport whose flag is the device's word
//   (TransportReportsRotation: not virtio_blk, Xen vbd, loop, aoe; not an sd disk whose VPD page B1 gives
//   rotation rate 0, "not reported"; an sd disk without the page, before v5.18, is trusted), active scheduler none, whatever the
//   number of hardware queues: with more than one (virtio-scsi's default of one per vCPU, an HBA's) the
//   kernel's own default is none (elevator_get_default(), unless the tags are host-wide), and the disk
//   seeks just the same;
// - merging_disabled_under_stack: nomerges not 0 on a disk with a dm or md device above it,
//   except a buffered loop device's nomerges 2 before 6.11 (the driver set it until 667ea36378cf,
//   "loop: don't set QUEUE_FLAG_NOMERGES");
// - max_sectors_capped: see kMaxSectorsCapFactor and MaxSectorsReferenceKb.
std::vector<QueueFinding> FindQueueConfigProblems(const Topology& topology, const std::string& kernel_release);

struct FindingChange {
  bool appeared = false;  // else cleared
  std::string text;       // the log line: evidence and remedy when it appeared
};

// One change per finding that appeared or cleared since `before`, appeared ones first.
std::vector<FindingChange> DescribeFindingChanges(const std::vector<QueueFinding>& before,
                                                const std::vector<QueueFinding>& after);

// The device class kernel cohorts are compared within: "rotational" (queue/rotational 1, any
// transport), "nvme" (non-rotational NVMe), "non_rotational" (every other non-rotational disk).
// Whole request-based disks and NVMe multipath heads only; nullptr for partitions, dm, md, and
// disks whose rotational flag is unknown.
const char* DeviceClassName(const BlockDevice& device);

}  // namespace mergewatch
