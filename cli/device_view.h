// SPDX-License-Identifier: Apache-2.0
// What `mergewatch status` and `top` show, computed from two scrapes and the /status document:
// pure, so the figures are tested on fixed texts.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exposition_parser.h"
#include "status_doc.h"

namespace mergewatch::cli {

// A histogram summed over its op label: cumulative counts by upper bound (+Inf included).
struct Histogram {
  std::map<double, double> cumulative;
  double count = 0;
  double sum = 0;
};

// The raw counters of one device, summed over ops.
struct Counters {
  Histogram request_size;  // bytes, at dispatch (request-based devices)
  Histogram latency;       // seconds, dispatch to completion
  Histogram bio_size;      // bytes, bios a bio-based (dm, md) device received
  double back_merges = 0;
  double front_merges = 0;
  double missed_merges = 0;
  // A volume's (an upper device's) requests at the disks below it, summed over them
  // (mergewatch_remapped_dispatched_* and _request_latency_seconds by origin).
  double volume_requests = 0;
  double volume_bytes = 0;
  Histogram volume_latency;
};

struct QueueSettings {
  int nomerges = -1;  // -1: not exported (partitions, bio-based devices)
  std::string scheduler;
  double max_sectors_kb = -1;
  int rotational = -1;
};

struct DeviceFacts {
  std::string name;
  std::string kind;
  std::string disk;     // the whole disk of a partition; == name otherwise
  std::string dm_name;  // device-mapper name, if any
  std::vector<std::string> holders;  // devices built on this one
  QueueSettings queue;
  Counters counters;
  bool has_series = false;  // any I/O series at all in this scrape
};

// One scrape, by device.
struct ScrapeFacts {
  std::string version;
  std::map<std::string, DeviceFacts> devices;
  std::map<std::string, std::string> collapsed;  // mergewatch_merge_collapse == 1: device -> upper
};

// Reads the families the command uses (metric_names.h); everything else is ignored.
ScrapeFacts ReadScrape(const std::vector<Sample>& samples);

// after - before, bucket by bucket; a count that went down (daemon restarted) counts from zero.
Histogram Delta(const Histogram& before, const Histogram& after);
// Like PromQL's histogram_quantile: linear within the bucket; the highest finite bound when it
// falls in +Inf; NaN without samples or without any finite bucket (the diskstats source).
double Quantile(const Histogram& delta, double q);
// The share of samples in each bucket that has any, by upper bound.
std::vector<std::pair<double, double>> Shares(const Histogram& delta);

struct DeviceRow {
  std::string name;
  std::string kind;
  std::string dm_name;
  std::string tree_prefix;  // "", "└─", "│ ├─"...: lsblk's drawing, holders below what they use
  std::vector<std::string> holders;
  QueueSettings queue;
  bool request_based = false;  // has request series
  bool bio_based = false;      // has bio series
  // A volume: its requests at the disks below it fill the request columns (requests_per_second,
  // mean_request_bytes, the latencies); no merge columns.
  bool volume = false;
  double requests_per_second = 0;
  double mean_request_bytes = 0;  // NaN when no request in the interval
  double bios_per_second = 0;
  double mean_bio_bytes = 0;      // NaN when no bio in the interval
  double merges_per_second = 0;
  double missed_merges_per_second = 0;
  double missed_merge_ratio = 0;  // of the requests in the interval
  double latency_p50_seconds = 0;  // NaN when unknown
  double latency_p99_seconds = 0;
  std::vector<std::pair<double, double>> request_sizes;  // (upper bound, share)
  std::vector<std::pair<double, double>> bio_sizes;
  Counters before, after;
  bool collapsed = false;  // a merge collapse is active (raised) on it
  bool pending = false;    // the pattern holds, not raised yet
  bool finding = false;    // a queue finding holds on it
};

struct View {
  double seconds = 0;
  std::string version;
  std::vector<DeviceRow> tree;  // lsblk order
  std::vector<Verdict> verdicts;  // every verdict; ones the scrape raised but /status lacks added
  std::vector<Finding> findings;
};

// `all`: every device; otherwise the stacks where any device has I/O series, a verdict or a finding.
View BuildView(const ScrapeFacts& before, const ScrapeFacts& after, double seconds, const StatusDoc& status, bool all);

// 0 nothing active, 1 a merge collapse active, 3 only queue findings.
int ExitStatusOf(const View& view);

}  // namespace mergewatch::cli
