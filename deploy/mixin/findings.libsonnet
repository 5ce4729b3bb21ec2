// SPDX-License-Identifier: Apache-2.0
// prometheusAlerts: the queue findings ticket (issue 26). The daemon decides each finding from sysfs
// (daemon/findings/); this only holds it for queueFindingFor and says what it means. A warning, not a page:
// nothing is broken yet, the host is configured to be slower than it should be.
local fold(text) = std.join(' ', std.split(std.rstripChars(text, '\n'), '\n'));  // YAML's `>-`

{
  prometheusAlerts+:: {
    local c = $._config,
    local q(metric) = '{{ with printf "%s{job=\'%%s\',instance=\'%%s\',device=\'%%s\'}" $labels.job $labels.instance $labels.device | query }}' % metric,
    groups+: [{
      name: 'mergewatch.findings',
      rules: [{
        alert: 'MergewatchQueueConfigFinding',
        expr: 'mergewatch_queue_config_finding{%(mergewatchSelector)s} == 1' % c,
        'for': c.queueFindingFor,
        labels: { severity: c.warningSeverity },
        annotations: {
          summary: 'A disk runs with a queue setting that costs latency or throughput.',
          description: fold(|||
            Host {{ $labels.instance }}, disk {{ $labels.device }}: {{ $labels.finding }}.
            {{ if eq $labels.finding "rotational_without_scheduler" }}A rotational disk with one hardware queue runs
            the none scheduler, so requests reach it in submission order, unsorted and with fewer merges.
            %(elevators)s{{ if eq (. | first | value) 0.0 }}No elevator is built in or loaded (queue/scheduler lists
            only none): load mq-deadline, then set it.{{ else }}{{ . | first | value }} elevator(s) are available in
            queue/scheduler: set mq-deadline.{{ end }}{{ end }}{{ end }}{{ if eq $labels.finding "merging_disabled_under_stack" }}queue/nomerges is
            %(nomerges)s{{ . | first | value }}{{ else }}not 0{{ end }} on a disk under a dm or md device: the
            stacked device's I/O reaches the disk unmerged (the 2019 collapse, before any traffic shows it).
            Set it to 0.{{ end }}{{ if eq $labels.finding "max_sectors_capped" }}queue/max_sectors_kb is
            %(max_sectors)s{{ . | first | value | humanize1024 }}B{{ else }}unknown{{ end }}, a quarter or less of
            what the kernel would use: every large request is split into four or more.{{ end }}
            The daemon's log has the sysfs values and the command that clears it.
          ||| % {
            elevators: q('mergewatch_queue_schedulers_available'),
            nomerges: q('mergewatch_queue_nomerges'),
            max_sectors: q('mergewatch_queue_max_sectors_bytes'),
          }),
          runbook_url: c.runbookURL + '#mergewatchqueueconfigfinding',
        },
      }],
    }],
  },
}
