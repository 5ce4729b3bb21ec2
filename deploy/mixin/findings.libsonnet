// SPDX-License-Identifier: Apache-2.0
// prometheusAlerts: the queue findings ticket. The daemon decides each finding from sysfs
// (daemon/findings/); this only holds it for queueFindingFor and says what it means. A warning, not a page:
// nothing is broken yet, the host is configured to be slower than it should be.
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
          // Short on purpose: rules.jsonnet's YAML output escapes every string in jsonnet's own std library, whose
          // cost grows with the text (jsonnet 0.18). The runbook section of each finding has the rest.
          description: 'Host {{ $labels.instance }}: {{ $labels.finding }} on {{ $labels.device }}.' +
                       '{{ if eq $labels.finding "rotational_without_scheduler" }}' + q('mergewatch_queue_schedulers_available') +
                       '{{ if eq (. | first | value) 0.0 }} No elevator is built in or loaded: load mq-deadline, then set it.' +
                       '{{ else }} An elevator is available in queue/scheduler: set mq-deadline.{{ end }}{{ end }}{{ end }}' +
                       " The daemon's log has the sysfs values and the command that clears it.",
          runbook_url: c.runbookURL + '#mergewatchqueueconfigfinding',
        },
      }, {
        // The split ticket: the daemon holds it with the collapse's hysteresis and keeps it off while the pair
        // pages for a collapse or the disk has max_sectors_capped (one cause at a time); held here as a ticket.
        alert: 'MergewatchIoSplit',
        expr: 'mergewatch_io_split_finding{%(mergewatchSelector)s} == 1' % c,
        'for': c.ioSplitFor,
        labels: { severity: c.warningSeverity },
        annotations: {
          summary: "A stacked device's bios reach the disk cut into small pieces that no merge setting can join.",
          description: 'Host {{ $labels.instance }}: {{ $labels.upper }} reaches {{ $labels.device }} as' +
                       ' {{ with printf "mergewatch_collapse_lower_request_bytes{job=\'%s\',instance=\'%s\',device=\'%s\',upper=\'%s\'}" $labels.job $labels.instance $labels.device $labels.upper | query }}{{ . | first | value | humanize1024 }}B{{ end }} requests.' +
                       " nomerges and the scheduler cannot help: the daemon's log names the chunk size and the remedy (a larger chunk).",
          runbook_url: c.runbookURL + '#mergewatchiosplit',
        },
      }],
    }],
  },
}
