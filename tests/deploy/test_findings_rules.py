# SPDX-License-Identifier: Apache-2.0
"""promtool unit test of the queue findings ticket (deploy/mixin/findings.libsonnet): held for 10
minutes, a warning, one per device and finding, and a description that says whether an elevator is there."""
import os

import yaml

from conftest import RULES, run, tool

HOST = 'job="mergewatch",instance="hdd-07:9863"'


def test_queue_finding_is_a_ticket_after_ten_minutes(tmp_path):
    series = [
        # LinkedIn's RAID1 members: on none, no elevator loaded.
        (f'mergewatch_queue_config_finding{{{HOST},device="sda",finding="rotational_without_scheduler"}}', "1x30"),
        (f'mergewatch_queue_schedulers_available{{{HOST},device="sda"}}', "0x30"),
        # nomerges=2 on a disk under an LV; appears at minute 5.
        (f'mergewatch_queue_config_finding{{{HOST},device="nvme0n1",finding="merging_disabled_under_stack"}}',
         "_x5 1x25"),
        (f'mergewatch_queue_nomerges{{{HOST},device="nvme0n1"}}', "2x30"),
        # The same on a disk whose queue/scheduler lists an elevator (mq-deadline built in, not chosen).
        (f'mergewatch_queue_config_finding{{{HOST},device="sdc",finding="rotational_without_scheduler"}}', "1x30"),
        (f'mergewatch_queue_schedulers_available{{{HOST},device="sdc"}}', "1x30"),
        # A finding that held 5 minutes at boot and went (a udev rule caught up): no ticket.
        (f'mergewatch_queue_config_finding{{{HOST},device="sdb",finding="rotational_without_scheduler"}}', "1x5"),
    ]
    runbook = "https://github.com/mergewatch/mergewatch/blob/main/docs/runbook.md#mergewatchqueueconfigfinding"
    summary = "A disk runs with a queue setting that costs latency or throughput."
    sda = {"exp_labels": {"severity": "warning", "job": "mergewatch", "instance": "hdd-07:9863", "device": "sda",
                          "finding": "rotational_without_scheduler"},
           "exp_annotations": {"summary": summary, "runbook_url": runbook, "description": (
               "Host hdd-07:9863: rotational_without_scheduler on sda. No elevator is built in or loaded: load "
               "mq-deadline, then set it. The daemon's log has the sysfs values and the command that clears it.")}}
    sdc = {"exp_labels": dict(sda["exp_labels"], device="sdc"),
           "exp_annotations": {"summary": summary, "runbook_url": runbook, "description": (
               "Host hdd-07:9863: rotational_without_scheduler on sdc. An elevator is available in queue/scheduler: "
               "set mq-deadline. The daemon's log has the sysfs values and the command that clears it.")}}
    nvme = {"exp_labels": {"severity": "warning", "job": "mergewatch", "instance": "hdd-07:9863", "device": "nvme0n1",
                           "finding": "merging_disabled_under_stack"},
            "exp_annotations": {"summary": summary, "runbook_url": runbook, "description": (
                "Host hdd-07:9863: merging_disabled_under_stack on nvme0n1. The daemon's log has the sysfs values "
                "and the command that clears it.")}}
    tests = [{"interval": "1m",
              "input_series": [{"series": s, "values": v} for s, v in series],
              "alert_rule_test": [
                  {"eval_time": "9m", "alertname": "MergewatchQueueConfigFinding", "exp_alerts": []},
                  {"eval_time": "12m", "alertname": "MergewatchQueueConfigFinding", "exp_alerts": [sda, sdc]},
                  {"eval_time": "20m", "alertname": "MergewatchQueueConfigFinding", "exp_alerts": [sda, sdc, nvme]},
              ]}]
    path = os.path.join(str(tmp_path), "findings.test.yml")
    with open(path, "w") as f:
        yaml.safe_dump({"rule_files": [RULES], "evaluation_interval": "1m", "tests": tests}, f, sort_keys=False)
    r = run([tool("promtool"), "test", "rules", path])
    assert r.returncode == 0, r.stdout + r.stderr
