# SPDX-License-Identifier: Apache-2.0
"""The I/O split ticket (mergewatch_io_split_finding) on Debian's 6.1 kernel: guest-stacking.sh's `split` part,
in the scenario boot (vmtest.scenario_boot, one boot for test_vm.py, test_vm_stacking.py and this file).

Direct 1 MiB reads (fio --direct=1 --bs=1m) of an LVM snapshot with 4 KiB chunks reach the NVMe disk as 4 KiB
requests that no setting merges: the block device's direct I/O path does not plug, so each piece is issued before
the next exists. So with nomerges 0 and 2 alike the pair (disk, snapshot) gets the split ticket, naming the
snapshot and its chunk (4096 bytes: the piece size seen at the disk), and no collapse page. Buffered reads of the
same snapshot with nomerges=2 (readahead plugs: the pieces are missed merges) page and get no ticket. A 64 KiB-chunk
snapshot read directly gets neither. The daemon runs with the shipped unit's capabilities only (CAP_BPF,
CAP_PERFMON), so the cause is what those privileges show (sysfs, no dm ioctl).
"""
import json

import pytest

from vmtest import SCENARIO, RunDir, scenario_boot, value
from mwtest import absent  # noqa: E402  (vmtest puts tests/ on the path)

STACKING = RunDir(SCENARIO.file("stacking"))
CAP_BPF_PERFMON = "000000c000000000"  # CAP_PERFMON (38) | CAP_BPF (39)
SPLIT = "mergewatch_io_split_finding"
COLLAPSE = "mergewatch_merge_collapse"


@pytest.fixture(scope="module")
def res():
    scenario_boot()
    results = STACKING.results()
    print({k: v for k, v in results.items() if k.startswith("split") or k == "daemon_exit_split"})
    assert "failed" not in results, f"guest-stacking.sh failed: {results['failed']}"
    assert "split_disk" in results, "guest-stacking.sh ran no split part (MW_STACK_PARTS)"
    return results


def polls(case):
    """The four scrapes taken 1.5 s apart while the case's reads ran (after the ticket or page rose, if one
    was awaited)."""
    return [STACKING.samples(f"split-{case}-poll-{i}.prom") for i in range(1, 5)]


def split_findings(case):
    doc = json.loads(STACKING.read(f"split-{case}-status.json"))
    return [f for f in doc["findings"] if f.get("kind") == "io_split"]


def test_the_daemon_has_the_units_capabilities_only(res):
    caps = dict(line.split(":\t") for line in STACKING.read("split-daemon-caps.txt").splitlines())
    for cap in ("CapEff", "CapPrm", "CapBnd"):
        assert caps[cap].strip() == CAP_BPF_PERFMON, caps
    assert res["daemon_exit_split"] == "0", res


def test_the_snapshots_chunks_are_not_in_sysfs(res):
    """Why the daemon names the piece size it saw: a dm snapshot's queue/chunk_sectors is 0 on 6.1, its chunk size
    is in its table only (a dm ioctl, which the unit's capabilities do not allow)."""
    assert res["split4k_chunk_sectors"] == "0", res
    assert res["split64k_chunk_sectors"] == "0", res


@pytest.mark.parametrize("case", ["snap4k-nm0", "snap4k-nm2"])
def test_direct_reads_of_a_4k_chunk_snapshot_get_the_ticket_and_no_page(res, case):
    disk, dm = res["split_disk"], res["split4k_upper"]
    assert res[f"split_{case}_raised_seconds"] != "timeout", f"{case}: no split ticket on ({disk}, {dm})"
    for i, s in enumerate(polls(case), 1):
        assert value(s, SPLIT, device=disk, upper=dm) == 1, f"{case} poll {i}"
        assert absent(s, COLLAPSE, device=disk, upper=dm) or value(s, COLLAPSE, device=disk, upper=dm) == 0, \
            f"{case} poll {i}: a collapse page where nothing could merge"
        # The shape: 4 KiB pieces of bios many times larger, and merging neither missed nor made.
        assert 4096 * 0.9 <= value(s, "mergewatch_collapse_lower_request_bytes", device=disk, upper=dm) <= 4096 * 1.1
        assert value(s, "mergewatch_collapse_upper_bio_bytes", device=disk, upper=dm) >= 16 * 4096
        assert value(s, "mergewatch_collapse_missed_merge_ratio", device=disk, upper=dm) <= 0.05
        assert value(s, "mergewatch_collapse_requests_per_second", device=disk, upper=dm) >= 50
    found = split_findings(case)
    assert [(f["device"], f["upper"]) for f in found] == [(disk, dm)], found
    assert found[0]["chunk_bytes"] == 4096, found
    assert 4096 * 0.9 <= found[0]["request_bytes"] <= 4096 * 1.1, found
    assert "lvcreate -s -c 64k" in found[0]["remedy"], found
    log = STACKING.read(f"split-{case}-daemon.log")
    assert f"I/O split on {disk} (under {dm})" in log, log[-3000:]
    assert "4096-byte pieces; its chunk is 4096 bytes (the piece size seen at the disk" in log, log[-3000:]


def test_buffered_reads_with_nomerges_2_page_and_get_no_ticket(res):
    disk, dm = res["split_disk"], res["split4k_upper"]
    assert res["split_snap4k-buffered-nm2_raised_seconds"] != "timeout", "no collapse page for buffered reads"
    for i, s in enumerate(polls("snap4k-buffered-nm2"), 1):
        assert value(s, COLLAPSE, device=disk, upper=dm) == 1, f"poll {i}"
        assert absent(s, SPLIT, device=disk, upper=dm), f"poll {i}: a split ticket beside the collapse page"
    assert split_findings("snap4k-buffered-nm2") == []


def test_direct_reads_of_a_64k_chunk_snapshot_get_neither(res):
    disk, dm = res["split_disk"], res["split64k_upper"]
    for i, s in enumerate(polls("snap64k-nm2"), 1):
        assert absent(s, SPLIT, device=disk, upper=dm), f"poll {i}"
        assert value(s, COLLAPSE, device=disk, upper=dm) == 0, f"poll {i}"
        # The reads did reach the disk, in 64 KiB pieces.
        assert value(s, "mergewatch_collapse_requests_per_second", device=disk, upper=dm) >= 50, f"poll {i}"
        assert 65536 * 0.9 <= value(s, "mergewatch_collapse_lower_request_bytes", device=disk, upper=dm) \
            <= 65536 * 1.1, f"poll {i}"
    assert split_findings("snap64k-nm2") == []
