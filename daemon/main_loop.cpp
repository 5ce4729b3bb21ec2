// SPDX-License-Identifier: Apache-2.0
#include "main_loop.h"

#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"
#include "sd_notify.h"
#include "signals.h"
#include "findings/queue_findings.h"
#include "source/stale_keys.h"

namespace mergewatch {

MainLoop::MainLoop(LoopParts parts, std::string sysfs_root, uint32_t fail_after_ticks)
    : parts_(parts),
      sysfs_root_(std::move(sysfs_root)),
      fail_after_ticks_(fail_after_ticks),
      watchdog_usec_(SdWatchdogUsec()) {}

int MainLoop::Run() {
  const Duration tick = std::chrono::milliseconds(
      watchdog_usec_ > 0 ? static_cast<long>(std::min<uint64_t>(watchdog_usec_ / 2000, 1000)) : 1000);
  const sigset_t wait_set = DaemonSignals();
  const int signal_fd = signalfd(-1, &wait_set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) {
    LogError(std::string("signalfd: ") + strerror(errno));
    return -1;
  }
  TimePoint next_tick = MonotonicNow() + tick;
  uint64_t ticks = 0;
  for (;;) {
    const TimePoint wake =
        std::min({next_tick, parts_.watch.pending() ? parts_.watch.due() : TimePoint::max(),
                  parts_.sources.loader_deadline()});
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake - MonotonicNow()).count();
    // poll() skips a descriptor of -1: no device events, no load in flight.
    pollfd fds[3] = {{signal_fd, POLLIN, 0}, {parts_.watch.fd(), POLLIN, 0}, {parts_.sources.loader_fd(), POLLIN, 0}};
    const int ready = poll(fds, 3, static_cast<int>(std::max<int64_t>(wait, 0)));
    if (ready < 0 && errno != EINTR) {
      LogError(std::string("poll: ") + strerror(errno));
      close(signal_fd);
      return -1;
    }
    bool rescanned = false;
    if (ready > 0 && (fds[0].revents & POLLIN)) {
      if (const int stop = TakeSignals(signal_fd, &rescanned)) {
        close(signal_fd);
        return stop;
      }
    }
    // POLLERR too: a pending ENOBUFS must be read off the socket, or poll() would return at once forever.
    if (ready > 0 && parts_.watch.fd() >= 0 && (fds[1].revents & (POLLIN | POLLERR)))
      parts_.watch.OnReadable(MonotonicNow(), &parts_.names, parts_.topology);
    bool after_loss = false;
    if (const std::optional<std::string> why = parts_.watch.TakeDue(MonotonicNow(), &after_loss)) {
      parts_.topology.Rescan();
      rescanned = true;
      // After lost events the rescan is the only news of what they were: worth the info level.
      Log(after_loss ? LogLevel::kInfo : LogLevel::kDebug,
          "rescanned block devices after " + *why + ": " +
              std::to_string(parts_.topology.current()->devices().size()) + " devices");
    }
    if (parts_.sources.loading()) {
      const bool answered = ready > 0 && (fds[2].revents & (POLLIN | POLLHUP | POLLERR));
      parts_.sources.OnLoaderReady(answered, MonotonicNow(), *parts_.topology.current());
    }
    const TimePoint now = MonotonicNow();
    if (now < next_tick && !rescanned) continue;
    FeedWatchdog();
    parts_.sources.StartRetryIfDue(now);
    Tick(now);
    next_tick = now + tick;
    if (fail_after_ticks_ != 0 && ++ticks >= fail_after_ticks_) {
      LogError("--debug.fail-after-ticks=" + std::to_string(fail_after_ticks_) + " reached: failing");
      close(signal_fd);
      return -1;
    }
  }
}

int MainLoop::TakeSignals(int signal_fd, bool* rescanned) {
  signalfd_siginfo info{};
  int stop = 0;
  while (read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    const int signo = static_cast<int>(info.ssi_signo);
    switch (ActionFor(signo)) {
      case SignalAction::kShutDown:
        stop = signo;
        break;
      case SignalAction::kRescan:
        LogInfo("SIGHUP: rescanning block devices in " + sysfs_root_);
        parts_.topology.Rescan();
        *rescanned = true;
        break;
      case SignalAction::kIgnore:
        LogWarn("received " + SignalName(signo) + " from pid " + std::to_string(info.ssi_pid) +
                ": ignored (SIGTERM stops mergewatchd, SIGHUP rescans devices)");
        break;
    }
    if (stop != 0) return stop;
  }
  return 0;
}

// Fed only while every HTTP event loop has come round within the watchdog interval: a loop stuck
// in a handler (bcrypt, a scrape) gets the daemon restarted, not kept alive by a main loop that is fine.
void MainLoop::FeedWatchdog() {
  if (watchdog_usec_ == 0) return;
  const auto within = std::chrono::microseconds(watchdog_usec_ / 2);
  if (parts_.server.WorkersAlive(within)) {
    SdNotify("WATCHDOG=1");
    reported_stuck_ = false;
  } else if (!reported_stuck_) {
    LogError("an HTTP event loop has not come round for " + std::to_string(watchdog_usec_ / 2000000) +
             " s: not feeding the systemd watchdog");
    reported_stuck_ = true;
  }
}

namespace {

// An onset line names who sent the pair's requests: "; requests from: 97% /backup.slice, 3% other".
std::string ServicesSuffix(const CollapseEvent& event, const std::vector<DiskVerdict>& verdicts) {
  if (!event.onset || event.split) return "";
  for (const DiskVerdict& v : verdicts)
    if (v.device == event.device && v.upper == event.upper && !v.services.empty())
      return "; requests from: " + ServicesText(v.services);
  return "";
}

}  // namespace

void MainLoop::Tick(TimePoint now) {
  Snapshot snapshot;
  try {
    snapshot = parts_.active.Read();
  } catch (const std::exception& e) {
    LogError(std::string(parts_.sources.bpf() ? "reading the BPF maps failed: " : "reading diskstats failed: ") +
             e.what());
    return;
  }
  parts_.topology.RefreshIfDue(HasUnknownDevice(snapshot, *parts_.topology.current()));
  parts_.sources.FollowTopology(*parts_.topology.current());
  parts_.active.LearnPaths(snapshot, *parts_.topology.current());
  ForgetDepartedDevices(snapshot);
  // While a disk shows the pattern, its onset line must name the queue settings of now,
  // not of the last periodic scan: rescan every tick until it is resolved.
  for (const DiskVerdict& v : parts_.detector.Verdicts()) {
    if (v.condition || v.raised) {
      parts_.topology.Rescan();
      break;
    }
  }
  // A disk whose queue finding max_sectors_capped holds gets no split ticket: that finding names the cause.
  std::vector<std::string> capped;
  for (const QueueFinding& f : parts_.state.Findings())
    if (f.finding == kMaxSectorsCapped) capped.push_back(f.device);
  parts_.detector.SetSplitVetoes(std::move(capped));
  const std::vector<CollapseEvent> events = parts_.detector.Update(now, snapshot, *parts_.topology.current());
  std::vector<DiskVerdict> verdicts = parts_.detector.Verdicts();
  parts_.services.Update(now, parts_.active.ReadServices(), *parts_.topology.current(), &verdicts);
  for (const CollapseEvent& event : events)
    Log(event.onset ? LogLevel::kWarn : LogLevel::kInfo, event.message + ServicesSuffix(event, verdicts));
  parts_.state.Publish(parts_.topology.current(), std::move(verdicts));
}

void MainLoop::ForgetDepartedDevices(const Snapshot& snapshot) {
  const StaleKeys stale = FindStaleKeys(snapshot, *parts_.topology.current(), parts_.namer);
  if (stale.empty()) return;
  const size_t moved = parts_.active.ForgetKeepingHeads(stale, *parts_.topology.current());
  LogDebug("dropped the data of removed devices: " + std::to_string(stale.stats.size()) + " device keys, " +
           std::to_string(stale.origins.size()) + " origin keys");
  if (moved > 0)
    LogInfo("a multipath path disk went away: its " + std::to_string(moved) +
            " device keys' counts stay under its head (the head's counters never go backwards)");
}

}  // namespace mergewatch
