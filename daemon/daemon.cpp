// SPDX-License-Identifier: Apache-2.0
#include "daemon.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <functional>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "source/bpf_probes.h"
#include "source/bpf_retry.h"
#include "source/diskstats.h"
#include "source/source.h"
#include "findings/queue_findings.h"
#include "topology/device_events.h"
#include "topology/device_namer.h"
#include "exit_codes.h"
#include "metrics/exporter.h"
#include "http/http_server.h"
#include "http/status_json.h"
#include "http/status_path.h"
#include "metrics/exposition.h"
#include "http/listen.h"
#include "log.h"
#include "metrics/self_metrics.h"
#include "sd_notify.h"
#include "metrics/state_metrics.h"
#include "topology/topology.h"
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
  // Called after every scan with the new topology (the scrapes' names).
  void OnScan(std::function<void(std::shared_ptr<const Topology>)> on_scan) {
    on_scan_ = std::move(on_scan);
    on_scan_(current_);
  }
  void Rescan() {
    std::vector<std::string> warnings;
    current_ = std::make_shared<const Topology>(Topology::Scan(sysfs_root_, &warnings));
    last_scan_ = Now();
    if (on_scan_) on_scan_(current_);
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
    if (since >= refresh_) {
      LogDebug("rescanning block devices: --topology.refresh-interval elapsed");
      Rescan();
    } else if (unknown && since >= std::chrono::seconds(1)) {
      LogDebug("rescanning block devices: BPF reported a device the last scan did not show");
      Rescan();
    }
  }
  // The device at major:minor in the last scan, and the same incarnation of it.
  // A multipath path disk's key is known while its head is (its data counts under the head).
  bool Knows(uint32_t major, uint32_t minor, uint64_t diskseq) const {
    return current_->CountedUnder(major, minor, diskseq) != nullptr;
  }
  std::shared_ptr<const Topology> current() const { return current_; }
  static TimePoint Now() { return std::chrono::steady_clock::now().time_since_epoch(); }

 private:
  std::string sysfs_root_;
  Duration refresh_;
  std::shared_ptr<const Topology> current_;
  std::function<void(std::shared_ptr<const Topology>)> on_scan_;
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

// The evidence sources: the one read now, the BPF programs while they run, and the next try at
// loading BPF after a failure that can pass (ENOMEM, EBUSY, a loader that did not answer).
struct Sources {
  explicit Sources(Duration retry_interval) : retry(retry_interval) {}
  ActiveSource* active = nullptr;
  std::shared_ptr<BpfProbes> bpf;  // null while detection runs on diskstats
  BpfRetrySchedule retry;
  std::unique_ptr<LoaderProcess> loading;  // a retry's load in flight: the main loop polls its socket
  uint32_t loads_started = 0;
  std::set<std::string> without_statistics;  // disks reported as unseen by diskstats (iostats=0)
};

// On diskstats, a disk with queue/iostats=0 is invisible (its counters stay still): never a silent
// blind spot. Said once when it appears, once when it is seen again; on BPF it does not matter.
void ReportDisksWithoutStatistics(const Topology& topology, Sources* sources) {
  std::set<std::string> now;
  if (!sources->bpf)
    for (const std::string& name : DisksWithoutStatistics(topology)) now.insert(name);
  for (const std::string& name : now) {
    if (sources->without_statistics.count(name)) continue;
    LogWarn("iostats=0 on " + name + ": the kernel keeps no I/O statistics for it, so the diskstats source sees "
            "none of its requests and cannot detect merge collapse on it. Remedy: echo 1 > /sys/block/" + name +
            "/queue/iostats, or let BPF run");
  }
  for (const std::string& name : sources->without_statistics)
    if (!now.count(name) && !sources->bpf)
      LogInfo("iostats on " + name + " is back, or the disk is gone: the diskstats source sees it again");
  sources->without_statistics = std::move(now);
}

// The options of the next loader process (counted, for --debug.bpf-loader-hang).
ProbeOptions LoaderOptions(const Config& config, Sources* sources) {
  ProbeOptions options;
  options.btf_path = config.btf_path;
  options.inflight_entries = config.inflight_entries;
  options.program_type = config.program_type;
  options.loader_hangs = sources->loads_started++ < config.bpf_loader_hangs;
  return options;
}

std::string RetryPlan(const BpfRetrySchedule& retry) {
  if (!retry.planned())
    return "BPF is not tried again (the cause needs an operator; --source=bpf exits instead)";
  return "BPF is tried again in " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(retry.delay()).count()) + " s";
}

// While on diskstats after a BPF failure that can pass: starts the loader when a try is due; it
// runs beside the main loop, which polls its socket (ServeUntilSignal) and calls FinishBpfRetry.
void StartBpfRetry(const Config& config, Sources* sources, TimePoint now) {
  if (sources->loading || !sources->retry.Due(now)) return;
  LogInfo("trying to load the BPF programs again");
  sources->loading = LoaderProcess::Start(LoaderOptions(config, sources), now);
}

// The retry's loader answered, died, or passed its deadline (give_up): switch to BPF, or plan the next try.
void FinishBpfRetry(Sources* sources, bool give_up, const Topology& topology,
                    std::shared_ptr<BpfProbes>* published) {
  std::unique_ptr<LoaderProcess> loading = std::move(sources->loading);
  ProbeError kind = ProbeError::kNone;
  std::string error;
  std::shared_ptr<BpfProbes> probes = BpfProbes::FromReply(loading->Finish(give_up), &kind, &error);
  loading.reset();
  if (!probes) {
    sources->retry.Failed(TopologyKeeper::Now(), kind, error);
    LogWarn("BPF still cannot run (" + error + "): detection stays on diskstats; " + RetryPlan(sources->retry));
    sources->active->SetStatus(DiskstatsStatus(error));
    return;
  }
  TraceBioLevelWhereNeeded(topology, probes.get());
  sources->bpf = probes;
  std::atomic_store(published, probes);
  sources->retry.Succeeded();
  sources->active->Switch(probes, SourceStatus{});
  LogInfo("attached " + std::to_string(probes->attached_count()) + " BPF programs using " + probes->mode() +
          ": detection runs on BPF again (full evidence)");
}

void Tick(Sources& sources, DeviceNamer& namer, TopologyKeeper* topology, CollapseDetector* detector,
          StateCollector* state) {
  Snapshot snapshot;
  try {
    snapshot = sources.active->Read();
  } catch (const std::exception& e) {
    LogError(std::string(sources.bpf ? "reading the BPF maps failed: " : "reading diskstats failed: ") + e.what());
    return;
  }
  topology->RefreshFor(snapshot);
  if (sources.bpf) TraceBioLevelWhereNeeded(*topology->current(), sources.bpf.get());
  ReportDisksWithoutStatistics(*topology->current(), &sources);
  sources.active->LearnPaths(snapshot, *topology->current());
  StaleKeys stale = FindStaleKeys(snapshot, *topology, namer);
  if (!stale.empty()) {
    const size_t moved = sources.active->ForgetKeepingHeads(stale, *topology->current());
    LogDebug("dropped the data of removed devices: " + std::to_string(stale.stats.size()) + " device keys, " +
             std::to_string(stale.origins.size()) + " origin keys");
    if (moved > 0)
      LogInfo("a multipath path disk went away: its " + std::to_string(moved) +
              " device keys' counts stay under its head (the head's counters never go backwards)");
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

// A device attach sends its events within a few ms of each other (block, bdi, partitions); a
// script attaching 100 loop devices sends them 2-20 ms apart. 100 ms of quiet folds either into
// one rescan, and 500 ms at most keeps a device added during steady churn within the 1 s the
// /metrics contract allows (a rescan of 135 devices here: 20-40 ms).
constexpr Duration kEventQuiet = std::chrono::milliseconds(100);
constexpr Duration kEventMaxDelay = std::chrono::milliseconds(500);

// Device events make a rescan due (debounced); without them (no AF_NETLINK in a sandbox) the
// periodic --topology.refresh-interval is all there is, and the log says so.
class DeviceWatch {
 public:
  DeviceWatch() : planner_(kEventQuiet, kEventMaxDelay) {
    std::string error;
    source_ = DeviceEventSource::Open(&error);
    if (source_) {
      LogInfo("watching block device uevents (receive buffer " + std::to_string(source_->receive_buffer_bytes()) +
              " bytes)");
    } else {
      LogWarn("no device events (" + error + "): new and removed devices are seen only at the periodic rescan "
              "(--topology.refresh-interval), on SIGHUP and when BPF reports an unknown device");
    }
  }
  int fd() const { return source_ ? source_->fd() : -1; }
  // Whether the socket holds messages not yet read, or an error (ENOBUFS): one poll(), from any
  // thread. Only the main loop reads the socket.
  bool Unread() const {
    pollfd p{fd(), POLLIN, 0};
    return poll(&p, 1, 0) != 0;  // an error of poll() itself counts as unread: sysfs is always right
  }
  // `names` is distrusted before the read (topology_namer.cpp says why that order) and published
  // again after it: trusted unless the events make a rescan pending.
  void OnReadable(TimePoint now, TopologyNames* names, const TopologyKeeper& topology) {
    names->Distrust();
    const DrainResult drained = source_->Drain();
    if (drained.overrun)
      LogWarn("device events lost (netlink receive buffer overran): rescanning every block device");
    planner_.Add(drained, now);
    names->Publish(topology.current(), planner_.pending());
  }
  bool pending() const { return planner_.pending(); }
  TimePoint due() const { return planner_.due(); }
  std::optional<std::string> TakeDue(TimePoint now, bool* events_lost) { return planner_.TakeDue(now, events_lost); }

 private:
  std::unique_ptr<DeviceEventSource> source_;
  RescanPlanner planner_;
};

// The signals the main loop takes from its signalfd (blocked in every thread): what each does is
// defined, and each is logged. Shut down cleanly: SIGINT, SIGTERM, SIGQUIT (no core dump: there
// is nothing to debug in a stop request) and the default-fatal signals nobody sends a daemon on
// purpose (timers, SIGXCPU/SIGXFSZ limits, SIGPWR...). SIGHUP: rescan. SIGUSR1, SIGUSR2 and the
// real-time signals: logged and ignored (they killed the daemon without a word, issue 24).
enum class SignalAction { kShutDown, kRescan, kIgnore };

SignalAction ActionFor(int signo) {
  if (signo == SIGHUP) return SignalAction::kRescan;
  if (signo == SIGUSR1 || signo == SIGUSR2 || signo >= SIGRTMIN) return SignalAction::kIgnore;
  return SignalAction::kShutDown;
}

sigset_t DaemonSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGXCPU,
                    SIGXFSZ, SIGSTKFLT, SIGPWR})
    sigaddset(&set, signo);
  for (int signo = SIGRTMIN; signo <= SIGRTMAX; ++signo) sigaddset(&set, signo);
  return set;
}

std::string SignalName(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

// The main loop: waits in poll() for a signal (signalfd), a device event or the next tick.
// Once a tick (1 s, or half the watchdog interval) the detector sees a fresh snapshot and the
// watchdog is fed; a due event rescan publishes the new topology at once. Returns the signal
// that ended it, or -1 on an error.
int ServeUntilSignal(const Config& config, Sources& sources, std::shared_ptr<BpfProbes>* published,
                     DeviceNamer& namer, DeviceWatch& watch, TopologyNames* names, TopologyKeeper* topology,
                     CollapseDetector* detector, StateCollector* state, HttpServer* server) {
  const uint64_t watchdog_usec = SdWatchdogUsec();
  const Duration tick = std::chrono::milliseconds(
      watchdog_usec > 0 ? static_cast<long>(std::min<uint64_t>(watchdog_usec / 2000, 1000)) : 1000);
  const sigset_t wait_set = DaemonSignals();
  bool reported_stuck = false;
  const int signal_fd = signalfd(-1, &wait_set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) {
    LogError(std::string("signalfd: ") + strerror(errno));
    return -1;
  }
  TimePoint next_tick = TopologyKeeper::Now() + tick;
  int exit_signal = 0;
  uint64_t ticks = 0;
  while (exit_signal == 0) {
    TimePoint wake = next_tick;
    if (watch.pending()) wake = std::min(wake, watch.due());
    if (sources.loading) wake = std::min(wake, sources.loading->deadline());
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake - TopologyKeeper::Now()).count();
    // A descriptor of -1 is skipped by poll(): no device events, no load in flight.
    const int loader_fd = sources.loading ? sources.loading->fd() : -1;
    pollfd fds[3] = {{signal_fd, POLLIN, 0}, {watch.fd(), POLLIN, 0}, {loader_fd, POLLIN, 0}};
    const int ready = poll(fds, 3, static_cast<int>(std::max<int64_t>(wait, 0)));
    if (ready < 0 && errno != EINTR) {
      LogError(std::string("poll: ") + strerror(errno));
      close(signal_fd);
      return -1;
    }
    bool rescanned = false;
    if (ready > 0 && (fds[0].revents & POLLIN)) {
      signalfd_siginfo info{};
      while (read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
        const int signo = static_cast<int>(info.ssi_signo);
        switch (ActionFor(signo)) {
          case SignalAction::kShutDown:
            exit_signal = signo;
            break;
          case SignalAction::kRescan:
            LogInfo("SIGHUP: rescanning block devices in " + config.sysfs_root);
            topology->Rescan();
            rescanned = true;
            break;
          case SignalAction::kIgnore:
            LogWarn("received " + SignalName(signo) + " from pid " + std::to_string(info.ssi_pid) +
                    ": ignored (SIGTERM stops mergewatchd, SIGHUP rescans devices)");
            break;
        }
      }
      if (exit_signal != 0) break;
    }
    // POLLERR too: a pending ENOBUFS must be read off the socket, or poll() would return at once forever.
    if (ready > 0 && watch.fd() >= 0 && (fds[1].revents & (POLLIN | POLLERR)))
      watch.OnReadable(TopologyKeeper::Now(), names, *topology);
    bool after_loss = false;
    if (const std::optional<std::string> why = watch.TakeDue(TopologyKeeper::Now(), &after_loss)) {
      topology->Rescan();
      rescanned = true;
      // After lost events the rescan is the only news of what they were: worth the info level.
      Log(after_loss ? LogLevel::kInfo : LogLevel::kDebug,
          "rescanned block devices after " + *why + ": " + std::to_string(topology->current()->devices().size()) +
              " devices");
    }
    if (sources.loading) {
      const bool answered = ready > 0 && (fds[2].revents & (POLLIN | POLLHUP | POLLERR));
      const bool give_up = !answered && TopologyKeeper::Now() >= sources.loading->deadline();
      if (answered || give_up || sources.loading->fd() < 0)
        FinishBpfRetry(&sources, give_up, *topology->current(), published);
    }
    const TimePoint now = TopologyKeeper::Now();
    if (now >= next_tick || rescanned) {
      // Fed only while every HTTP event loop has come round within the watchdog interval: a
      // loop stuck in a handler (bcrypt, a scrape) gets the daemon restarted, not kept alive
      // by a main loop that is fine.
      if (watchdog_usec > 0) {
        const auto within = std::chrono::microseconds(watchdog_usec / 2);
        if (server->WorkersAlive(within)) {
          SdNotify("WATCHDOG=1");
          reported_stuck = false;
        } else if (!reported_stuck) {
          LogError("an HTTP event loop has not come round for " + std::to_string(watchdog_usec / 2000000) +
                   " s: not feeding the systemd watchdog");
          reported_stuck = true;
        }
      }
      StartBpfRetry(config, &sources, now);
      Tick(sources, namer, topology, detector, state);
      next_tick = now + tick;
      if (config.fail_after_ticks != 0 && ++ticks >= config.fail_after_ticks) {
        LogError("--debug.fail-after-ticks=" + std::to_string(config.fail_after_ticks) + " reached: failing");
        close(signal_fd);
        return -1;
      }
    }
  }
  close(signal_fd);
  return exit_signal;
}

}  // namespace

namespace {

// The line a fault signal leaves before the process dies of it (LogFromSignalHandler: async-signal-safe,
// in the configured log format). It re-raises with the default action, so the exit status and a core dump
// are what they would have been.
void LogFaultAndDie(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  const char* parts[] = {"fatal signal SIG", abbrev != nullptr ? abbrev : "?",
                         ": mergewatchd dies (BPF links are detached by the kernel as the process exits)"};
  LogFromSignalHandler(parts, 3);
  signal(signo, SIG_DFL);
  raise(signo);
}

}  // namespace

void BlockDaemonSignals() {
  const sigset_t set = DaemonSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A client that goes away mid-response must cost an EPIPE, not the process.
  signal(SIGPIPE, SIG_IGN);
  struct sigaction action {};
  action.sa_handler = LogFaultAndDie;
  action.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  for (int signo : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGSYS, SIGTRAP}) sigaction(signo, &action, nullptr);
}

// Listening sockets not yet handed to the HTTP server: closed if startup fails first.
class Listeners {
 public:
  ~Listeners() {
    for (int fd : fds_) close(fd);
  }
  void Add(int fd) { fds_.push_back(fd); }
  const std::vector<int>& fds() const { return fds_; }
  std::vector<int> Release() { return std::move(fds_); }
  std::string Names() const {
    std::string names;
    for (int fd : fds_) names += (names.empty() ? "" : ", ") + SocketName(fd);
    return names;
  }

 private:
  std::vector<int> fds_;
};

bool OpenListeners(const Config& config, Listeners* listeners, std::string* error) {
  if (config.systemd_socket) {
    for (int fd : SystemdListenFds(error)) listeners->Add(fd);
    if (listeners->fds().empty()) *error = "the systemd sockets: " + *error;
    return !listeners->fds().empty();
  }
  for (const std::string& text : config.listen_addresses) {
    ListenAddress address;
    if (!ParseListenAddress(text, &address, error)) return false;
    const int fd = OpenListener(address, error);
    if (fd < 0) {
      *error = text + ": " + *error + " (is another mergewatchd or exporter using the port? pick another with "
                                      "--web.listen-address)";
      return false;
    }
    listeners->Add(fd);
  }
  return true;
}

// Each connection is a descriptor: the soft limit (1024 by default) would cap the server
// far below its connection limit. The hard limit is the operator's (LimitNOFILE=).
void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) LogWarn(std::string("cannot raise RLIMIT_NOFILE: ") + strerror(errno));
}

// One scrape: every collector's families, label values made UTF-8, in the text format.
std::string RenderScrape(const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables,
                         const DeviceFilter& devices) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& collectable : collectables) {
    try {
      for (prometheus::MetricFamily& f : collectable->Collect()) families.push_back(std::move(f));
    } catch (const std::exception& e) {
      LogError(std::string("scrape: a collector failed: ") + e.what());
    }
  }
  DropExcludedDevices(devices, &families);
  return RenderExposition(std::move(families));
}

int RunDaemon(const Config& config) {
  SetLogLevel(config.log_level);
  SetLogFormat(config.log_format);
  LogInfo("starting mergewatchd " + VersionString() + " on kernel " + KernelRelease());
  SdNotify("STATUS=starting");
  RaiseFileLimit();
  for (const std::string& warning : config.deprecated_flags) LogWarn(warning);
  LogInfo("series for " + config.devices.Describe());

  std::string error;
  HttpOptions http;
  http.telemetry_path = config.telemetry_path;
  http.web_config_file = config.web_config_file;
  if (!config.web_config_file.empty() &&
      !LoadWebConfig(config.web_config_file, &http.web, &http.secrets, &error)) {
    Fail("--web.config.file: " + error, kExitUsage);
    return kExitUsage;
  }
  // An empty file, comments only, or an empty basic_auth_users: the operator asked for security
  // and got none. Still valid (exporter-toolkit starts too), but never silently.
  if (!config.web_config_file.empty() && !http.web.tls() && http.web.users.empty())
    LogWarn("--web.config.file " + config.web_config_file +
            " enables neither TLS (tls_server_config) nor basic auth (basic_auth_users): serving plain HTTP "
            "without authentication");
  http.allowed_hosts = config.allowed_hosts;
  http.counts = std::make_shared<HttpDefenceCounts>();

  // Listen first: a taken port is the cheapest failure to report, before any BPF work.
  Listeners listeners;
  if (!OpenListeners(config, &listeners, &error)) {
    Fail("cannot listen on " + error, kExitListen);
    return kExitListen;
  }
  const std::string listen_names = listeners.Names();

  SourceChoice choice = SourceChoice::kAuto;
  if (!ParseSourceChoice(config.source, &choice)) {
    Fail("--source: \"" + config.source + "\" is not auto, bpf or diskstats", kExitUsage);
    return kExitUsage;
  }
  Sources sources(config.topology_refresh);
  SourceStatus source_status;
  if (choice == SourceChoice::kDiskstats) {
    source_status = DiskstatsStatus("--source=diskstats");
    LogInfo("--source=diskstats: no BPF; detection runs on diskstats (reduced evidence: no per-request sizes, "
            "missed merges, latencies or remap origins)");
  } else {
    SdNotify("STATUS=loading BPF programs");
    ProbeError kind = ProbeError::kNone;
    // Waits for the loader (kLoaderTimeout at most, well inside TimeoutStartSec; systemd's
    // watchdog starts only at READY=1).
    sources.bpf = BpfProbes::Load(LoaderOptions(config, &sources), &kind, &error);
    if (!sources.bpf && choice == SourceChoice::kBpf) {
      Fail(error, ExitCodeFor(kind));
      return ExitCodeFor(kind);
    }
    if (sources.bpf) {
      LogInfo("attached " + std::to_string(sources.bpf->attached_count()) + " BPF programs using " +
              sources.bpf->mode());
    } else {
      // --source=auto: a dark host is worse than reduced evidence, but never a silent downgrade.
      // Only a verifier refusal is lockdown's doing: a missing capability is refused first, and says so.
      if (kind == ProbeError::kLoad && LockdownMode(config.sysfs_root) == "confidentiality")
        error = "kernel lockdown=confidentiality (BPF may not read kernel memory): " + error;
      sources.retry.Failed(TopologyKeeper::Now(), kind, error);
      source_status = DiskstatsStatus(error);
      LogWarn("BPF cannot run: " + error + ". Detection runs on diskstats instead (reduced evidence: no "
              "per-request sizes, missed merges, latencies or remap origins; see mergewatch_detection_info); " +
              RetryPlan(sources.retry));
    }
  }
  std::shared_ptr<SnapshotSource> first_source = sources.bpf;
  if (!first_source) first_source = std::make_shared<DiskstatsSource>(config.procfs_root, config.sysfs_root);
  ActiveSource active(first_source, source_status);
  sources.active = &active;
  // What the scrapes' program-cost collector reads: swapped atomically when a BPF retry succeeds.
  std::shared_ptr<BpfProbes> published_bpf = sources.bpf;

  SysfsDeviceNamer namer(config.sysfs_root);
  DaemonStatus status{VersionString(), KernelRelease(), 1u << InflightSlotBits(config.inflight_entries)};
  // The table is indexed by hash bits, so its size is a power of two: say so when the flag was not.
  if (status.inflight_capacity != config.inflight_entries)
    LogInfo("in-flight table: " + std::to_string(status.inflight_capacity) + " slots (--bpf.inflight-entries=" +
            std::to_string(config.inflight_entries) + " rounded up to a power of two)");
  DeviceWatch watch;  // before the first scan: a device added meanwhile is not missed
  // Scrapes name devices from the topology while the events say it is current, else by sysfs.
  TopologyNames names(namer, watch.fd() >= 0 ? std::function<bool()>([&watch] { return watch.Unread(); })
                                             : std::function<bool()>());
  auto collector = std::make_shared<MetricsCollector>(active, names, status);
  auto state = std::make_shared<StateCollector>();
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables = {
      collector, state, std::make_shared<DetectionInfoCollector>(active),
      std::make_shared<DefenceCollector>(http.counts, http.limits.connections_per_address,
                                         http.limits.connection_limit)};
  if (!config.disable_exporter_metrics) {
    std::shared_ptr<BpfProbes>* p = &published_bpf;
    collectables.push_back(std::make_shared<SelfCollector>([p] {
      const std::shared_ptr<BpfProbes> probes = std::atomic_load(p);
      return probes ? probes->ProgramCosts() : std::vector<ProgramCost>{};
    }));
  }

  TopologyKeeper topology(config.sysfs_root, config.topology_refresh);
  // Queue findings follow every scan (the refresh interval, SIGHUP, device events); changes are logged.
  const std::string kernel_release = status.kernel_release;
  std::vector<QueueFinding> findings;
  topology.OnScan([&names, &watch, &state, &findings, kernel_release](std::shared_ptr<const Topology> current) {
    std::vector<QueueFinding> now = FindQueueConfigProblems(*current, kernel_release);
    for (const FindingChange& change : DescribeFindingChanges(findings, now)) {
      if (change.appeared) LogWarn(change.text);
      else LogInfo(change.text);
    }
    findings = now;
    state->PublishFindings(std::move(now));
    names.Publish(std::move(current), watch.pending());
  });
  if (sources.bpf) TraceBioLevelWhereNeeded(*topology.current(), sources.bpf.get());
  CollapseDetector detector(config.collapse);
  state->Publish(topology.current(), detector.Verdicts());
  http.status = [state] { return StatusJson({VersionString(), state->Verdicts(), state->Findings()}); };

  // Declared after everything a scrape reads (probes, namer, collectors): on every way out of
  // this function, return or exception, the server is destroyed first, and its destructor
  // returns only once no scrape runs.
  std::unique_ptr<HttpServer> server = HttpServer::Start(
      listeners.Release(), http,
      [collectables, devices = config.devices] { return RenderScrape(collectables, devices); }, &error);
  if (!server) {
    Fail(error, kExitListen);
    return kExitListen;
  }
  LogInfo("listening on " + listen_names + (http.web.tls() ? " (TLS)" : "") +
          (http.web.users.empty() ? "" : " (basic auth)") + ", metrics at " + config.telemetry_path +
          ", detector status at " + StatusPathFor(config.telemetry_path));

  std::string ready_status =
      "serving " + config.telemetry_path + " on " + listen_names + ", " +
      (sources.bpf ? std::to_string(sources.bpf->attached_count()) + " programs attached (" + sources.bpf->mode() + ")"
                   : std::string("on diskstats (reduced evidence, no BPF)"));
  SdNotify("READY=1\nSTATUS=" + ready_status);
  LogInfo("ready: " + ready_status);

  const int exit_signal =
      ServeUntilSignal(config, sources, &published_bpf, namer, watch, &names, &topology, &detector, state.get(),
                       server.get());
  if (exit_signal < 0) return kExitFailure;

  LogInfo("received " + SignalName(exit_signal) + " (" + strsignal(exit_signal) + "), shutting down");
  SdNotify("STOPPING=1\nSTATUS=stopping");
  server.reset();  // scrapes in flight finish first (bounded); none can touch the maps past this point
  collectables.clear();
  collector.reset();
  state.reset();
  const bool had_bpf = sources.bpf != nullptr;
  std::atomic_store(&published_bpf, std::shared_ptr<BpfProbes>());
  sources.loading.reset();  // a retry's loader still running is killed and reaped
  sources.bpf.reset();
  active.Switch(nullptr, active.status());  // the last owner of the probes: destroys every link
  LogInfo(had_bpf ? "BPF programs detached, exiting" : "exiting");
  return kExitOk;
}

}  // namespace mergewatch
