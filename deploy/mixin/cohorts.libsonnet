// SPDX-License-Identifier: Apache-2.0
// Kernel cohorts: hosts grouped by the kernel they run (the kernel label of mergewatch_build_info)
// and compared within a device class (mergewatch_device_class_info: rotational, nvme, non_rotational), so a
// kernel rollout that makes reads slower shows as one cohort against the others, as LinkedIn's 4.x reimage
// did on HDD RAID1 hosts. Recording rules, one alert (a ticket: the fleet is not down, a rollout should
// stop), and a dashboard row.
{
  local c = $._config,
  assert c.cohortLatencyRatio > 1 : 'cohortLatencyRatio must be above 1: a cohort is compared with the fastest other',
  assert c.cohortMinHosts >= 1 : 'cohortMinHosts must be at least 1',
  // Per-device series labelled with the device class: joined on the device, one class per device.
  local withClass(series) = '%s * on (job, instance, device) group_left (class) mergewatch_device_class_info{%s}'
                            % [series, c.mergewatchSelector],
  // Per-host series labelled with the host's kernel release.
  local withKernel = '* on (job, instance) group_left (kernel) mergewatch_build_info{%s}' % c.mergewatchSelector,
  local rng = c.recordingRange,
  local hostP99 = 'instance_class_kernel:mergewatch_read_latency_seconds:p99_rate' + rng,
  local hostMean = 'instance_class_kernel_op:mergewatch_request_size_bytes:mean_rate' + rng,
  local cohortP99 = 'kernel_class:mergewatch_read_latency_seconds:p99_rate' + rng,
  local cohortHosts = 'kernel_class:mergewatch_hosts:count',
  // Cohorts large enough to be compared.
  local comparable = '%s and on (kernel, class) %s >= %d' % [cohortP99, cohortHosts, c.cohortMinHosts],

  prometheusRules+:: {
    groups+: [{
      name: 'mergewatch.cohorts',
      rules: [
        // Per host and class: p99 read latency (dispatch to completion) over all the host's disks of the class.
        // Hosts without reads on a class get no sample (histogram_quantile of no requests is NaN, and NaN > 0
        // is false).
        // Expressions on one line: rules.jsonnet's YAML output costs jsonnet time that grows faster than the text.
        {
          record: hostP99,
          expr: 'histogram_quantile(0.99, sum by (job, instance, class, le) (%s)) %s > 0'
                % [
                  withClass('rate(mergewatch_request_latency_seconds_bucket{%s, op="read"}[%s])' % [c.mergewatchSelector, rng]),
                  withKernel,
                ],
        },
        // Per host, class and op: mean request size at dispatch (bytes per request).
        {
          record: hostMean,
          expr: '(sum by (job, instance, class, op) (%s) / (sum by (job, instance, class, op) (%s) > 0)) %s'
                % [
                  withClass('rate(mergewatch_request_size_bytes_sum{%s}[%s])' % [c.mergewatchSelector, rng]),
                  withClass('rate(mergewatch_request_size_bytes_count{%s}[%s])' % [c.mergewatchSelector, rng]),
                  withKernel,
                ],
        },
        // The cohort p99: the median of its hosts' p99, so one host with a failing disk does not move it.
        {
          record: cohortP99,
          expr: 'quantile by (kernel, class) (0.5, %s{%s})' % [hostP99, c.mergewatchSelector],
        },
        // Hosts in each cohort (with reads on that class over the last 5 minutes).
        {
          record: cohortHosts,
          expr: 'count by (kernel, class) (%s{%s})' % [hostP99, c.mergewatchSelector],
        },
        {
          record: 'kernel_class_op:mergewatch_request_size_bytes:mean_rate' + rng,
          expr: 'quantile by (kernel, class, op) (0.5, %s{%s})' % [hostMean, c.mergewatchSelector],
        },
      ],
    }],
  },

  prometheusAlerts+:: {
    groups+: [{
      name: 'mergewatch.cohorts.alerts',
      rules: [{
        alert: 'MergewatchKernelCohortSlowReads',
        // The fastest comparable cohort of the class is the reference: a cohort at least K (> 1) times it is
        // never the reference itself.
        expr: '(%s) >= on (class) group_left () %s * min by (class) (%s)' % [comparable, c.cohortLatencyRatio, comparable],
        'for': c.cohortFor,
        labels: { severity: c.warningSeverity },
        annotations: {
          summary: 'Hosts on one kernel release read markedly slower than hosts on another.',
          // Short: see findings.libsonnet on the cost of long annotations.
          description: ('Kernel {{ $labels.kernel }}: median p99 read latency of its hosts {{ $value | humanizeDuration }} on ' +
                        '{{ $labels.class }} disks, %s times or more that of the fastest other kernel cohort of %d or more ' +
                        'hosts ({{ with printf "min(%s{class=\'%%s\'} and on (kernel, class) %s >= %d)" $labels.class | query }}' +
                        '{{ . | first | value | humanizeDuration }}{{ end }}). Hold the rollout; compare the cohorts on the ' +
                        'dashboard row Kernel cohorts.') % [
            c.cohortLatencyRatio,
            c.cohortMinHosts,
            cohortP99,
            cohortHosts,
            c.cohortMinHosts,
          ],
          runbook_url: c.runbookURL + '#mergewatchkernelcohortslowreads',
        },
      }],
    }],
  },

  grafanaDashboards+:: {
    'mergewatch.json'+: {
      local ds = { type: 'prometheus', uid: '${datasource}' },
      // The pickers of dashboards.libsonnet (cluster, job, host; All by default): a cohort is many hosts.
      local pick = (if c.showMultiCluster then '%s=~"$cluster", ' % c.clusterLabel else '') + 'job=~"$job", instance=~"$instance"',
      local y = 60,  // below the last row of dashboards.libsonnet ("Who: services and volumes")
      // Fleet-wide: no host or device picker (a cohort is many hosts); the job selector only.
      local rate(metric, extra='') = 'rate(%s{%s%s}[%s])' % [metric, pick, extra, c.rateInterval],
      local classed(series) = '%s * on (job, instance, device) group_left (class) mergewatch_device_class_info{%s}'
                              % [series, pick],
      local kernel = '* on (job, instance) group_left (kernel) mergewatch_build_info{%s}' % pick,
      local panel(id, title, description, x, targets, unit) = {
        id: id,
        type: 'timeseries',
        title: title,
        description: description,
        datasource: ds,
        gridPos: { x: x, y: y + 1, w: 12, h: 8 },
        targets: [
          { datasource: ds, expr: targets[i][0], legendFormat: targets[i][1], refId: std.char(65 + i) }
          for i in std.range(0, std.length(targets) - 1)
        ],
        fieldConfig: { defaults: { unit: unit, custom: { fillOpacity: 0, showPoints: 'never' } }, overrides: [] },
        options: {
          legend: { displayMode: 'table', placement: 'bottom', showLegend: true, calcs: ['lastNotNull'] },
          tooltip: { mode: 'multi', sort: 'desc' },
        },
      },
      panels+: [
        {
          id: 16,
          type: 'row',
          title: 'Kernel cohorts',
          collapsed: false,
          gridPos: { x: 0, y: y, w: 24, h: 1 },
          panels: [],
        },
        panel(17,
              'Kernel cohorts: p99 read latency',
              "Per kernel release and device class: the median over hosts of each host's p99 read latency (dispatch to completion). The number of hosts is in the legend. The alert compares these lines within a class.",
              0,
              [
                [
                  'quantile by (kernel, class) (0.5, histogram_quantile(0.99, sum by (job, instance, class, le) (%s)) %s > 0)'
                  % [classed(rate('mergewatch_request_latency_seconds_bucket', ', op="read"')), kernel],
                  '{{kernel}} {{class}}',
                ],
                [
                  'count by (kernel, class) (histogram_quantile(0.99, sum by (job, instance, class, le) (%s)) %s > 0)'
                  % [classed(rate('mergewatch_request_latency_seconds_bucket', ', op="read"')), kernel],
                  '{{kernel}} {{class}} hosts',
                ],
              ],
              's')
        + { fieldConfig+: { overrides: [{
          matcher: { id: 'byRegexp', options: '.* hosts' },
          properties: [
            { id: 'unit', value: 'none' },
            { id: 'custom.axisPlacement', value: 'right' },
          ],
        }] } },
        panel(18,
              'Kernel cohorts: mean request size',
              "Per kernel release, device class and operation: the median over hosts of each host's mean request size at dispatch. A cohort whose requests are smaller merges less (scheduler, nomerges, max_sectors_kb).",
              12,
              [[
                'quantile by (kernel, class, op) (0.5, (sum by (job, instance, class, op) (%s) / (sum by (job, instance, class, op) (%s) > 0)) %s)'
                % [
                  classed(rate('mergewatch_request_size_bytes_sum')),
                  classed(rate('mergewatch_request_size_bytes_count')),
                  kernel,
                ],
                '{{kernel}} {{class}} {{op}}',
              ]],
              'bytes'),
      ],
    },
  },
}
