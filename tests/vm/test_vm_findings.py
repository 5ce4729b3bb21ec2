# SPDX-License-Identifier: Apache-2.0
"""Queue findings on Debian's 6.1 kernel: the third part of the scenario boot.

tests/vm/guest-findings.sh runs after guest-stacking.sh in the same VM (vmtest.scenario_boot, one boot per
session for test_vm.py, test_vm_stacking.py and this file). md RAID1 over two emulated 7200 rpm disks
(scsi-hd, rotation_rate=7200) behind virtio-scsi with QEMU's default queues, one per vCPU (run-vm.sh
--rotational-disks 2), and one single-queue virtio-blk disk set to none (run-vm.sh --virtio-blk-disks 1):
rotational_without_scheduler holds on the scsi disks whatever their number of hardware queues, and never on
the virtio-blk disk, whose rotational=1 is the driver's default, not the device's word."""
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


def test_the_emulated_disks_are_multi_queue_rotational_md_members(res):
    a, b = res["members"].split(",")
    for d in (a, b):
        # 2 vCPUs: virtio-scsi's default gives each disk 2 hardware queues, and the kernel picks none for them
        # (elevator_get_default()) though sd read 7200 rpm from the Block Device Characteristics page.
        assert res[f"{d}_rotational"] == "1" and res[f"{d}_hw_queues"] == "2", res
        assert res[f"{d}_mq"] == "0,1", res
        assert res[f"{d}_driver"] == "sd", res
        assert res[f"{d}_scheduler"].startswith("[none]"), res
    assert res["md_level"] == "raid1" and sorted(res["md_slaves"].split(",")) == sorted([a, b]), res


def test_the_virtio_blk_disk_is_single_queue_and_rotational_by_default(res):
    v = res["vblk"]
    assert res[f"{v}_rotational"] == "1" and res[f"{v}_hw_queues"] == "1" and res[f"{v}_driver"] == "virtio_blk", res
    # One hardware queue and mq-deadline built in (Debian's CONFIG_MQ_IOSCHED_DEADLINE=y): the kernel's pick,
    # which the script then sets to none as cloud images do.
    assert res[f"{v}_scheduler"].startswith("[mq-deadline]"), res
    assert res[f"{v}_scheduler_set"].startswith("[none]") and res[f"{v}_scheduler_end"].startswith("[none]"), res


def test_none_names_the_scsi_disks_not_the_virtio_blk_one_and_mq_deadline_clears_them(res):
    a, b = res["members"].split(",")
    v = res["vblk"]
    assert res["findings_default"] == f"{a}:rotational_without_scheduler,{b}:rotational_without_scheduler"
    assert res["findings_nomerges"] == (f"{a}:merging_disabled_under_stack,{a}:rotational_without_scheduler,"
                                        f"{b}:rotational_without_scheduler")
    assert res["findings_deadline"] == ""
    assert res["daemon_exit"] == "0"
    for prom in ("default.prom", "deadline.prom"):
        s = FINDINGS.samples(prom)
        named = {dict(k[1])["device"] for k in s if k[0] == "mergewatch_queue_config_finding"}
        assert v not in named, (prom, named)
        # The daemon saw it: rotational and listed, only not named.
        assert value(s, "mergewatch_device_class_info", device=v, **{"class": "rotational"}) == 1
    log = FINDINGS.read("daemon.log")
    # An elevator is there (built in): the log says which, the driver and the queues, and the remedy sets it.
    assert (f"queue finding rotational_without_scheduler on {a}: rotational=1 (driver sd), 2 hardware queues, "
            f"scheduler none; available: mq-deadline") in log, log
    assert "udev rule" in log, log
    assert f"queue finding rotational_without_scheduler on {b} cleared" in log, log
    assert f"rotational_without_scheduler on {v}" not in log, log


def test_default_nvme_disk_and_the_md_device_have_no_finding_and_classes_are_right(res):
    a, _ = res["members"].split(",")
    disk = disks(SCENARIO)["disk"]  # the scenario's NVMe disk, by its serial
    s = FINDINGS.samples("default.prom")
    named = {dict(k[1])["device"] for k in s if k[0] == "mergewatch_queue_config_finding"}
    assert disk not in named and "md1" not in named, named
    assert value(s, "mergewatch_device_class_info", device=disk, **{"class": "nvme"}) == 1
    assert value(s, "mergewatch_device_class_info", device=a, **{"class": "rotational"}) == 1
    assert value(s, "mergewatch_queue_schedulers_available", device=a) >= 1
    assert not [k for k in s if k[0] == "mergewatch_device_class_info" and dict(k[1])["device"] == "md1"]
