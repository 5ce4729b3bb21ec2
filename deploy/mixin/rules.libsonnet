// SPDX-License-Identifier: Apache-2.0
// prometheusRules: recording rules for dashboards and ad-hoc queries. Idle devices get no sample instead of NaN.
{
  prometheusRules+:: {
    groups+: [{
      name: 'mergewatch.recording',
      rules: [
        // p99 device time (dispatch to completion) per device, all ops together and per op.
        {
          record: 'instance_device:mergewatch_request_latency_seconds:p99_rate5m',
          expr: |||
            histogram_quantile(0.99, sum without (op) (rate(mergewatch_request_latency_seconds_bucket[5m])))
            and on (job, instance, device)
            sum without (op) (rate(mergewatch_request_latency_seconds_count[5m])) > 0
          |||,
        },
        {
          record: 'instance_device_op:mergewatch_request_latency_seconds:p99_rate5m',
          expr: |||
            histogram_quantile(0.99, rate(mergewatch_request_latency_seconds_bucket[5m]))
            and on (job, instance, device, op)
            rate(mergewatch_request_latency_seconds_count[5m]) > 0
          |||,
        },
        // Mean request size at dispatch (bytes per request): the avgrq-sz/rareq-sz of iostat, in bytes.
        {
          record: 'instance_device:mergewatch_request_size_bytes:mean_rate5m',
          expr: |||
            sum without (op) (rate(mergewatch_request_size_bytes_sum[5m]))
            / (sum without (op) (rate(mergewatch_request_size_bytes_count[5m])) > 0)
          |||,
        },
        {
          record: 'instance_device_op:mergewatch_request_size_bytes:mean_rate5m',
          expr: |||
            rate(mergewatch_request_size_bytes_sum[5m])
            / (rate(mergewatch_request_size_bytes_count[5m]) > 0)
          |||,
        },
        // Share of requests of 4 KiB or less. High on its own is NOT a problem (random I/O); it is context
        // for the collapse alert and for dashboards.
        {
          record: 'instance_device:mergewatch_request_size_bytes_le4096:ratio_rate5m',
          expr: |||
            sum without (op, le) (rate(mergewatch_request_size_bytes_bucket{le="4096"}[5m]))
            / (sum without (op) (rate(mergewatch_request_size_bytes_count[5m])) > 0)
          |||,
        },
      ],
    }],
  },
}
