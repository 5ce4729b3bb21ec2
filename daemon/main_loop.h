// SPDX-License-Identifier: Apache-2.0
// The daemon's main loop: waits in poll() for a signal (signalfd), a device event, a retry's BPF
// loader or the next tick. Once a tick (1 s, or half the watchdog interval) the watchdog is fed
// and the detector sees a fresh snapshot; a due event rescan publishes the new topology at once.
#pragma once

#include <cstdint>
#include <string>

#include "clock.h"
#include "collapse_services.h"
#include "detector/detector.h"
#include "http/http_server.h"
#include "metrics/state_metrics.h"
#include "source/evidence_sources.h"
#include "source/source.h"
#include "topology/device_namer.h"
#include "topology/device_watch.h"
#include "topology/topology_keeper.h"
#include "topology/topology_namer.h"

namespace mergewatch {

// What the loop drives; owned by RunDaemon, which builds them in the order the scrapes need.
struct LoopParts {
  EvidenceSources& sources;
  ActiveSource& active;
  DeviceNamer& namer;
  DeviceWatch& watch;
  TopologyNames& names;
  TopologyKeeper& topology;
  CollapseDetector& detector;
  CollapseServices& services;
  StateCollector& state;
  HttpServer& server;  // its event loops' heartbeat decides whether the watchdog is fed
};

class MainLoop {
 public:
  // `fail_after_ticks`: the hidden test flag (0: never); `sysfs_root` for the SIGHUP log line.
  MainLoop(LoopParts parts, std::string sysfs_root, uint32_t fail_after_ticks);
  // Runs until a stop signal; returns it, or -1 on an error (signalfd, poll, the test flag).
  int Run();

 private:
  // Reads pending signals; returns a stop signal, else 0. Sets *rescanned on SIGHUP.
  int TakeSignals(int signal_fd, bool* rescanned);
  void FeedWatchdog();
  // One look at the evidence: read, forget the keys of departed devices, update the detector.
  void Tick(TimePoint now);
  void ForgetDepartedDevices(const Snapshot& snapshot);

  LoopParts parts_;
  const std::string sysfs_root_;
  const uint32_t fail_after_ticks_;
  const uint64_t watchdog_usec_;
  bool reported_stuck_ = false;
};

}  // namespace mergewatch
