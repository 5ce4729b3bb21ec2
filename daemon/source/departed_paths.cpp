// SPDX-License-Identifier: Apache-2.0
#include "source/departed_paths.h"

#include <set>

namespace mergewatch {

const BlockDevice* DeviceCountingKey(const Snapshot& snapshot, const Topology& topology, uint32_t major,
                                     uint32_t minor, uint64_t diskseq) {
  return CountingDevice(snapshot, major, minor, diskseq, [&topology](uint32_t ma, uint32_t mi, uint64_t seq) {
    return topology.CountedUnder(ma, mi, seq);
  });
}

void DepartedPaths::Learn(const Snapshot& snapshot, const Topology& topology) {
  std::set<DiskKey> present;
  auto learn = [&](uint32_t major, uint32_t minor, uint64_t diskseq) {
    const DiskKey path{major, minor, diskseq};
    present.insert(path);
    const BlockDevice* device = topology.FindKey(major, minor, diskseq);
    if (device == nullptr || !device->hidden || device->multipath_head.empty()) return;
    const BlockDevice* head = topology.FindByName(device->multipath_head);
    if (head == nullptr || head->hidden) return;
    head_of_[path] = DiskKey{head->major, head->minor, head->diskseq};
  };
  for (const auto& [key, stats] : snapshot.stats) learn(key.major, key.minor, key.diskseq);
  for (const auto& [key, stats] : snapshot.origins) learn(key.major, key.minor, key.diskseq);
  // A path whose keys are no longer read was retired (or the maps were reloaded): nothing to keep.
  for (auto it = head_of_.begin(); it != head_of_.end();) it = present.count(it->first) ? std::next(it) : head_of_.erase(it);
}

const DiskKey* DepartedPaths::HeadOf(const DiskKey& path, const Topology& topology) const {
  const auto it = head_of_.find(path);
  if (it == head_of_.end()) return nullptr;
  // The head must still be the same device: its major:minor with the diskseq it had.
  const BlockDevice* head = topology.FindKey(it->second.major, it->second.minor, it->second.diskseq);
  if (head == nullptr || head->hidden || head->major != it->second.major || head->minor != it->second.minor)
    return nullptr;
  return &it->second;
}

size_t DepartedPaths::Retire(const StaleKeys& stale, const Snapshot& last, const Topology& topology) {
  // Stale keys of a head first: what its departed paths left it ends with it.
  std::set<DiskKey> dead_heads;
  for (const DevOpKey& k : stale.stats)
    if (stats_.count(k)) dead_heads.insert(DiskKey{k.major, k.minor, k.diskseq});
  for (const OriginKey& k : stale.origins)
    if (origins_.count(k)) origins_.erase(k);  // the head or the origin is gone: this pair's series ends
  for (auto it = stats_.begin(); it != stats_.end();)
    it = dead_heads.count(DiskKey{it->first.major, it->first.minor, it->first.diskseq}) ? stats_.erase(it)
                                                                                          : std::next(it);
  for (auto it = origins_.begin(); it != origins_.end();)
    it = dead_heads.count(DiskKey{it->first.major, it->first.minor, it->first.diskseq}) ? origins_.erase(it)
                                                                                          : std::next(it);

  size_t moved = 0;
  std::set<DiskKey> retired;
  for (const DevOpKey& k : stale.stats) {
    const DiskKey path{k.major, k.minor, k.diskseq};
    const DiskKey* head = HeadOf(path, topology);
    const auto value = last.stats.find(k);
    if (head == nullptr || dead_heads.count(*head) || value == last.stats.end()) continue;
    AccumulateStats(value->second, &stats_[DevOpKey{head->major, head->minor, k.op, head->diskseq}]);
    retired.insert(path);
    ++moved;
  }
  for (const OriginKey& k : stale.origins) {
    const DiskKey path{k.major, k.minor, k.diskseq};
    const DiskKey* head = HeadOf(path, topology);
    const auto value = last.origins.find(k);
    // The pair lives on only while the device the bios came from does (the head itself, or what
    // is stacked on it).
    if (head == nullptr || dead_heads.count(*head) || value == last.origins.end() ||
        topology.Find(k.origin_major, k.origin_minor) == nullptr)
      continue;
    AccumulateOrigin(value->second, &origins_[OriginKey{head->major, head->minor, k.origin_major, k.origin_minor,
                                                        k.op, head->diskseq}]);
    retired.insert(path);
  }
  for (const DiskKey& path : retired) head_of_.erase(path);
  return moved;
}

void DepartedPaths::AddTo(Snapshot* snapshot) const {
  for (const auto& [key, stats] : stats_) AccumulateStats(stats, &snapshot->stats[key]);
  for (const auto& [key, stats] : origins_) AccumulateOrigin(stats, &snapshot->origins[key]);
  snapshot->path_heads = head_of_;
}

void DepartedPaths::Clear() {
  head_of_.clear();
  stats_.clear();
  origins_.clear();
}

}  // namespace mergewatch
