# SPDX-License-Identifier: Apache-2.0
"""promtool unit tests of the kernel cohort rules and alert (deploy/mixin/cohorts.libsonnet), on a
fleet of hosts on two kernel releases. The input series are written here rather than in a YAML file: ten
hosts of histogram buckets are hundreds of lines that say less than the loop that makes them.

Every host has a rotational disk (sda) and an NVMe disk (nvme0n1). All reads of a disk fall into one latency
bucket, so each host's p99 is known in closed form: histogram_quantile interpolates linearly inside the
bucket, p99 = lower + 0.99 * (upper - lower)."""
import os

import yaml

from conftest import RULES, run, tool

BUCKETS = ["0.002", "0.004", "0.008", "0.032", "+Inf"]
OLD, NEW = "6.1.0-27-amd64", "6.12.48+deb13-amd64"
MINUTES = 50


def p99(upper):
    lower = float(BUCKETS[BUCKETS.index(upper) - 1])
    return lower + 0.99 * (float(upper) - lower)


def host(instance, kernel, sda_upper, nvme_upper="0.004"):
    """The series one mergewatchd exports: build info, device classes, read latency buckets."""
    series = [(f'mergewatch_build_info{{job="mergewatch",instance="{instance}",version="0.9.0",kernel="{kernel}"}}',
               f"1x{MINUTES}")]
    for device, cls, upper in (("sda", "rotational", sda_upper), ("nvme0n1", "nvme", nvme_upper)):
        series.append((f'mergewatch_device_class_info{{job="mergewatch",instance="{instance}",device="{device}",'
                       f'class="{cls}"}}', f"1x{MINUTES}"))
        for le in BUCKETS:
            filled = BUCKETS.index(le) >= BUCKETS.index(upper)  # cumulative: every bucket from `upper` up
            series.append((f'mergewatch_request_latency_seconds_bucket{{job="mergewatch",instance="{instance}",'
                           f'device="{device}",op="read",le="{le}"}}', f"0+600x{MINUTES}" if filled else f"0x{MINUTES}"))
    return series


def fleet(old_hosts, new_hosts, new_sda_upper):
    series = []
    for i in range(old_hosts):
        series += host(f"hdd-{i:02d}:9863", OLD, "0.004")
    for i in range(new_hosts):
        series += host(f"hdd-{old_hosts + i:02d}:9863", NEW, new_sda_upper)
    return [{"series": s, "values": v} for s, v in series]


def promtool_test(tmp_path, tests):
    path = os.path.join(str(tmp_path), "cohorts.test.yml")
    with open(path, "w") as f:
        yaml.safe_dump({"rule_files": [RULES], "evaluation_interval": "1m", "tests": tests}, f, sort_keys=False)
    r = run([tool("promtool"), "test", "rules", path])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_slow_kernel_cohort_pages_a_ticket_after_30_minutes(tmp_path):
    """5 hosts on 6.1 and 5 on 6.12; the 6.12 HDDs read 8 times slower (p99 31.76 ms against 3.98 ms), their
    NVMe disks as fast as 6.1's. The recording rules give each cohort's median p99 and host count; the alert
    is pending for 30 minutes, then fires for the 6.12 rotational cohort only."""
    slow = p99("0.032")
    fast = p99("0.004")
    description = (f"Kernel {NEW}: median p99 read latency of its hosts 31.76ms on rotational disks, 3 times or more "
                   f"that of the fastest other kernel cohort of 5 or more hosts (3.98ms). Hold the rollout; compare "
                   f"the cohorts on the dashboard row Kernel cohorts.")
    promtool_test(tmp_path, [{
        "interval": "1m",
        "input_series": fleet(5, 5, "0.032"),
        "promql_expr_test": [
            {"expr": "kernel_class:mergewatch_read_latency_seconds:p99_rate5m", "eval_time": "10m",
             "exp_samples": [
                 {"labels": f'kernel_class:mergewatch_read_latency_seconds:p99_rate5m{{kernel="{OLD}",class="rotational"}}',
                  "value": fast},
                 {"labels": f'kernel_class:mergewatch_read_latency_seconds:p99_rate5m{{kernel="{OLD}",class="nvme"}}',
                  "value": p99("0.004")},
                 {"labels": f'kernel_class:mergewatch_read_latency_seconds:p99_rate5m{{kernel="{NEW}",class="rotational"}}',
                  "value": slow},
                 {"labels": f'kernel_class:mergewatch_read_latency_seconds:p99_rate5m{{kernel="{NEW}",class="nvme"}}',
                  "value": p99("0.004")}]},
            {"expr": 'kernel_class:mergewatch_hosts:count{class="rotational"}', "eval_time": "10m",
             "exp_samples": [
                 {"labels": f'kernel_class:mergewatch_hosts:count{{kernel="{OLD}",class="rotational"}}', "value": 5},
                 {"labels": f'kernel_class:mergewatch_hosts:count{{kernel="{NEW}",class="rotational"}}', "value": 5}]},
        ],
        "alert_rule_test": [
            {"eval_time": "20m", "alertname": "MergewatchKernelCohortSlowReads", "exp_alerts": []},  # pending
            {"eval_time": "40m", "alertname": "MergewatchKernelCohortSlowReads", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "kernel": NEW, "class": "rotational"},
                "exp_annotations": {
                    "summary": "Hosts on one kernel release read markedly slower than hosts on another.",
                    "description": description,
                    "runbook_url": "https://github.com/mergewatch/mergewatch/blob/main/docs/runbook.md#mergewatchkernelcohortslowreads"}}]},
        ],
    }])


def test_no_ticket_below_the_ratio_or_for_a_small_cohort(tmp_path):
    """Twice as slow (p99 7.96 ms against 3.98 ms) is under the ratio of 3; eight times as slow on only 4 hosts
    is under the cohort size of 5. Neither fires, however long it lasts."""
    quiet = [{"eval_time": t, "alertname": "MergewatchKernelCohortSlowReads", "exp_alerts": []}
             for t in ("20m", "40m", "49m")]
    promtool_test(tmp_path, [
        {"interval": "1m", "input_series": fleet(5, 5, "0.008"), "alert_rule_test": quiet},
        {"interval": "1m", "input_series": fleet(5, 4, "0.032"), "alert_rule_test": quiet},
    ])
