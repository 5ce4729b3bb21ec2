# SPDX-License-Identifier: Apache-2.0
"""promtool unit tests of the tickets in deploy/mixin/findings.libsonnet: the queue findings ticket (held for 10
minutes, a warning, one per device and finding, and a description that says whether an elevator is there) and the
I/O split ticket (held for 10 minutes, a warning per (disk, upper device) pair, the piece size in its description)."""
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


def test_io_split_is_a_ticket_per_pair_after_ten_minutes(tmp_path):
    series = [
        # Direct 1 MiB reads of a 4 KiB-chunk snapshot (dm-3): the daemon's gauge from minute 2, 4 KiB pieces.
        (f'mergewatch_io_split_finding{{{HOST},device="nvme0n1",upper="dm-3"}}', "_x2 1x28"),
        (f'mergewatch_collapse_lower_request_bytes{{{HOST},device="nvme0n1",upper="dm-3"}}', "4096x30"),
        # A backup that ran 5 minutes and ended (the gauge absent afterwards): no ticket.
        (f'mergewatch_io_split_finding{{{HOST},device="nvme1n1",upper="dm-7"}}', "1x5"),
        (f'mergewatch_collapse_lower_request_bytes{{{HOST},device="nvme1n1",upper="dm-7"}}', "8192x30"),
        # The collapse evidence of a pair without the ticket: never an alert of its own.
        (f'mergewatch_collapse_lower_request_bytes{{{HOST},device="nvme0n1",upper="dm-4"}}', "4096x30"),
    ]
    runbook = "https://github.com/mergewatch/mergewatch/blob/main/docs/runbook.md#mergewatchiosplit"
    dm3 = {"exp_labels": {"severity": "warning", "job": "mergewatch", "instance": "hdd-07:9863", "device": "nvme0n1",
                          "upper": "dm-3"},
           "exp_annotations": {
               "summary": "A stacked device's bios reach the disk cut into small pieces that no merge setting can join.",
               "runbook_url": runbook,
               "description": ("Host hdd-07:9863: dm-3 reaches nvme0n1 as 4kiB requests. nomerges and the scheduler "
                               "cannot help: the daemon's log names the chunk size and the remedy (a larger chunk).")}}
    tests = [{"interval": "1m",
              "input_series": [{"series": s, "values": v} for s, v in series],
              "alert_rule_test": [
                  {"eval_time": "11m", "alertname": "MergewatchIoSplit", "exp_alerts": []},
                  {"eval_time": "13m", "alertname": "MergewatchIoSplit", "exp_alerts": [dm3]},
              ]}]
    path = os.path.join(str(tmp_path), "split.test.yml")
    with open(path, "w") as f:
        yaml.safe_dump({"rule_files": [RULES], "evaluation_interval": "1m", "tests": tests}, f, sort_keys=False)
    r = run([tool("promtool"), "test", "rules", path])
    assert r.returncode == 0, r.stdout + r.stderr
