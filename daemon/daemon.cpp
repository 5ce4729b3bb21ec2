#include "daemon.h"

#include <CivetServer.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <sys/utsname.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "bpf_probes.h"
#include "device_namer.h"
#include "exit_codes.h"
#include "exporter.h"
#include "log.h"
#include "sd_notify.h"
#include "state_metrics.h"
#include "topology.h"

namespace mergewatch {
namespace {

// civetweb callbacks are plain function pointers with no user data of ours, so the
// HTTP front door's settings live here; written once before the server starts.
struct FrontDoor {
  std::string telemetry_path;
  std::string landing_page;
  std::mutex bind_error_mutex;
  std::string bind_error;
};
FrontDoor g_front_door;

int ServeFrontDoor(struct mg_connection* conn) {
  const struct mg_request_info* info = mg_get_request_info(conn);
  std::string uri = info->local_uri != nullptr ? info->local_uri : "";
  if (uri == g_front_door.telemetry_path) return 0;  // prometheus-cpp's handler
  if (uri == "/") {
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %zu\r\n"
              "Connection: close\r\n\r\n%s",
              g_front_door.landing_page.size(), g_front_door.landing_page.c_str());
    return 200;
  }
  // Exact paths only: civetweb would otherwise prefix-match /metrics/anything.
  static const char kNotFound[] = "404 page not found\n";
  mg_printf(conn,
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\n"
            "Connection: close\r\n\r\n%s",
            sizeof(kNotFound) - 1, kNotFound);
  return 404;
}

int RecordCivetLog(const struct mg_connection*, const char* message) {
  std::lock_guard<std::mutex> lock(g_front_door.bind_error_mutex);
  if (g_front_door.bind_error.empty()) g_front_door.bind_error = message;
  LogDebug(std::string("civetweb: ") + message);
  return 1;
}

std::string LandingPage(const std::string& telemetry_path) {
  return "<!DOCTYPE html>\n<html><head><title>mergewatch</title></head><body>\n"
         "<h1>mergewatch</h1>\n<p>Block I/O request sizes, latencies and merges from eBPF.</p>\n"
         "<p><a href=\"" + telemetry_path + "\">Metrics</a></p>\n</body></html>\n";
}

std::string KernelRelease() {
  utsname u{};
  return uname(&u) == 0 ? u.release : "unknown";
}

int ExitCodeFor(ProbeError kind) {
  switch (kind) {
    case ProbeError::kNoBtf: return kExitNoBtf;
    case ProbeError::kNoPrivilege: return kExitNoPrivilege;
    default: return kExitBpfLoad;
  }
}

void Fail(const std::string& message, int exit_code) {
  LogError(message);
  SdNotify("STATUS=failed: " + message.substr(0, 200) + "\nERRNO=" + std::to_string(exit_code));
}

// The latest sysfs topology: rescanned periodically, on SIGHUP, and when BPF reports a
// device it does not know yet (a disk that appeared since the last scan).
class TopologyKeeper {
 public:
  TopologyKeeper(std::string sysfs_root, Duration refresh) : sysfs_root_(std::move(sysfs_root)), refresh_(refresh) {
    Rescan();
  }
  void Rescan() {
    std::vector<std::string> warnings;
    current_ = std::make_shared<const Topology>(Topology::Scan(sysfs_root_, &warnings));
    last_scan_ = Now();
    for (const std::string& w : warnings) {
      if (reported_warnings_.insert(w).second) LogWarn("sysfs: " + w);
    }
    if (current_->devices().empty() && !reported_empty_) {
      LogWarn("no block devices found under " + sysfs_root_ + "/block: check --path.sysfs");
      reported_empty_ = true;
    }
  }
  void RefreshFor(const Snapshot& snapshot) {
    bool unknown = false;
    for (const auto& [key, stats] : snapshot.stats) unknown |= !Knows(key.major, key.minor, key.diskseq);
    // Unknown devices may also be ones that are gone for good: rescan at most once a second then.
    const Duration since = Now() - last_scan_;
    if (since >= refresh_ || (unknown && since >= std::chrono::seconds(1))) Rescan();
  }
  // The device at major:minor in the last scan, and the same incarnation of it.
  bool Knows(uint32_t major, uint32_t minor, uint64_t diskseq) const {
    const BlockDevice* device = current_->Find(major, minor);
    return device != nullptr && (diskseq == 0 || device->diskseq == 0 || device->diskseq == diskseq);
  }
  std::shared_ptr<const Topology> current() const { return current_; }
  static TimePoint Now() { return std::chrono::steady_clock::now().time_since_epoch(); }

 private:
  std::string sysfs_root_;
  Duration refresh_;
  std::shared_ptr<const Topology> current_;
  TimePoint last_scan_{};
  std::set<std::string> reported_warnings_;
  bool reported_empty_ = false;
};

// The map keys of devices that are gone, or whose major:minor now belongs to a newer disk.
// Sysfs is asked again (the namer reads it live) before a key is dropped: the last scan
// may simply predate a device that just appeared.
StaleKeys FindStaleKeys(const Snapshot& snapshot, const TopologyKeeper& topology, DeviceNamer& namer) {
  StaleKeys stale;
  // A sysfs that shows no device at all is a wrong --path.sysfs, not a host without disks:
  // keep the data (counted in mergewatch_unresolved_devices) rather than drop all of it.
  if (topology.current()->devices().empty()) return stale;
  auto gone = [&](uint32_t major, uint32_t minor, uint64_t diskseq) {
    return !topology.Knows(major, minor, diskseq) && !namer.NameOf(major, minor, diskseq);
  };
  for (const auto& [key, stats] : snapshot.stats)
    if (gone(key.major, key.minor, key.diskseq)) stale.stats.push_back(key);
  for (const auto& [key, stats] : snapshot.origins)
    if (gone(key.major, key.minor, key.diskseq) || gone(key.origin_major, key.origin_minor, 0))
      stale.origins.push_back(key);
  return stale;
}

void TraceBioLevelWhereNeeded(const Topology& topology, BpfProbes* probes) {
  const std::vector<std::string> stacked = topology.StackedBioBasedDevices();
  if (!probes->SetBioQueueTracing(!stacked.empty())) return;
  if (stacked.empty()) {
    LogInfo("no dm/md device stacked on a disk: block_bio_queue detached");
  } else {
    std::string names;
    for (const std::string& n : stacked) names += (names.empty() ? "" : ",") + n;
    LogInfo("bio-based devices stacked on disks (" + names + "): block_bio_queue attached");
  }
}

void Tick(BpfProbes& source, DeviceNamer& namer, TopologyKeeper* topology, CollapseDetector* detector,
          StateCollector* state) {
  Snapshot snapshot;
  try {
    snapshot = source.Read();
  } catch (const std::exception& e) {
    LogError(std::string("reading the BPF maps failed: ") + e.what());
    return;
  }
  topology->RefreshFor(snapshot);
  TraceBioLevelWhereNeeded(*topology->current(), &source);
  StaleKeys stale = FindStaleKeys(snapshot, *topology, namer);
  if (!stale.empty()) {
    source.Forget(stale);
    LogDebug("dropped the data of removed devices: " + std::to_string(stale.stats.size()) + " device keys, " +
             std::to_string(stale.origins.size()) + " origin keys");
  }
  // While a disk shows the pattern, its onset line must name the queue settings of now,
  // not of the last periodic scan: rescan every tick until it is resolved.
  for (const DiskVerdict& v : detector->Verdicts()) {
    if (v.condition || v.raised) {
      topology->Rescan();
      break;
    }
  }
  for (const CollapseEvent& event : detector->Update(TopologyKeeper::Now(), snapshot, *topology->current())) {
    if (event.onset) {
      LogWarn(event.message);
    } else {
      LogInfo(event.message);
    }
  }
  state->Publish(topology->current(), detector->Verdicts());
}

}  // namespace

void BlockDaemonSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int RunDaemon(const Config& config) {
  SetLogLevel(config.log_level);
  LogInfo("starting mergewatchd " + VersionString() + " on kernel " + KernelRelease());
  SdNotify("STATUS=starting");

  std::string civet_port, error;
  NormalizeListenAddress(config.listen_address, &civet_port, &error);
  g_front_door.telemetry_path = config.telemetry_path;
  g_front_door.landing_page = LandingPage(config.telemetry_path);
  CivetCallbacks callbacks{};
  callbacks.begin_request = ServeFrontDoor;
  callbacks.log_message = RecordCivetLog;

  // Listen first: a taken port is the cheapest failure to report, before any BPF work.
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", civet_port, "num_threads", "4", "request_timeout_ms", "10000"},
        &callbacks);
  } catch (const std::exception& e) {
    std::string detail;
    {
      std::lock_guard<std::mutex> lock(g_front_door.bind_error_mutex);
      detail = g_front_door.bind_error.empty() ? e.what() : g_front_door.bind_error;
    }
    Fail("cannot listen on " + config.listen_address + ": " + detail +
             " (is another mergewatchd or exporter using the port? pick another with --web.listen-address)",
         kExitListen);
    return kExitListen;
  }
  LogInfo("listening on " + civet_port + ", metrics at " + config.telemetry_path);

  SdNotify("STATUS=loading BPF programs");
  ProbeOptions options;
  options.btf_path = config.btf_path;
  options.inflight_entries = config.inflight_entries;
  options.program_type = config.program_type;
  ProbeError kind = ProbeError::kNone;
  std::unique_ptr<BpfProbes> probes = BpfProbes::Load(options, &kind, &error);
  if (!probes) {
    Fail(error, ExitCodeFor(kind));
    return ExitCodeFor(kind);
  }
  LogInfo("attached " + std::to_string(probes->attached_count()) + " BPF programs using " + probes->mode());

  SysfsDeviceNamer namer(config.sysfs_root);
  DaemonStatus status{VersionString(), KernelRelease(), 1u << InflightSlotBits(config.inflight_entries)};
  // The table is indexed by hash bits, so its size is a power of two: say so when the flag was not.
  if (status.inflight_capacity != config.inflight_entries)
    LogInfo("in-flight table: " + std::to_string(status.inflight_capacity) + " slots (--bpf.inflight-entries=" +
            std::to_string(config.inflight_entries) + " rounded up to a power of two)");
  auto collector = std::make_shared<MetricsCollector>(*probes, namer, status);
  auto state = std::make_shared<StateCollector>();
  exposer->RegisterCollectable(collector, config.telemetry_path);
  exposer->RegisterCollectable(state, config.telemetry_path);

  TopologyKeeper topology(config.sysfs_root, config.topology_refresh);
  TraceBioLevelWhereNeeded(*topology.current(), probes.get());
  CollapseDetector detector(config.collapse);
  state->Publish(topology.current(), detector.Verdicts());

  std::string ready_status = "serving " + config.telemetry_path + " on " + civet_port + ", " +
                             std::to_string(probes->attached_count()) + " programs attached (" + probes->mode() +
                             ")";
  SdNotify("READY=1\nSTATUS=" + ready_status);
  LogInfo("ready: " + ready_status);

  // sigtimedwait is the tick: once a second the detector sees a fresh snapshot, and the
  // watchdog is fed at half its interval.
  const uint64_t watchdog_usec = SdWatchdogUsec();
  const long tick_ms = watchdog_usec > 0 ? static_cast<long>(std::min<uint64_t>(watchdog_usec / 2000, 1000)) : 1000;
  sigset_t wait_set;
  sigemptyset(&wait_set);
  sigaddset(&wait_set, SIGINT);
  sigaddset(&wait_set, SIGTERM);
  sigaddset(&wait_set, SIGHUP);
  int exit_signal = 0;
  while (exit_signal == 0) {
    timespec timeout{tick_ms / 1000, (tick_ms % 1000) * 1000000L};
    int sig = sigtimedwait(&wait_set, nullptr, &timeout);
    if (watchdog_usec > 0) SdNotify("WATCHDOG=1");
    if (sig == SIGINT || sig == SIGTERM) {
      exit_signal = sig;
      break;
    }
    if (sig == SIGHUP) {
      LogInfo("SIGHUP: rescanning block devices in " + config.sysfs_root);
      topology.Rescan();
    } else if (sig < 0 && errno != EAGAIN && errno != EINTR) {
      LogError(std::string("sigtimedwait: ") + strerror(errno));
      return kExitFailure;
    }
    Tick(*probes, namer, &topology, &detector, state.get());
  }

  LogInfo(std::string("received ") + strsignal(exit_signal) + ", shutting down");
  SdNotify("STOPPING=1\nSTATUS=stopping");
  exposer.reset();  // no scrape can touch the maps past this point
  collector.reset();
  state.reset();
  probes.reset();   // destroys every link: nothing of ours stays attached
  LogInfo("BPF programs detached, exiting");
  return kExitOk;
}

}  // namespace mergewatch
