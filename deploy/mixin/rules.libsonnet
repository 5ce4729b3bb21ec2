// SPDX-License-Identifier: Apache-2.0
// prometheusRules: recording rules for dashboards and ad-hoc queries. Idle devices get no sample instead of NaN.
// Every selector is the configured one (mergewatchSelector) and every range recordingRange.
{
  prometheusRules+:: {
    local c = $._config,
    local sel(extra='') = '{%s%s}' % [c.mergewatchSelector, extra],
    local r = '[%(recordingRange)s]' % c,
    local name(level, metric, what) = '%s:%s:%s_rate%s' % [level, metric, what, c.recordingRange],
    groups+: [{
      name: 'mergewatch.recording',
      rules: [
        // p99 device time (dispatch to completion) per device, all ops together and per op.
        {
          record: name('instance_device', 'mergewatch_request_latency_seconds', 'p99'),
          expr: |||
            histogram_quantile(0.99, sum without (op) (rate(mergewatch_request_latency_seconds_bucket%(sel)s%(r)s)))
            and on (job, instance, device)
            sum without (op) (rate(mergewatch_request_latency_seconds_count%(sel)s%(r)s)) > 0
          ||| % { sel: sel(), r: r, le: sel(', le="4096"') },
        },
        {
          record: name('instance_device_op', 'mergewatch_request_latency_seconds', 'p99'),
          expr: |||
            histogram_quantile(0.99, rate(mergewatch_request_latency_seconds_bucket%(sel)s%(r)s))
            and on (job, instance, device, op)
            rate(mergewatch_request_latency_seconds_count%(sel)s%(r)s) > 0
          ||| % { sel: sel(), r: r, le: sel(', le="4096"') },
        },
        // Mean request size at dispatch (bytes per request): the avgrq-sz/rareq-sz of iostat, in bytes.
        {
          record: name('instance_device', 'mergewatch_request_size_bytes', 'mean'),
          expr: |||
            sum without (op) (rate(mergewatch_request_size_bytes_sum%(sel)s%(r)s))
            / (sum without (op) (rate(mergewatch_request_size_bytes_count%(sel)s%(r)s)) > 0)
          ||| % { sel: sel(), r: r, le: sel(', le="4096"') },
        },
        {
          record: name('instance_device_op', 'mergewatch_request_size_bytes', 'mean'),
          expr: |||
            rate(mergewatch_request_size_bytes_sum%(sel)s%(r)s)
            / (rate(mergewatch_request_size_bytes_count%(sel)s%(r)s) > 0)
          ||| % { sel: sel(), r: r, le: sel(', le="4096"') },
        },
        // Share of requests of 4 KiB or less. High on its own is NOT a problem (random I/O); it is context
        // for the collapse alert and for dashboards.
        {
          record: name('instance_device', 'mergewatch_request_size_bytes_le4096', 'ratio'),
          expr: |||
            sum without (op, le) (rate(mergewatch_request_size_bytes_bucket%(le)s%(r)s))
            / (sum without (op) (rate(mergewatch_request_size_bytes_count%(sel)s%(r)s)) > 0)
          ||| % { sel: sel(), r: r, le: sel(', le="4096"') },
        },
      ],
    }],
  },
}
