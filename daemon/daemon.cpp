// SPDX-License-Identifier: Apache-2.0
#include "daemon.h"

#include <sys/resource.h>
#include <sys/utsname.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "collapse_services.h"
#include "exit_codes.h"
#include "findings/queue_findings.h"
#include "http/http_server.h"
#include "http/listen.h"
#include "metrics/status_json.h"
#include "http/status_path.h"
#include "log.h"
#include "main_loop.h"
#include "metrics/exporter.h"
#include "metrics/scrape.h"
#include "metrics/self_metrics.h"
#include "metrics/state_metrics.h"
#include "sd_notify.h"
#include "signals.h"
#include "source/diskstats.h"
#include "source/evidence_sources.h"
#include "source/source.h"
#include "topology/device_namer.h"
#include "topology/device_watch.h"
#include "topology/topology_keeper.h"
#include "topology/topology_namer.h"

namespace mergewatch {
namespace {

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

// Logs the reason and tells systemd; returns the exit code.
int Fail(const std::string& message, int exit_code) {
  LogError(message);
  SdNotify("STATUS=failed: " + message.substr(0, 200) + "\nERRNO=" + std::to_string(exit_code));
  return exit_code;
}

// Each connection is a descriptor: the soft limit (1024 by default) would cap the server
// far below its connection limit. The hard limit is the operator's (LimitNOFILE=).
void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) LogWarn(std::string("cannot raise RLIMIT_NOFILE: ") + strerror(errno));
}

// The endpoint's options from the flags and the web config file; false with the reason.
bool MakeHttpOptions(const Config& config, HttpOptions* http, std::string* error) {
  http->telemetry_path = config.telemetry_path;
  http->web_config_file = config.web_config_file;
  if (!config.web_config_file.empty() &&
      !LoadWebConfig(config.web_config_file, &http->web, &http->secrets, error)) {
    *error = "--web.config.file: " + *error;
    return false;
  }
  // An empty file, comments only, or an empty basic_auth_users: the operator asked for security
  // and got none. Still valid (exporter-toolkit starts too), but never silently.
  if (!config.web_config_file.empty() && !http->web.tls() && http->web.users.empty())
    LogWarn("--web.config.file " + config.web_config_file +
            " enables neither TLS (tls_server_config) nor basic auth (basic_auth_users): serving plain HTTP "
            "without authentication");
  http->allowed_hosts = config.allowed_hosts;
  http->counts = std::make_shared<HttpDefenceCounts>();
  return true;
}

// BPF at start, unless --source=diskstats: *status says what detection runs on. Returns an exit
// code when the daemon must stop (--source=bpf and BPF cannot load), else kExitOk.
int StartEvidence(SourceChoice choice, EvidenceSources* sources, SourceStatus* status) {
  if (choice == SourceChoice::kDiskstats) {
    *status = DiskstatsStatus("--source=diskstats");
    LogInfo("--source=diskstats: no BPF; detection runs on diskstats (reduced evidence: no per-request sizes, "
            "missed merges, latencies or remap origins)");
    return kExitOk;
  }
  SdNotify("STATUS=loading BPF programs");
  ProbeFailure failure;
  // Waits for the loader (kLoaderTimeout at most, well inside TimeoutStartSec; systemd's
  // watchdog starts only at READY=1).
  if (sources->LoadAtStart(MonotonicNow(), &failure)) {
    LogInfo("attached " + std::to_string(sources->bpf()->attached_count()) + " BPF programs using " +
            sources->bpf()->mode());
    return kExitOk;
  }
  if (choice == SourceChoice::kBpf) return Fail(failure.message, ExitCodeFor(failure.kind));
  // --source=auto: a dark host is worse than reduced evidence, but never a silent downgrade.
  *status = DiskstatsStatus(failure.message);
  LogWarn("BPF cannot run: " + failure.message + ". Detection runs on diskstats instead (reduced evidence: no "
          "per-request sizes, missed merges, latencies or remap origins; see mergewatch_detection_info); " +
          sources->RetryPlan());
  return kExitOk;
}

ProbeOptions LoaderOptions(const Config& config) {
  const CgroupHost host = ReadCgroupHostAt(config.procfs_root);
  ProbeOptions options;
  options.cgroup_root_id = host.root_id;
  options.blkcg_on_cgroup2 = host.mount.has_value() && !host.io_on_v1;
  options.btf_path = config.btf_path;
  options.inflight_entries = config.inflight_entries;
  options.program_type = config.program_type;
  options.request_clock = config.request_clock;
  options.sysfs_root = config.sysfs_root;
  return options;
}

// Queue findings follow every scan (the refresh interval, SIGHUP, device events); changes are logged.
std::function<void(std::shared_ptr<const Topology>)> PublishEachScan(TopologyNames* names, const DeviceWatch* watch,
                                                                     StateCollector* state,
                                                                     std::string kernel_release) {
  auto findings = std::make_shared<std::vector<QueueFinding>>();
  return [=](std::shared_ptr<const Topology> current) {
    std::vector<QueueFinding> now = FindQueueConfigProblems(*current, kernel_release);
    for (const FindingChange& change : DescribeFindingChanges(*findings, now))
      Log(change.appeared ? LogLevel::kWarn : LogLevel::kInfo, change.text);
    *findings = now;
    state->PublishFindings(std::move(now));
    names->Publish(std::move(current), watch->pending());
  };
}

// What each scrape renders, in this order.
std::vector<std::shared_ptr<prometheus::Collectable>> Collectables(const Config& config, ActiveSource& active,
                                                                   TopologyNames& names, const DaemonStatus& status,
                                                                   std::shared_ptr<StateCollector> state,
                                                                   const HttpOptions& http, EvidenceSources& sources) {
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables = {
      std::make_shared<MetricsCollector>(active, names, status), std::move(state),
      std::make_shared<DetectionInfoCollector>(active),
      std::make_shared<DefenceCollector>(http.counts, http.limits.connections_per_address,
                                         http.limits.connection_limit)};
  if (!config.disable_exporter_metrics)
    collectables.push_back(std::make_shared<SelfCollector>([&sources] { return sources.ProgramCosts(); }));
  return collectables;
}

// "8 programs attached (tp_btf)", or that detection runs on diskstats: for READY's STATUS and the log.
std::string DescribeEvidence(const EvidenceSources& sources) {
  if (!sources.bpf()) return "on diskstats (reduced evidence, no BPF)";
  return std::to_string(sources.bpf()->attached_count()) + " programs attached (" + sources.bpf()->mode() + ")";
}

// The log set up as configured, then the first lines an operator reads: version, kernel, flags to replace.
void AnnounceStart(const Config& config) {
  SetLogLevel(config.log_level);
  SetLogFormat(config.log_format);
  LogInfo("starting mergewatchd " + VersionString() + " on kernel " + KernelRelease());
  SdNotify("STATUS=starting");
  for (const std::string& warning : config.deprecated_flags) LogWarn(warning);
  LogInfo("series for " + config.devices.Describe());
}

// The table is indexed by hash bits, so its size is a power of two: say so when the flag was not.
void AnnounceInflightCapacity(const Config& config, uint32_t capacity) {
  if (capacity != config.inflight_entries)
    LogInfo("in-flight table: " + std::to_string(capacity) + " slots (--bpf.inflight-entries=" +
            std::to_string(config.inflight_entries) + " rounded up to a power of two)");
}

}  // namespace

int RunDaemon(const Config& config) {
  AnnounceStart(config);
  RaiseFileLimit();

  std::string error;
  HttpOptions http;
  if (!MakeHttpOptions(config, &http, &error)) return Fail(error, kExitUsage);
  // Listen first: a taken port is the cheapest failure to report, before any BPF work.
  Listeners listeners;
  if (!OpenListeners(config.systemd_socket, config.listen_addresses, &listeners, &error))
    return Fail("cannot listen on " + error, kExitListen);
  const std::string listen_names = listeners.Names();

  const SourceChoice choice = config.source;
  EvidenceSources sources(LoaderOptions(config), config.bpf_loader_hangs, config.topology_refresh);
  SourceStatus source_status;
  if (const int code = StartEvidence(choice, &sources, &source_status); code != kExitOk) return code;
  std::shared_ptr<SnapshotSource> first_source = sources.bpf();
  if (!first_source) first_source = std::make_shared<DiskstatsSource>(config.procfs_root, config.sysfs_root);
  ActiveSource active(first_source, source_status);
  sources.Attach(&active);

  SysfsDeviceNamer namer(config.sysfs_root);
  DaemonStatus status{VersionString(), KernelRelease(), 1u << InflightSlotBits(config.inflight_entries)};
  AnnounceInflightCapacity(config, status.inflight_capacity);
  DeviceWatch watch;  // before the first scan: a device added meanwhile is not missed
  // Scrapes name devices from the topology while the events say it is current, else by sysfs.
  TopologyNames names(namer, watch.fd() >= 0 ? std::function<bool()>([&watch] { return watch.Unread(); })
                                             : std::function<bool()>());
  auto state = std::make_shared<StateCollector>(config.devices);
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables =
      Collectables(config, active, names, status, state, http, sources);

  // The detector's disks get their queue settings read each tick (a runtime nomerges change pages within
  // seconds); the rest at the periodic rescan.
  const std::regex lower_disks(config.collapse.lower_devices, std::regex::extended);
  TopologyKeeper topology(config.sysfs_root, config.topology_refresh, MonotonicNow,
                          [lower_disks](const std::string& name) { return std::regex_search(name, lower_disks); });
  topology.OnScan(PublishEachScan(&names, &watch, state.get(), status.kernel_release));
  sources.FollowTopology(*topology.current());
  CollapseDetector detector(config.collapse);
  CollapseServices services = CollapseServices::ForHost(config.procfs_root, config.collapse.window);
  state->Publish(topology.current(), detector.Verdicts());
  http.status = [state] { return StatusJson({VersionString(), state->Verdicts(), state->Findings()}); };

  // Declared after everything a scrape reads (probes, namer, collectors): on every way out of
  // this function, return or exception, the server is destroyed first, and its destructor
  // returns only once no scrape runs.
  std::unique_ptr<HttpServer> server = HttpServer::Start(
      listeners.Release(), http,
      [collectables, topology_text = RenderedFamilies([state] { return state->TopologyText(); }),
       devices = config.devices] { return RenderScrape(collectables, {topology_text}, devices); },
      &error);
  if (!server) return Fail(error, kExitListen);
  LogInfo("listening on " + listen_names + (http.web.tls() ? " (TLS)" : "") +
          (http.web.users.empty() ? "" : " (basic auth)") + ", metrics at " + config.telemetry_path +
          ", detector status at " + StatusPathFor(config.telemetry_path));
  const std::string ready_status = "serving " + config.telemetry_path + " on " + listen_names + ", " +
                                   DescribeEvidence(sources);
  SdNotify("READY=1\nSTATUS=" + ready_status);
  LogInfo("ready: " + ready_status);

  MainLoop loop({sources, active, namer, watch, names, topology, detector, services, *state, *server},
                config.sysfs_root,
                config.fail_after_ticks);
  const int exit_signal = loop.Run();
  if (exit_signal < 0) return kExitFailure;

  LogInfo("received " + SignalName(exit_signal) + " (" + strsignal(exit_signal) + "), shutting down");
  SdNotify("STOPPING=1\nSTATUS=stopping");
  server.reset();  // scrapes in flight finish first (bounded); none can touch the maps past this point
  collectables.clear();
  state.reset();
  const bool had_bpf = sources.bpf() != nullptr;
  sources.Stop();                           // a retry's loader still running is killed and reaped
  active.Switch(nullptr, active.status());  // the last owner of the probes: destroys every link
  LogInfo(had_bpf ? "BPF programs detached, exiting" : "exiting");
  return kExitOk;
}

}  // namespace mergewatch
