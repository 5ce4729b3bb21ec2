// SPDX-License-Identifier: Apache-2.0
#include "source/stale_keys.h"

namespace mergewatch {

StaleKeys FindStaleKeys(const Snapshot& snapshot, const Topology& topology, DeviceNamer& namer) {
  StaleKeys stale;
  if (topology.devices().empty()) return stale;
  auto gone = [&](uint32_t major, uint32_t minor, uint64_t diskseq) {
    return topology.CountedUnder(major, minor, diskseq) == nullptr && !namer.NameOf(major, minor, diskseq);
  };
  for (const auto& [key, stats] : snapshot.stats)
    if (gone(key.major, key.minor, key.diskseq)) stale.stats.push_back(key);
  for (const auto& [key, stats] : snapshot.origins)
    if (gone(key.major, key.minor, key.diskseq) || gone(key.origin_major, key.origin_minor, 0))
      stale.origins.push_back(key);
  return stale;
}

bool HasUnknownDevice(const Snapshot& snapshot, const Topology& topology) {
  for (const auto& [key, stats] : snapshot.stats)
    if (topology.CountedUnder(key.major, key.minor, key.diskseq) == nullptr) return true;
  return false;
}

}  // namespace mergewatch
