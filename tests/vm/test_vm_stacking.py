# SPDX-License-Identifier: Apache-2.0
"""Stacking decided at run time on Debian's 6.1 kernel: the second part of the scenario boot.

tests/vm/guest-stacking.sh runs at the end of guest-scenario.sh, in the same VM as test_vm.py: one
boot per pytest session for both files (vmtest.scenario_boot), whichever runs first.
It checks two README claims no host test can: block_bio_queue is attached only while a dm/md device
is stacked on a disk and the choice is re-made at each rescan (an LV created after the daemon
started, then removed), and --collapse.require-upper=any takes an md device as the upper one. And the
fleet's multi-disk stacks (run-vm.sh --nvme-disks 2): a snapshot over md RAID0 and over a striped LV,
each over two NVMe disks, pages on each disk under the snapshot with nomerges=2, never with nomerges=0,
and counts what /sys/block/X/stat counts.
"""
import re

import pytest

from vmtest import SCENARIO, RunDir, check_late_lv_read, disks, get, scenario_boot, value

STACKING = RunDir(SCENARIO.file("stacking"))
DISK = None  # the scenario's disk, found by its serial in the guest (vmtest.disks): set by res
read, samples = STACKING.read, STACKING.samples


@pytest.fixture(scope="module")
def scenario_run():
    """This session's scenario boot (vmtest.scenario_boot: one for test_vm.py and test_vm_stacking.py)."""
    return scenario_boot()


@pytest.fixture(scope="module")
def res(scenario_run):
    """The guest's key=value results from this session's scenario boot (one for test_vm.py and this
    file, into an emptied run directory)."""
    global DISK
    DISK = disks(SCENARIO)["disk"]
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
    """While attached, the LV's bios and the disk's requests they became are exported by both daemons:
    64 x 256 KiB direct reads, one at a time, each one request at the disk (max_sectors_kb 512); the
    disk's diskstats are the count."""
    check_late_lv_read(STACKING, res["late_device"], DISK)


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
    for name in ("lvm-after-read-19871.prom", "md-any.prom"):
        families |= set(re.findall(r"^# TYPE (\S+) ", read(name), re.M))
    for family in ("mergewatch_bio_size_bytes", "mergewatch_remapped_requests_total",
                   "mergewatch_remapped_missed_merges_total", "mergewatch_collapse_upper_bio_bytes",
                   "mergewatch_collapse_upper_request_ratio", "mergewatch_device_holder_info"):
        samples_of = [l for name in ("lvm-after-read-19871.prom", "md-any.prom") for l in read(name).splitlines()
                      if l.startswith(family + "{") or l.startswith(family + "_count{")]
        assert family in families and samples_of, f"{family}: no samples in the guest scrapes"


# --- Several disks under one upper device (guest-stacking.sh part 3, run-vm.sh --nvme-disks 2) ----------------

MULTI_STACKS = ("md", "striped")


def multi_disks(res):
    disks = res["multi_disks"].split(",")
    assert len(disks) == 2 and all(d.startswith("nvme") for d in disks), res
    return disks


def collapse_series(s, disks):
    """{(device, upper): value} of mergewatch_merge_collapse on the given disks."""
    return {(dict(k[1])["device"], dict(k[1]).get("upper", "")): v for k, v in s.items()
            if k[0] == "mergewatch_merge_collapse" and dict(k[1]).get("device") in disks}


def test_multi_disk_stacks_are_what_the_cases_claim(res):
    """md RAID0 with 4 KiB chunks over both disks; a striped LV with 64 KiB stripes over both."""
    disks = multi_disks(res)
    assert res["md1_level"] == "raid0" and res["md1_chunk_bytes"] == "4096", res
    assert sorted(res["md1_members"].split(",")) == sorted(disks), res
    table = res["striped_table"].split()
    # "0 <sectors> striped 2 128 <dev> <offset> <dev> <offset>": two stripes of 128 sectors.
    assert table[2:5] == ["striped", "2", "128"], table
    assert sorted(table[5::2]) == sorted(res["multi_devnos"].split(",")), (table, res["multi_devnos"])
    assert res["md_upper"].startswith("dm-") and res["striped_upper"].startswith("dm-"), res
    assert res["daemon_exit_multi"] == "0", res


@pytest.mark.parametrize("stack", MULTI_STACKS)
def test_multi_disk_snapshot_pages_for_each_disk_under_the_snapshot(res, stack):
    """nomerges=2 on both disks: each disk's (disk, snapshot) pair is raised, nothing else on them. The
    plug of each io_submit holds requests of both disks (A0 B0 A1 ...): the per-plug generation rule
    sees the missed merges the "rq_count grew by one" rule missed (issue 22, point 1)."""
    disks, snap = multi_disks(res), res[f"{stack}_upper"]
    s = samples(f"multi-{stack}-nm2.prom")
    raised = {pair for pair, v in collapse_series(s, disks).items() if v == 1}
    assert raised == {(d, snap) for d in disks}, collapse_series(s, disks)
    for d in disks:
        assert value(s, "mergewatch_collapse_missed_merge_ratio", device=d, upper=snap) >= 0.5
        assert value(s, "mergewatch_collapse_lower_request_bytes", device=d, upper=snap) == pytest.approx(4096, rel=0.1)
        assert value(s, "mergewatch_collapse_upper_bio_bytes", device=d, upper=snap) >= 4 * 4096
    # The remedy names the pair: /status says what the onset line says, for each disk.
    status = STACKING.json(f"multi-{stack}-nm2-status.json")
    verdicts = {(v["device"], v["upper"]): v for v in status["verdicts"]}
    for d in disks:
        v = verdicts[(d, snap)]
        assert v["state"] == "collapsed" and v["active"], v
        assert v["cause"].startswith(f"nomerges=2 on {d} "), v
        assert f"echo 0 > /sys/block/{d}/queue/nomerges" in v["remedy"] and snap in v["remedy"], v
    log = read("daemon-multi.log")
    for d in disks:
        assert f"merge collapse on {d} (under {snap})" in log, log[-3000:]


@pytest.mark.parametrize("stack", MULTI_STACKS)
def test_multi_disk_snapshot_with_merging_on_stays_quiet(res, stack):
    """nomerges=0, the same reads: no pair on either disk is raised or even has the condition in any
    scrape while the reads run (four scrapes, over twice the window plus raise-after), and each disk's
    snapshot pair was judged: its pieces merged (back merges/s above 0), none was a missed merge."""
    disks, snap = multi_disks(res), res[f"{stack}_upper"]
    merged = {d: 0.0 for d in disks}
    for i in range(1, 5):
        s = samples(f"multi-{stack}-nm0-poll-{i}.prom")
        assert not any(collapse_series(s, disks).values()), (i, collapse_series(s, disks))
        for k, v in s.items():
            labels = dict(k[1])
            if labels.get("device") in disks:
                if k[0] == "mergewatch_collapse_condition":
                    assert v == 0, (i, k)
                if k[0] == "mergewatch_collapse_missed_merge_ratio" and labels.get("upper") == snap:
                    assert v < 0.05, (i, k, v)
                if k[0] == "mergewatch_collapse_back_merges_per_second" and labels.get("upper") == snap:
                    merged[labels["device"]] = max(merged[labels["device"]], v)
    assert all(r > 0 for r in merged.values()), merged


@pytest.mark.parametrize("nomerges", [0, 2])
@pytest.mark.parametrize("stack", MULTI_STACKS)
def test_multi_disk_counts_equal_diskstats(res, stack, nomerges):
    """A bounded read (64 direct 64 KiB reads of the snapshot, 4 MiB): each disk's requests, and the
    ones counted for the snapshot, equal the reads /sys/block/X/stat counted; with nomerges=2 none
    merged and most are missed merges, with nomerges=0 the pieces merged and none is missed."""
    disks, snap = multi_disks(res), res[f"{stack}_upper"]
    p = f"multi-{stack}-nm{nomerges}"
    s0, s = samples(f"{p}-before.prom"), samples(f"{p}-after.prom")
    total_sectors = 0
    for d in disks:
        before, after = ([int(x) for x in read(f"{p}-{d}-stat-{w}.txt").split()] for w in ("before", "after"))
        reads, merges, sectors = after[0] - before[0], after[1] - before[1], after[2] - before[2]
        total_sectors += sectors

        def delta(name, **labels):
            return value(s, name, **labels) - get(s0, name, **labels)

        assert delta("mergewatch_request_size_bytes_count", device=d, op="read") == reads > 0
        assert delta("mergewatch_remapped_requests_total", device=d, origin=snap, op="read") == reads
        missed = delta("mergewatch_remapped_missed_merges_total", device=d, origin=snap, op="read")
        if nomerges == 2:
            # 4 KiB requests, none merged; of each plug's run on a disk all but the first are missed merges.
            assert merges == 0 and sectors == 8 * reads, (d, reads, merges, sectors)
            assert missed >= reads / 2, (d, missed, reads)
        else:
            assert merges > 0 and sectors > 8 * reads and missed == 0, (d, reads, merges, sectors, missed)
    assert total_sectors * 512 == 4 << 20
