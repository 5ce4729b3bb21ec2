# SPDX-License-Identifier: Apache-2.0
"""Queue findings on Debian's 6.1 kernel: the third part of the scenario boot.

tests/vm/guest-findings.sh runs after guest-stacking.sh in the same VM (vmtest.scenario_boot, one boot per
session for test_vm.py, test_vm_stacking.py and this file). LinkedIn's hosts as QEMU can make them: md RAID1
over two emulated 7200 rpm disks (scsi-hd, rotation_rate=7200) on a single-queue virtio-scsi controller
(run-vm.sh --rotational-disks 2)."""
import pytest

from vmtest import SCENARIO, RunDir, disks, scenario_boot, value

FINDINGS = RunDir(SCENARIO.file("findings"))


@pytest.fixture(scope="module")
def res():
    scenario_boot()
    results = FINDINGS.results()
    print(results)
    assert "failed" not in results, f"guest-findings.sh failed: {results['failed']}\n" + \
        "\n".join(l for l in SCENARIO.text("guest.log").splitlines() if "findings" in l)[-3000:]
    assert results.get("done") == "1", results
    return results


def test_the_emulated_disks_are_single_queue_rotational_md_members(res):
    a, b = res["members"].split(",")
    for d in (a, b):
        assert res[f"{d}_rotational"] == "1" and res[f"{d}_hw_queues"] == "1", res
        # One hardware queue and mq-deadline built in (Debian's CONFIG_MQ_IOSCHED_DEADLINE=y): the kernel's pick.
        assert res[f"{d}_scheduler"].startswith("[mq-deadline]"), res
    assert res["md_level"] == "raid1" and sorted(res["md_slaves"].split(",")) == sorted([a, b]), res


def test_none_on_both_members_names_both_and_mq_deadline_clears_them(res):
    a, b = res["members"].split(",")
    assert res["findings_default"] == "", "the kernel's own choice is no finding"
    assert res["findings_none"] == f"{a}:rotational_without_scheduler,{b}:rotational_without_scheduler"
    assert res["findings_nomerges"] == (f"{a}:merging_disabled_under_stack,{a}:rotational_without_scheduler,"
                                        f"{b}:rotational_without_scheduler")
    assert res["findings_deadline"] == ""
    assert res["daemon_exit"] == "0"
    log = FINDINGS.read("daemon.log")
    # An elevator is there (built in): the log says which, and the remedy sets it.
    assert (f"queue finding rotational_without_scheduler on {a}: rotational=1, 1 hardware queue, scheduler none; "
            f"available: mq-deadline") in log, log
    assert f"queue finding rotational_without_scheduler on {b} cleared" in log, log


def test_default_nvme_disk_and_the_md_device_have_no_finding_and_classes_are_right(res):
    a, _ = res["members"].split(",")
    disk = disks(SCENARIO)["disk"]  # the scenario's NVMe disk, by its serial
    s = FINDINGS.samples("none.prom")
    named = {dict(k[1])["device"] for k in s if k[0] == "mergewatch_queue_config_finding"}
    assert disk not in named and "md1" not in named, named
    assert value(s, "mergewatch_device_class_info", device=disk, **{"class": "nvme"}) == 1
    assert value(s, "mergewatch_device_class_info", device=a, **{"class": "rotational"}) == 1
    assert value(s, "mergewatch_queue_schedulers_available", device=a) >= 1
    assert not [k for k in s if k[0] == "mergewatch_device_class_info" and dict(k[1])["device"] == "md1"]
