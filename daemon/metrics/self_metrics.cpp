// SPDX-License-Identifier: Apache-2.0
#include "metrics/self_metrics.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sstream>

#include "log.h"

namespace mergewatch {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily One(const std::string& name, const std::string& help, MetricType type, double value) {
  MetricFamily family{name, help, type, {}};
  ClientMetric metric;
  if (type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

double Seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

bool ParseProcStat(const std::string& stat, long ticks_per_second, long page_size, double boot_time_seconds,
                   ProcessStats* stats) {
  // "pid (comm) state ppid ...": comm is whatever the process named itself; skip to its last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || ticks_per_second <= 0) return false;
  std::istringstream fields(stat.substr(close + 1));
  std::vector<std::string> f;  // f[0] is field 3 (state)
  for (std::string word; fields >> word;) f.push_back(word);
  if (f.size() < 22) return false;
  try {
    const double ticks = static_cast<double>(ticks_per_second);
    stats->cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / ticks;     // utime, stime (fields 14, 15)
    stats->start_time_seconds = boot_time_seconds + std::stod(f[19]) / ticks;  // starttime (22)
    stats->virtual_bytes = std::stod(f[20]);                                 // vsize (23)
    stats->resident_bytes = std::stod(f[21]) * static_cast<double>(page_size);  // rss pages (24)
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

double CountOpenFdsByStat() {
  // The number of open descriptors as the directory's size: "proc: report open files as size in
  // stat() for /proc/pid/fd", f1f1f2569901ec5b9d425f2e91c09a0e320768f3 (6.2). One system call
  // instead of an open, two getdents64 and a close (proc_readfd builds an entry per descriptor).
  // Before 6.2 the size is 0, which no live process has (this one holds stdio and BPF fds).
  struct stat st {};
  if (stat("/proc/self/fd", &st) != 0 || st.st_size <= 0) return -1;
  return static_cast<double>(st.st_size);
}

double CountOpenFdsByListing() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  double fds = 0;
  while (const dirent* entry = readdir(dir))
    if (entry->d_name[0] != '.') ++fds;
  closedir(dir);
  return fds - 1;  // not the one opendir itself holds
}

double CountOpenFds() {
  const double by_stat = CountOpenFdsByStat();
  return by_stat >= 0 ? by_stat : CountOpenFdsByListing();
}

bool ReadSelfStats(ProcessStats* stats, std::string* error) {
  // One read into a buffer on the stack, not an ifstream (a locale and a filebuf per scrape). The
  // line is about 300 bytes: the command name is at most 15 characters, 52 fields of at most 20
  // digits each.
  char buf[1536];
  ssize_t n = -1;
  const int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    n = read(fd, buf, sizeof buf);
    close(fd);
  }
  if (n <= 0) {
    *error = "cannot read /proc/self/stat";
    return false;
  }
  const std::string stat(buf, static_cast<size_t>(n));
  // Boot time from two clocks rather than /proc/stat's btime: the hardened unit's ProcSubset=pid
  // hides /proc/stat. starttime counts from boot on CLOCK_BOOTTIME.
  const double boot_time = Seconds(CLOCK_REALTIME) - Seconds(CLOCK_BOOTTIME);
  if (!ParseProcStat(stat, sysconf(_SC_CLK_TCK), sysconf(_SC_PAGESIZE), boot_time, stats)) {
    *error = "cannot parse /proc/self/stat";
    return false;
  }
  stats->open_fds = CountOpenFds();
  if (stats->open_fds < 0) {
    *error = "cannot list /proc/self/fd";
    return false;
  }
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  stats->max_fds = limit.rlim_cur == RLIM_INFINITY ? -1 : static_cast<double>(limit.rlim_cur);
  return true;
}

std::vector<MetricFamily> ProcessFamilies(const ProcessStats& s) {
  return {
      One("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", MetricType::Counter,
          s.cpu_seconds),
      One("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge, s.max_fds),
      One("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, s.open_fds),
      One("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge, s.resident_bytes),
      One("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
          s.start_time_seconds),
      One("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge, s.virtual_bytes),
  };
}

std::vector<MetricFamily> ProgramCostFamilies(const std::vector<ProgramCost>& costs) {
  MetricFamily time{"mergewatch_bpf_program_run_seconds_total",
                    "CPU time the BPF program on this tracepoint has run (bpf_prog_info run_time_ns). Counts only "
                    "while sysctl kernel.bpf_stats_enabled=1 (off by default: it costs two clock reads per run).",
                    MetricType::Counter,
                    {}};
  MetricFamily runs{"mergewatch_bpf_program_runs_total",
                    "Times the BPF program on this tracepoint has run (bpf_prog_info run_cnt). Counts only while "
                    "sysctl kernel.bpf_stats_enabled=1.",
                    MetricType::Counter,
                    {}};
  time.metric.reserve(costs.size());
  runs.metric.reserve(costs.size());
  for (const ProgramCost& c : costs) {
    ClientMetric m;
    m.label = {{"tracepoint", c.tracepoint}, {"mode", c.mode}};
    m.counter.value = static_cast<double>(c.run_time_ns) * 1e-9;
    time.metric.push_back(m);
    m.counter.value = static_cast<double>(c.run_count);
    runs.metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> families;
  families.reserve(2);
  families.push_back(std::move(time));
  families.push_back(std::move(runs));
  return families;
}

std::vector<MetricFamily> SelfCollector::Collect() const {
  std::vector<MetricFamily> families;
  ProcessStats stats;
  std::string error;
  if (ReadSelfStats(&stats, &error)) {
    families = ProcessFamilies(stats);
  } else {
    LogWarn("process metrics: " + error);
  }
  for (MetricFamily& f : ProgramCostFamilies(costs_())) families.push_back(std::move(f));
  return families;
}

}  // namespace mergewatch
