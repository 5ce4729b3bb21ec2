# SPDX-License-Identifier: Apache-2.0
"""Stacking decided at run time on Debian's 6.1 kernel: the second part of the scenario boot.

tests/vm/guest-stacking.sh runs at the end of guest-scenario.sh, in the same VM as test_vm.py: one
boot per pytest session for both files (vmtest.scenario_boot), whichever runs first.
It checks two documented claims no host test can (docs/architecture.md, docs/metrics.md): block_bio_queue is attached only while a dm/md device
is stacked on a disk and the choice is re-made at each rescan (an LV created after the daemon
started, then removed), and --collapse.require-upper=any takes an md device as the upper one. And the
fleet's multi-disk stacks (run-vm.sh --nvme-disks 2): a snapshot over md RAID0 and over a striped LV,
each over two NVMe disks and with two chunk or stripe sizes, over md RAID10, and RAID1 writes cut by a
snapshot's origin, pages on each disk under the upper device with nomerges=2, never with nomerges=0, and
counts what /sys/block/X/stat counts; a backup reading a snapshot while random readers hammer its origin
pages under the snapshot, not the origin; small direct writes beside fstrim never page.
"""
import re

import pytest

from multidisk import (check_mirror_writes_raised, check_stack_counts, check_stack_quiet, check_stack_raised,
                       collapse_series, multi_disks)
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
    Removed: detached again (docs/metrics.md: 'not needed now')."""
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

MULTI_STACKS = ("md", "striped")  # with the bounded reads counted against diskstats
# Raise with nomerges=2 and quiet with nomerges=0 only: md RAID0 with 64 KiB chunks and a striped LV with
# 4 KiB stripes, each under a 4 KiB-chunk snapshot.
QUICK_STACKS = ("md64k", "striped4k")
# Batched direct 64 KiB writes to the origin of a 4 KiB-chunk snapshot over md RAID10 (near 2) and over md
# RAID1: the origin target cuts them into 4 KiB pieces, md writes each to both members inside the writer's
# plug. The upper device is the origin.
WRITE_STACKS = ("raid10w", "raid1w")


def test_multi_disk_stacks_are_what_the_cases_claim(res):
    """md RAID0 with 4 KiB chunks over both disks; a striped LV with 64 KiB stripes over both."""
    disks = multi_disks(res)
    assert res["md1_level"] == "raid0" and res["md1_chunk_bytes"] == "4096", res
    assert sorted(res["md1_members"].split(",")) == sorted(disks), res
    table = res["striped_table"].split()
    # "0 <sectors> striped 2 128 <dev> <offset> <dev> <offset>": two stripes of 128 sectors.
    assert table[2:5] == ["striped", "2", "128"], table
    assert sorted(table[5::2]) == sorted(res["multi_devnos"].split(",")), (table, res["multi_devnos"])
    assert res["md2_level"] == "raid0" and res["md2_chunk_bytes"] == str(64 << 10), res
    assert res["md3_level"] == "raid10" and res["md3_chunk_bytes"] == str(64 << 10), res
    assert res["md3_layout"] == str(1 << 8 | 2), res  # near 2, far 1 (md's raid10 layout word)
    assert res["md4_level"] == "raid1", res
    for md in ("md2", "md3", "md4"):
        assert sorted(res[f"{md}_members"].split(",")) == sorted(disks), (md, res)
    table = res["striped4k_table"].split()
    assert table[2:5] == ["striped", "2", "8"], table  # 4 KiB stripes
    for stack in MULTI_STACKS + QUICK_STACKS + WRITE_STACKS:
        assert res[f"{stack}_upper"].startswith("dm-"), (stack, res)
    assert res["daemon_exit_multi"] == "0", res


@pytest.mark.parametrize("stack", MULTI_STACKS + QUICK_STACKS)
def test_multi_disk_snapshot_pages_for_each_disk_under_the_snapshot(res, stack):
    """nomerges=2 on both disks: each disk's (disk, snapshot) pair is raised, nothing else on them
    (multidisk.check_stack_raised)."""
    check_stack_raised(STACKING, res, stack)


@pytest.mark.parametrize("stack", MULTI_STACKS + QUICK_STACKS + WRITE_STACKS)
def test_multi_disk_snapshot_with_merging_on_stays_quiet(res, stack):
    """nomerges=0, the same load: no pair raised or with the condition, the pieces merged
    (multidisk.check_stack_quiet)."""
    check_stack_quiet(STACKING, res, stack)


@pytest.mark.parametrize("nomerges", [0, 2])
@pytest.mark.parametrize("stack", MULTI_STACKS)
def test_multi_disk_counts_equal_diskstats(res, stack, nomerges):
    """A bounded read of the snapshot counted as /sys/block/X/stat counts it (multidisk.check_stack_counts)."""
    check_stack_counts(STACKING, res, stack, nomerges)


@pytest.mark.parametrize("stack", WRITE_STACKS)
def test_multi_disk_origin_writes_over_mirrors_page_on_both_members_under_the_origin(res, stack):
    """Writes to a snapshot's origin over md RAID10/RAID1, nomerges=2: each member's (disk, origin) pair
    is raised (multidisk.check_mirror_writes_raised)."""
    check_mirror_writes_raised(STACKING, res, stack)


def test_multi_disk_snapshot_reads_over_raid10_have_no_merge_to_miss(res):
    """A snapshot (4 KiB chunks) over md RAID10 (near 2) on the two NVMe disks, nomerges=2: not raised in any
    of four scrapes, and rightly: read_balance() sends each 4 KiB piece to the mirror with the fewest pending
    requests, so consecutive pieces alternate disks and a disk's pieces are not contiguous; few are missed
    merges (none could have merged). The same stack's writes page (raid10w above)."""
    disks, snap = multi_disks(res), res["raid10r_upper"]
    for i in range(1, 5):
        s = samples(f"multi-raid10r-nm2-poll-{i}.prom")
        assert not any(collapse_series(s, disks).values()), (i, collapse_series(s, disks))
    for d in disks:
        assert value(s, "mergewatch_collapse_requests_per_second", device=d, upper=snap) >= 50, d
        assert value(s, "mergewatch_collapse_lower_request_bytes", device=d, upper=snap) == pytest.approx(4096, rel=0.1)
        assert value(s, "mergewatch_collapse_missed_merge_ratio", device=d, upper=snap) < 0.2, d


def test_backup_of_a_snapshot_beside_a_hammered_origin_pages_under_the_snapshot(res):
    """nomerges=2 on both disks of the striped LV (64 KiB stripes); four random 8 KiB readers (queue depth
    32, direct) on the origin, and the backup's batched 64 KiB reads of its snapshot: each disk's (disk,
    snapshot) pair is raised and named in /status and the log; each disk's (disk, origin) pair is judged
    on the origin's own requests (about none a missed merge) and stays down (measured: judged
    disk-wide, the origin's requests hid the snapshot's and the origin was taken as the upper device)."""
    disks, snap, origin = multi_disks(res), res["live_snapshot"], res["live_origin"]
    assert snap == res["striped_upper"] and origin.startswith("dm-") and origin != snap, res
    s = samples("live.prom")
    pairs = collapse_series(s, disks)
    assert {pair for pair, v in pairs.items() if v == 1} == {(d, snap) for d in disks}, pairs
    for d in disks:
        assert pairs.get((d, origin)) == 0, (d, pairs)
        assert value(s, "mergewatch_collapse_condition", device=d, upper=origin) == 0
        assert value(s, "mergewatch_collapse_missed_merge_ratio", device=d, upper=origin) < 0.2
        assert value(s, "mergewatch_collapse_missed_merge_ratio", device=d, upper=snap) >= 0.5
        # The origin's random reads are a real share of the disk's requests, at their own size.
        assert value(s, "mergewatch_collapse_upper_request_ratio", device=d, upper=origin) >= 0.2
        assert value(s, "mergewatch_collapse_requests_per_second", device=d, upper=origin) >= 50
        assert value(s, "mergewatch_collapse_lower_request_bytes", device=d, upper=origin) == pytest.approx(8192, rel=0.1)
    # /status at the same moment: the snapshot's pairs collapsed, the origin's not (the daemon's log is no
    # witness here: later stacks reuse the dm-N names).
    verdicts = {(v["device"], v["upper"]): v for v in STACKING.json("live-status.json")["verdicts"]}
    for d in disks:
        assert verdicts[(d, snap)]["state"] == "collapsed", verdicts
        assert verdicts.get((d, origin), {}).get("state") != "collapsed", verdicts


@pytest.mark.parametrize("nomerges", [0, 2])
def test_small_direct_writes_beside_fstrim_never_page(res, nomerges):
    """ext4 on an LV over one disk: batched 4 KiB direct writes while a loop frees 192 MiB and runs fstrim
    (discards of up to 128 MiB). No pair on the disk is raised or has the condition in any of four scrapes.
    With nomerges=2 the writes' merges are missed (a missed-merge share above one half) and only the size
    rule keeps it quiet: the LV's bios are as small as its requests, because its discards, which the
    daemon counts as bios, stay out of its mean bio size."""
    d, lv = res["trim_disk"], res["trim_upper"]
    assert int(res["trim_discard_max_bytes"]) > 0, res
    before, after = ([int(x) for x in read(f"trim-nm{nomerges}-stat-{w}.txt").split()] for w in ("before", "after"))
    assert after[4] > before[4], (before, after)  # writes completed
    assert after[11] > before[11], (before, after)  # discards completed
    for i in range(1, 5):
        s = samples(f"trim-nm{nomerges}-poll-{i}.prom")
        assert not any(collapse_series(s, [d]).values()), (i, collapse_series(s, [d]))
        conditions = {k: v for k, v in s.items() if k[0] == "mergewatch_collapse_condition"
                      and dict(k[1]).get("device") == d}
        assert conditions and not any(conditions.values()), (i, conditions)
    s0, s = samples(f"trim-nm{nomerges}-poll-1.prom"), samples(f"trim-nm{nomerges}-poll-4.prom")

    def delta(name, **labels):
        return value(s, name, **labels) - get(s0, name, **labels)

    # The discards were there, at the LV, between the first and the last scrape: taken into its bios they
    # would make its mean bio over four times its 4 KiB requests (about 100 KiB in the exploration boot,
    # 21 discards of 70-80 MiB beside 15-18 thousand writes), and the size rule true.
    discards = delta("mergewatch_bio_size_bytes_count", device=lv, op="discard")
    writes = delta("mergewatch_bio_size_bytes_count", device=lv, op="write")
    assert discards > 0 and writes > 0, (discards, writes)
    with_discards = (delta("mergewatch_bio_size_bytes_sum", device=lv, op="discard") +
                     delta("mergewatch_bio_size_bytes_sum", device=lv, op="write")) / (discards + writes)
    assert with_discards >= 4 * 4096, with_discards
    # What the detector takes: the LV's reads and writes only.
    assert value(s, "mergewatch_collapse_upper_bio_bytes", device=d, upper=lv) <= 8192
    if nomerges == 2:
        assert value(s, "mergewatch_collapse_missed_merge_ratio", device=d, upper=lv) >= 0.5
        assert value(s, "mergewatch_collapse_lower_request_bytes", device=d, upper=lv) == pytest.approx(4096, rel=0.1)
