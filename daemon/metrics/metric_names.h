// SPDX-License-Identifier: Apache-2.0
// The names of the metric families that both the exporter (daemon/metrics/) and the `mergewatch`
// command (cli/) use: the exporter builds its families with these constants and the command looks
// them up by the same ones, so renaming a metric changes both or breaks the build, never only the
// tool. Header-only: the command includes it without linking the daemon.
#pragma once

namespace mergewatch::metric_names {

// Histograms: the text exposition adds _bucket, _sum and _count to these.
inline constexpr char kRequestSizeBytes[] = "mergewatch_request_size_bytes";
inline constexpr char kRequestLatencySeconds[] = "mergewatch_request_latency_seconds";
inline constexpr char kBioSizeBytes[] = "mergewatch_bio_size_bytes";
// A volume's requests at the disks below it (labels device, origin, op).
inline constexpr char kRemappedRequestLatencySeconds[] = "mergewatch_remapped_request_latency_seconds";
inline constexpr char kRemappedDispatchedRequestsTotal[] = "mergewatch_remapped_dispatched_requests_total";
inline constexpr char kRemappedDispatchedBytesTotal[] = "mergewatch_remapped_dispatched_bytes_total";
// Counters (their names carry _total already).
inline constexpr char kBioMergesTotal[] = "mergewatch_bio_merges_total";
inline constexpr char kMissedMergesTotal[] = "mergewatch_missed_merges_total";
// Gauges.
inline constexpr char kBuildInfo[] = "mergewatch_build_info";
inline constexpr char kDeviceInfo[] = "mergewatch_device_info";
inline constexpr char kDeviceHolderInfo[] = "mergewatch_device_holder_info";
inline constexpr char kQueueNomerges[] = "mergewatch_queue_nomerges";
inline constexpr char kQueueMaxSectorsBytes[] = "mergewatch_queue_max_sectors_bytes";
inline constexpr char kQueueRotational[] = "mergewatch_queue_rotational";
inline constexpr char kQueueSchedulerInfo[] = "mergewatch_queue_scheduler_info";
inline constexpr char kMergeCollapse[] = "mergewatch_merge_collapse";

}  // namespace mergewatch::metric_names
