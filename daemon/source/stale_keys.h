// SPDX-License-Identifier: Apache-2.0
// Which map keys belong to devices that are gone, or whose major:minor now names a newer disk.
#pragma once

#include "source/snapshot.h"
#include "topology/device_namer.h"
#include "topology/topology.h"

namespace mergewatch {

// The keys of `snapshot` that neither the topology nor sysfs, asked again through `namer` (it
// reads sysfs live: the last scan may predate a device that just appeared), know. Nothing when
// the topology shows no device at all: that is a wrong --path.sysfs, not a host without disks,
// and the data is kept (counted in mergewatch_unresolved_devices).
StaleKeys FindStaleKeys(const Snapshot& snapshot, const Topology& topology, DeviceNamer& namer);

// Whether some device key of the snapshot is one the topology does not show.
bool HasUnknownDevice(const Snapshot& snapshot, const Topology& topology);

}  // namespace mergewatch
