// SPDX-License-Identifier: Apache-2.0
// A native NVMe multipath head's counters never go backwards while the head lives. Its
// requests run on hidden path disks (nvme<S>c<C>n<N>) and the BPF maps key them by
// the path; the exporter and the detector sum a head's paths. When a path controller goes away
// (`delete_controller`, or controller loss after ctrl_loss_tmo) its path disk leaves sysfs, the
// daemon forgets its keys (the maps must not fill up with the dead), and without this the head's
// sums would drop by what that path ever did: Prometheus takes it for a counter reset, rate()
// counts the head's whole life again. DepartedPaths keeps what a departed path counted, moved to
// the key of its head (the head's own major:minor and diskseq, which sysfs still shows), until the
// head itself goes. Pure: snapshots and topologies in, snapshots out; the caller (ActiveSource)
// serialises it with the reads and the deletes of the maps.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include "source/snapshot.h"
#include "topology/topology.h"

namespace mergewatch {

// The device whose series the data of a key belongs to: Topology::CountedUnder's, or, for a path
// disk that has just left sysfs and whose keys are not retired yet, its head (Snapshot::path_heads).
const BlockDevice* DeviceCountingKey(const Snapshot& snapshot, const Topology& topology, uint32_t major,
                                     uint32_t minor, uint64_t diskseq);

class DepartedPaths {
 public:
  // Remembers which head each path disk key of `snapshot` counts under while `topology` still
  // shows the path (a path that has gone is no longer in the topology by the time its keys are
  // found stale, so this must be learnt earlier, at every read).
  void Learn(const Snapshot& snapshot, const Topology& topology);
  // `stale` are about to be deleted from the maps, `last` is a read of the maps just before.
  // Stale keys of a path whose head `topology` still shows keep their counts in `last`, added to
  // the head's key; stale keys of a head drop what its departed paths left it (the head is gone,
  // or its major:minor belongs to a newer device now: its series ends, a new one starts at zero).
  // Returns how many path keys moved.
  size_t Retire(const StaleKeys& stale, const Snapshot& last, const Topology& topology);
  // Adds what departed paths counted into the heads' keys of `snapshot`, and the heads of the
  // paths learnt (Snapshot::path_heads).
  void AddTo(Snapshot* snapshot) const;
  // A new source (BPF after diskstats): its counters start afresh, and so does the carry.
  void Clear();
  bool empty() const { return stats_.empty() && origins_.empty(); }

 private:
  const DiskKey* HeadOf(const DiskKey& path, const Topology& topology) const;

  std::map<DiskKey, DiskKey> head_of_;  // path disk key -> its head's key, learnt while both were seen
  std::map<DevOpKey, mw_dev_stats> stats_;      // under the heads' keys
  std::map<OriginKey, mw_origin_stats> origins_;  // under the heads' keys (major, minor, diskseq)
};

}  // namespace mergewatch
