// SPDX-License-Identifier: Apache-2.0
// The one place to adapt the mixin to a site. Override in your own jsonnet:
//   (import 'mixin.libsonnet') + { _config+:: { runbookURL: 'https://wiki.example.org/mergewatch/runbook' } }
// or edit this file and run `make mixin`, which regenerates deploy/prometheus/mergewatch.rules.yml and
// deploy/grafana/mergewatch.json (the files the package ships).
{
  _config+:: {
    // Selects mergewatchd's scrape targets in every alert and recording rule, and the jobs the
    // dashboard's job picker offers (its queries use job=~"$job").
    mergewatchSelector: 'job="mergewatch"',
    // Where docs/runbook.md is served; each alert links to its section (#<alertname in lower case>).
    // It must work where the alert is read (Alertmanager, Grafana, a phone), not on the host: the
    // project's intended public address by default (unchecked from the build host): point it at your
    // wiki or an internal mirror before deploying (docs/operations.md, "Monitoring mixin and dashboard").
    runbookURL: 'https://github.com/mergewatch/mergewatch/blob/main/docs/runbook.md',
    // Severity of the merge-collapse page and of the other (non-paging) alerts, in the mixin
    // convention (critical, warning, info); deploy/prometheus/alertmanager.example.yml routes on them.
    pageSeverity: 'critical',
    warningSeverity: 'warning',
    // Rate window of the recording rules (and part of their names: ..._rate5m).
    recordingRange: '5m',
    // Several clusters in one Prometheus (or Thanos/Mimir): a cluster picker on the dashboard,
    // filtering every query by clusterLabel.
    showMultiCluster: false,
    clusterLabel: 'cluster',
    // How long each condition must hold before the alert fires.
    // The merge-collapse page has its one place of hysteresis in the daemon (--collapse.window,
    // --collapse.raise-after, --collapse.clear-after): the gauge rises only after the pattern held for
    // raise-after over a sliding window and falls only after clear-after of health, so it never
    // flickers between scrapes, and a second hold here would only delay the page. 0s: the first
    // evaluation that sees the gauge at 1 fires, within 90 s of onset with a 15 s scrape and evaluation.
    collapseFor: '0s',
    downFor: '5m',
    absentFor: '10m',
    bpfNotAttachedFor: '5m',
    detectionBlindFor: '5m',
    // Dashboard: title, uid, and the rate window of its panels.
    dashboardTitle: 'mergewatch: block I/O merges',
    dashboardUID: 'mergewatch-block-io',
    rateInterval: '$__rate_interval',

    // Queue findings (findings.libsonnet): a finding (mergewatch_queue_config_finding) held this long opens a
    // ticket. Settings are applied by udev within seconds of a disk appearing, so a finding that outlives
    // this is the host's configuration, not a disk mid-setup.
    queueFindingFor: '10m',
    // The I/O split ticket (mergewatch_io_split_finding): a backup's direct reads of a snapshot may run for
    // minutes and cost throughput, not correctness; a ticket once they have held this long.
    ioSplitFor: '10m',
    // Kernel cohorts (cohorts.libsonnet): a kernel release whose hosts' median p99 read latency on one device
    // class is at least cohortLatencyRatio times that of the fastest other kernel cohort of the class, both
    // with at least cohortMinHosts hosts, for cohortFor. docs/operations.md, "Kernel cohorts", says why these values.
    cohortMinHosts: 5,
    cohortLatencyRatio: 3,
    cohortFor: '30m',
  },
}
