// SPDX-License-Identifier: Apache-2.0
// The exporter's own metrics: the process_* families every Prometheus exporter has, and what
// the BPF programs cost. --web.disable-exporter-metrics leaves this collector out.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <functional>
#include <string>
#include <vector>

#include "source/bpf_probes.h"

namespace mergewatch {

// Values from /proc/<pid>/stat, /proc/<pid>/fd and getrlimit, as client_golang's process collector reads them.
struct ProcessStats {
  double cpu_seconds = 0;
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double open_fds = 0;
  double max_fds = 0;
  double start_time_seconds = 0;  // since the Unix epoch
};

// Parses the content of /proc/<pid>/stat (the command name may hold spaces and ')').
// ticks_per_second from sysconf(_SC_CLK_TCK); boot_time_seconds is when the clock of
// field 22 started, in Unix time. false when the text is malformed.
bool ParseProcStat(const std::string& stat, long ticks_per_second, long page_size, double boot_time_seconds,
                   ProcessStats* stats);

// This process, now. false (with `error`) if /proc is not readable.
bool ReadSelfStats(ProcessStats* stats, std::string* error);

// This process's open file descriptors: the size stat() reports for /proc/self/fd (one system
// call; Linux 6.2+), else the listing. -1 when neither can be read.
double CountOpenFds();
// The same by listing /proc/self/fd (not counting the listing's own descriptor), -1 if unreadable;
// and by stat(), -1 where the kernel does not report it (before 6.2: size 0).
double CountOpenFdsByListing();
double CountOpenFdsByStat();

std::vector<prometheus::MetricFamily> ProcessFamilies(const ProcessStats& stats);
std::vector<prometheus::MetricFamily> ProgramCostFamilies(const std::vector<ProgramCost>& costs);

class SelfCollector final : public prometheus::Collectable {
 public:
  explicit SelfCollector(std::function<std::vector<ProgramCost>()> costs) : costs_(std::move(costs)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::function<std::vector<ProgramCost>()> costs_;
};

}  // namespace mergewatch
