// SPDX-License-Identifier: Apache-2.0
#include "collapse_services.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "log.h"

namespace mergewatch {

CgroupHost ReadCgroupHost(const std::string& mountinfo) {
  CgroupHost host;
  host.mount = Cgroup2MountPoint(mountinfo);
  host.io_on_v1 = IoControllerOnV1(mountinfo);
  if (host.mount) {
    const int fd = open(host.mount->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      if (std::optional<uint64_t> id = KernfsIdOf(fd)) host.root_id = *id;
      close(fd);
    }
  }
  return host;
}

CgroupHost ReadCgroupHostAt(const std::string& procfs_root) {
  std::ifstream in(procfs_root + "/self/mountinfo");
  std::stringstream text;
  text << in.rdbuf();
  return ReadCgroupHost(text.str());
}

CollapseServices::CollapseServices(CgroupNames names, Duration window) : names_(std::move(names)), window_(window) {}

CollapseServices CollapseServices::ForHost(const std::string& procfs_root, Duration window) {
  const CgroupHost host = ReadCgroupHostAt(procfs_root);
  CgroupNamesOptions options;
  options.blkcg_ids_on_cgroup2 = !host.io_on_v1;
  if (host.mount)
    LogInfo("services behind a collapse are named from the cgroup2 tree at " + *host.mount +
            (host.io_on_v1 ? " (io controller on cgroup v1: page-cache writes are \"writeback\")" : ""));
  else
    LogInfo("no cgroup2 mount: the services behind a collapse are not named (\"unattributed (cgroup v1)\")");
  return CollapseServices(CgroupNames(host.mount, KernfsIdOf, options), window);
}

namespace {

// The counters with each path disk of a native NVMe multipath head counted under the head, as the
// verdicts name it (Topology::CountedUnder); keys of devices the topology does not know kept as they are.
ServiceCounters UnderCountingDevices(const ServiceCounters& counters, const Topology& topology) {
  ServiceCounters out;
  for (const auto& [key, requests] : counters) {
    ServiceCounterKey counted = key;
    const BlockDevice* disk = topology.CountedUnder(key.pair.disk_major, key.pair.disk_minor, key.pair.disk_diskseq);
    if (disk != nullptr && !disk->hidden) {
      counted.pair.disk_major = disk->major;
      counted.pair.disk_minor = disk->minor;
      counted.pair.disk_diskseq = key.pair.disk_diskseq == 0 ? 0 : disk->diskseq;
    }
    out[counted] += requests;
  }
  return out;
}

}  // namespace

void CollapseServices::Update(TimePoint now, const ServiceCounters& counters, const Topology& topology,
                              std::vector<DiskVerdict>* verdicts) {
  recent_.emplace_back(now, deltas_.Advance(UnderCountingDevices(counters, topology)));
  while (!recent_.empty() && recent_.front().first <= now - window_) recent_.pop_front();
  ServiceCounters window;
  for (const auto& tick : recent_)
    for (const auto& [key, requests] : tick.second) window[key] += requests;

  // Verdicts name devices; the counters number them. The key's diskseq is the request's disk's, so a
  // pair matches on the disk's major:minor and either diskseq (0 on kernels without one).
  std::map<DevicePair, DiskVerdict*> by_pair;
  std::set<DevicePair> collapsed;
  for (DiskVerdict& v : *verdicts) {
    v.services.clear();
    if (!v.condition || v.upper.empty()) continue;
    const BlockDevice* disk = topology.FindByName(v.device);
    const BlockDevice* upper = topology.FindByName(v.upper);
    if (disk == nullptr || upper == nullptr) continue;
    for (const auto& [key, requests] : window) {
      const DevicePair& p = key.pair;
      if (p.disk_major == disk->major && p.disk_minor == disk->minor && p.upper_major == upper->major &&
          p.upper_minor == upper->minor && (p.disk_diskseq == disk->diskseq || disk->diskseq == 0)) {
        collapsed.insert(p);
        by_pair[p] = &v;
      }
    }
  }
  const auto label = [this, now](const CgroupRef& ref) { return LabelOf(names_.Name(ref.id, ref.source, now)); };
  for (PairServices& found : TopServices(window, collapsed, label)) {
    DiskVerdict* verdict = by_pair[found.pair];
    // A disk re-created under the same number has two keys for one verdict: the one with more requests speaks.
    if (verdict->services.empty() || found.requests > verdict->service_requests) {
      verdict->services = std::move(found.services);
      verdict->service_requests = found.requests;
    }
  }
  names_.Sweep(now);
}

std::string ServicesText(const std::vector<ServiceShare>& services) {
  std::string text;
  for (const ServiceShare& s : services) {
    if (s.other && s.requests == 0) continue;
    if (!text.empty()) text += ", ";
    text += std::to_string(static_cast<int>(std::lround(s.share * 100))) + "% " +
            (s.cgroup.empty() ? std::string("unattributed (cgroup v1)") : s.cgroup);
  }
  return text;
}

}  // namespace mergewatch
