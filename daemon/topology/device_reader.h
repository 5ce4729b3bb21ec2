// SPDX-License-Identifier: Apache-2.0
// One device's sysfs directory read into a BlockDevice: its dev_t or hidden-path diskseq, partition
// or disk, kind, dm/LVM identity, slaves/ and holders/, and its disk's queue settings. The walks
// topology.h declares are built on it, in device_reader.cpp: Topology::Scan (every device under
// block/ and dev/block/), ResolveDevice (one dev_t) and ResolveHiddenDisk (one diskseq).
//
// Internal to daemon/topology/; every path goes through a SysfsTree (sysfs_tree.h), so nothing here
// reads outside the sysfs root it was given.
#pragma once

#include <optional>
#include <string>

#include "topology/sysfs_tree.h"
#include "topology/topology.h"

namespace mergewatch {
namespace topology_internal {

// <disk_rel>/queue/ and <disk_rel>/mq/, as QueueSettings describes them; a missing queue/ warns and
// leaves every field unknown.
QueueSettings ReadQueue(const SysfsTree& tree, const std::string& disk_rel);

// Reads the device whose canonical directory is `rel`. A partition takes
// `disk_queue` when the caller already parsed its disk, else reads the
// parent's queue/. nullopt (with a warning) without a usable "dev" file,
// because a device that cannot be matched to a dev_t is useless here.
std::optional<BlockDevice> ReadDevice(const SysfsTree& tree, const std::string& rel,
                                      const QueueSettings* disk_queue);

// Resolves a link such as block/nvme1n1 or dev/block/259:0 to a canonical
// device directory; warns and returns nullopt when it does not lead to one.
std::optional<std::string> ResolveDeviceDir(const SysfsTree& tree, const std::string& link);

}  // namespace topology_internal
}  // namespace mergewatch
