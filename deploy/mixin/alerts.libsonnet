// SPDX-License-Identifier: Apache-2.0
// prometheusAlerts: the page (the daemon's own collapse verdict) and three warnings about the watch itself.
//
// The merge-collapse page is decided by the daemon's detector (mergewatch_merge_collapse, with its own
// raise/clear hysteresis and device policy), not by a request-size threshold here: small requests
// alone are normal for random I/O and must not page (see docs/runbook.md, "When not to act").
local fold(text) = std.join(' ', std.split(std.rstripChars(text, '\n'), '\n'));  // YAML's `>-`
// The services behind the collapsed pair (mergewatch_collapse_service_request_ratio, present only while the pair's
// condition holds and only for a pair with an upper device): "97% /system.slice/backup.service, 3% other", largest
// share first, zero shares left out.
// sort_desc orders an instant query's result and `query` keeps that order. A cgroup name is any directory name:
// control characters (a newline) become spaces so the list stays one line; the rest is printed as it is (text,
// never template: a "{{" in a name is not expanded). "" is a cgroup v1 host's, shown as the daemon's log shows it.
local services(before='', after='', none='') =
  '{{ with printf "sort_desc(mergewatch_collapse_service_request_ratio{job=\'%s\',instance=\'%s\',device=\'%s\',upper=\'%s\'} > 0)" $labels.job $labels.instance $labels.device $labels.upper | query }}' +
  before + '{{ range $i, $s := . }}{{ if $i }}, {{ end }}{{ $s | value | humanizePercentage }} ' +
  '{{ with $s | label "cgroup" }}{{ reReplaceAll "[[:cntrl:]]" " " . }}{{ else }}unattributed (cgroup v1){{ end }}' +
  '{{ end }}' + after + '{{ else }}' + none + '{{ end }}';

{
  prometheusAlerts+:: {
    local c = $._config,
    local runbook(alert) = c.runbookURL + '#' + std.asciiLower(alert),
    groups+: [{
      name: 'mergewatch.alerts',
      rules: [
        {
          alert: 'MergewatchMergeCollapse',
          expr: 'mergewatch_merge_collapse{%(mergewatchSelector)s} == 1' % c,
          'for': c.collapseFor,
          labels: { severity: c.pageSeverity },
          annotations: {
            summary: 'Block request merging has collapsed on a disk.',
            description: fold(|||
              Host {{ $labels.instance }}: requests dispatched to {{ $labels.device }} are no longer merged, so the
              disk receives many small requests where a few large ones would do:
              {{ with printf "mergewatch_collapse_missed_merge_ratio{job='%s',instance='%s',device='%s',upper='%s'}" $labels.job $labels.instance $labels.device $labels.upper | query }}{{ . | first | value | humanizePercentage }}{{ else }}an unknown share{{ end }}
              of
              {{ with printf "mergewatch_collapse_requests_per_second{job='%s',instance='%s',device='%s',upper='%s'}" $labels.job $labels.instance $labels.device $labels.upper | query }}{{ . | first | value | humanize }}{{ else }}unknown{{ end }}
              requests/s were missed merges, mean request
              {{ with printf "mergewatch_collapse_lower_request_bytes{job='%s',instance='%s',device='%s',upper='%s'}" $labels.job $labels.instance $labels.device $labels.upper | query }}{{ . | first | value | printf "%.0f" }} bytes{{ else }}unknown{{ end }}
              where merging would have built
              {{ with printf "mergewatch_collapse_merged_request_bytes{job='%s',instance='%s',device='%s',upper='%s'}" $labels.job $labels.instance $labels.device $labels.upper | query }}{{ . | first | value | printf "%.0f" }} bytes{{ else }}unknown{{ end }}.
              {{ if $labels.upper }}Device stacked above it: {{ $labels.upper }}{{ with printf "mergewatch_collapse_upper_bio_bytes{job='%s',instance='%s',device='%s',upper='%s'}" $labels.job $labels.instance $labels.device $labels.upper | query }}, receiving {{ . | first | value | printf "%.0f" }}-byte bios{{ end }}.{{ else }}No device is stacked above it.{{ end }}
            |||) + services(' Requests from: ', '.') + ' ' + fold(|||
              queue/nomerges of {{ $labels.device }} is
              {{ with printf "mergewatch_queue_nomerges{job='%s',instance='%s',device='%s'}" $labels.job $labels.instance $labels.device | query }}{{ . | first | value }}{{ else }}unknown{{ end }}
              (0 = merging allowed, 2 = all merging disabled).
            |||),
            // The same list alone, for a receiver's one-line template; says so when the daemon names no service.
            services: services(none='unknown: no service series for the pair (nothing stacked above the disk, an older mergewatchd, or the pattern has just stopped)'),
            runbook_url: runbook('MergewatchMergeCollapse'),
          },
        },
        {
          alert: 'MergewatchDown',
          expr: 'up{%(mergewatchSelector)s} == 0' % c,
          'for': c.downFor,
          labels: { severity: c.warningSeverity },
          annotations: {
            summary: 'Mergewatchd cannot be scraped; merge collapse on this host would go unnoticed.',
            description: fold(|||
              Prometheus has failed to scrape mergewatchd at {{ $labels.instance }} for the whole alert hold time
              (daemon stopped, crashed, restarting, or the port is blocked).
            |||),
            runbook_url: runbook('MergewatchDown'),
          },
        },
        {
          alert: 'MergewatchTargetsAbsent',
          expr: 'absent(up{%(mergewatchSelector)s})' % c,
          'for': c.absentFor,
          labels: { severity: c.warningSeverity },
          annotations: {
            summary: 'No mergewatch scrape targets at all.',
            description: fold(|||
              Prometheus has had no target of job {{ $labels.job }} (%(mergewatchSelector)s) for %(absentFor)s: service
              discovery (the file_sd target files) or the scrape configuration is broken, so no host is watched.
            ||| % c),
            runbook_url: runbook('MergewatchTargetsAbsent'),
          },
        },
        {
          alert: 'MergewatchBpfNotAttached',
          expr: 'mergewatch_bpf_program_attached{%(mergewatchSelector)s,tracepoint=~"block_rq_issue|block_rq_complete"} == 0' % c,
          'for': c.bpfNotAttachedFor,
          labels: { severity: c.warningSeverity },
          annotations: {
            summary: 'Mergewatchd runs but a required BPF program is not attached.',
            // mode="none": BPF cannot run there (or --source=diskstats), and the daemon detects on diskstats.
            description: fold(|||
              {{ if eq $labels.mode "none" }}mergewatchd at {{ $labels.instance }} runs without BPF: detection runs
              on the reduced source (diskstats; mergewatch_detection_info says why): no per-request sizes, missed
              merges or latencies, and merge collapse is judged from mean sizes, merges and queue settings only.{{
              else }}mergewatchd at {{ $labels.instance }} reports its {{ $labels.mode }} program on {{
              $labels.tracepoint }} as not attached: request sizes and latencies from this host are missing or wrong,
              and merge collapse cannot be detected.{{ end }}
            |||),
            runbook_url: runbook('MergewatchBpfNotAttached'),
          },
        },
        {
          // block_rq_issue/complete load, but a program the detector decides on does not (block_getrq:
          // missed merges; block_bio_remap: the upper device). The daemon runs and exports sizes, yet can never page.
          alert: 'MergewatchDetectionBlind',
          expr: 'mergewatch_detection_info{%(mergewatchSelector)s,evidence="blind"} == 1' % c,
          'for': c.detectionBlindFor,
          labels: { severity: c.warningSeverity },
          annotations: {
            summary: 'Mergewatchd cannot detect merge collapse: a BPF program the detector needs is not attached.',
            description: fold(|||
              mergewatchd at {{ $labels.instance }} runs, but {{ $labels.reason }}: it lacks {{ $labels.missing }},
              so MergewatchMergeCollapse cannot fire for this host.
            |||),
            runbook_url: runbook('MergewatchDetectionBlind'),
          },
        },
      ],
    }],
  },
}
