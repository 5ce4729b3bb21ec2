# SPDX-License-Identifier: Apache-2.0
"""Stacking decided at run time on Debian's 6.1 kernel: the second part of the scenario boot.

tests/vm/guest-stacking.sh runs at the end of guest-scenario.sh, in the same VM as test_vm.py: one
boot per pytest session for both files (vmtest.scenario_boot), whichever runs first.
It checks two README claims no host test can: block_bio_queue is attached only while a dm/md device
is stacked on a disk and the choice is re-made at each rescan (an LV created after the daemon
started, then removed), and --collapse.require-upper=any takes an md device as the upper one.
"""
import re

import pytest

from vmtest import SCENARIO, RunDir, scenario_boot, value

STACKING = RunDir(SCENARIO.file("stacking"))
DISK = "nvme0n1"
read, samples = STACKING.read, STACKING.samples


@pytest.fixture(scope="module")
def scenario_run():
    """This session's scenario boot (vmtest.scenario_boot: one for test_vm.py and test_vm_stacking.py)."""
    return scenario_boot()


@pytest.fixture(scope="module")
def res(scenario_run):
    """The guest's key=value results from this session's scenario boot (one for test_vm.py and this
    file, into an emptied run directory)."""
    results = STACKING.results()
    print(results)
    assert "failed" not in results, f"guest-stacking.sh failed: {results['failed']}\n" + \
        "\n".join(l for l in SCENARIO.text("guest.log").splitlines() if "stacking" in l)[-3000:]
    assert results.get("done") == "1", results
    return results


def test_block_bio_queue_follows_lvm_created_and_removed_after_start(res):
    """No dm device at start: not attached. An LV created after start: attached at a later rescan.
    Removed: detached again (the README: 'not needed now')."""
    assert res["bio_queue_before_lvm"] == "0"
    assert res["bio_queue_after_lvcreate"] == "1"
    assert res["bio_queue_after_lvremove"] == "0"
    log = read("daemon-dm.log")
    attached = log.index(f"bio-based devices stacked on disks ({res['late_device']}): block_bio_queue attached")
    assert log.index("no dm/md device stacked on a disk: block_bio_queue detached", attached) > attached


def test_bios_and_remapped_requests_of_the_late_lv_are_counted(res):
    """While attached, the LV's bios and the disk's requests they became are exported: 64 x 256 KiB
    direct reads, one at a time, each one request at the disk (max_sectors_kb 512); the disk's
    diskstats are the count."""
    s0, s = samples("lvm-before-read.prom"), samples("lvm-after-read.prom")
    lv = res["late_device"]

    def delta(name, **labels):  # lvcreate's own I/O (wipe, label scan) came before the baseline
        return value(s, name, **labels) - s0.get((name, frozenset(labels.items())), 0.0)

    assert delta("mergewatch_bio_size_bytes_count", device=lv, op="read") == 64
    assert delta("mergewatch_bio_size_bytes_sum", device=lv, op="read") == 16 << 20
    before, after = ([int(x) for x in read(f"diskstat-{n}-lv-read.txt").split()] for n in ("before", "after"))
    disk_reads = after[0] - before[0]
    assert (after[2] - before[2]) * 512 == 16 << 20, (before, after)
    assert disk_reads == 64
    assert delta("mergewatch_request_size_bytes_count", device=DISK, op="read") == disk_reads
    assert delta("mergewatch_remapped_requests_total", device=DISK, origin=lv, op="read") == disk_reads
    assert delta("mergewatch_remapped_missed_merges_total", device=DISK, origin=lv, op="read") == 0


def test_require_upper_any_raises_for_md_and_dm_only_does_not(res):
    assert res["md_level"] == "raid0" and res["md_chunk_bytes"] == "4096", res
    anyp, dmp = samples("md-any.prom"), samples("md-dm.prom")
    # The 2019 shape with md instead of dm-snapshot: readahead bios at md0, 4 KiB requests at the disk.
    assert value(anyp, "mergewatch_merge_collapse", device=DISK, upper="md0") == 1
    # A window share, not a count: another request on the disk in the window (LVM's or md's own
    # metadata I/O) moves it off 1 (0.9988 once in CI).
    assert value(anyp, "mergewatch_collapse_small_request_ratio", device=DISK, upper="md0") >= 0.99
    # The window's mean request size: the same foreign requests move it too, and a few large ones
    # move it more than the share (4175 once in CI). A collapse at 8 KiB would be twice 4096.
    assert 4096 * 0.9 <= value(anyp, "mergewatch_collapse_lower_request_bytes", device=DISK, upper="md0") <= 4096 * 1.1
    assert value(anyp, "mergewatch_collapse_upper_bio_bytes", device=DISK, upper="md0") >= 8 * 4096
    assert value(anyp, "mergewatch_collapse_upper_request_ratio", device=DISK, upper="md0") > 0.95
    assert value(anyp, "mergewatch_device_holder_info", device=DISK, holder="md0") == 1
    assert value(anyp, "mergewatch_bpf_program_attached", tracepoint="block_bio_queue", mode="tp_btf") == 1
    # Same evidence, but under the default policy md is not an eligible upper device.
    assert value(dmp, "mergewatch_collapse_small_request_ratio", device=DISK, upper="") == 1
    assert value(dmp, "mergewatch_collapse_condition", device=DISK, upper="") == 0
    raised = {dict(k[1]).get("upper"): v for k, v in dmp.items()
              if k[0] == "mergewatch_merge_collapse" and dict(k[1]).get("device") == DISK}
    assert raised and not any(raised.values()), raised
    assert res["daemon_exit_0"] == "0" and res["daemon_exit_1"] == "0", res


def test_vm_only_metric_families_are_exported(res):
    """The families the host cannot show (they need a dm/md device; see test_reference.py) appear
    in the guest's scrapes."""
    families = set()
    for name in ("lvm-after-read.prom", "md-any.prom"):
        families |= set(re.findall(r"^# TYPE (\S+) ", read(name), re.M))
    for family in ("mergewatch_bio_size_bytes", "mergewatch_remapped_requests_total",
                   "mergewatch_remapped_missed_merges_total", "mergewatch_collapse_upper_bio_bytes",
                   "mergewatch_collapse_upper_request_ratio", "mergewatch_device_holder_info"):
        samples_of = [l for name in ("lvm-after-read.prom", "md-any.prom") for l in read(name).splitlines()
                      if l.startswith(family + "{") or l.startswith(family + "_count{")]
        assert family in families and samples_of, f"{family}: no samples in the guest scrapes"
