# SPDX-License-Identifier: Apache-2.0
"""The multi-disk stacks' checks (guest-stacking.sh's part 3, run-vm.sh --nvme-disks 2), shared by 6.1's
test_vm_stacking.py (every stack) and test_vm_kernels.py (5.10 and 6.12: vmtest.KERNEL_MULTI_PARTS). Each
takes the boot's stacking/ RunDir and its results."""
import pytest

from vmtest import get, value


def multi_disks(res):
    disks = res["multi_disks"].split(",")
    assert len(disks) == 2 and all(d.startswith("nvme") for d in disks), res
    return disks


def collapse_series(s, disks):
    """{(device, upper): value} of mergewatch_merge_collapse on the given disks."""
    return {(dict(k[1])["device"], dict(k[1]).get("upper", "")): v for k, v in s.items()
            if k[0] == "mergewatch_merge_collapse" and dict(k[1]).get("device") in disks}


def check_stack_raised(st, res, stack):
    """nomerges=2 on both disks: each disk's (disk, snapshot) pair is raised, nothing else on them. The
    plug of each io_submit holds requests of both disks (A0 B0 A1 ...): the per-plug generation rule
    sees the missed merges the "rq_count grew by one" rule missed."""
    disks, snap = multi_disks(res), res[f"{stack}_upper"]
    s = st.samples(f"multi-{stack}-nm2.prom")
    raised = {pair for pair, v in collapse_series(s, disks).items() if v == 1}
    assert raised == {(d, snap) for d in disks}, collapse_series(s, disks)
    for d in disks:
        assert value(s, "mergewatch_collapse_missed_merge_ratio", device=d, upper=snap) >= 0.5
        assert value(s, "mergewatch_collapse_lower_request_bytes", device=d, upper=snap) == pytest.approx(4096, rel=0.1)
        assert value(s, "mergewatch_collapse_upper_bio_bytes", device=d, upper=snap) >= 4 * 4096
    # The remedy names the pair: /status says what the onset line says, for each disk.
    status = st.json(f"multi-{stack}-nm2-status.json")
    verdicts = {(v["device"], v["upper"]): v for v in status["verdicts"]}
    for d in disks:
        v = verdicts[(d, snap)]
        assert v["state"] == "collapsed" and v["active"], v
        assert v["cause"].startswith(f"nomerges=2 on {d} "), v
        assert f"echo 0 > /sys/block/{d}/queue/nomerges" in v["remedy"] and snap in v["remedy"], v
    log = st.read("daemon-multi.log")
    for d in disks:
        assert f"merge collapse on {d} (under {snap})" in log, log[-3000:]


def check_stack_quiet(st, res, stack):
    """nomerges=0, the same reads: no pair on either disk is raised or even has the condition in any
    scrape while the reads run (four scrapes, over twice the window plus raise-after), and each disk's
    snapshot pair was judged: its pieces merged (back merges/s above 0), none was a missed merge."""
    disks, snap = multi_disks(res), res[f"{stack}_upper"]
    merged = {d: 0.0 for d in disks}
    for i in range(1, 5):
        s = st.samples(f"multi-{stack}-nm0-poll-{i}.prom")
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
    assert all(merged[d] > 0 for d in disks), merged


def check_stack_counts(st, res, stack, nomerges):
    """A bounded read (64 direct 64 KiB reads of the snapshot, 4 MiB): each disk's requests, and the
    ones counted for the snapshot, equal the reads /sys/block/X/stat counted; with nomerges=2 none
    merged and most are missed merges, with nomerges=0 the pieces merged and none is missed."""
    disks, snap = multi_disks(res), res[f"{stack}_upper"]
    p = f"multi-{stack}-nm{nomerges}"
    s0, s = st.samples(f"{p}-before.prom"), st.samples(f"{p}-after.prom")
    total_sectors = 0
    for d in disks:
        before, after = ([int(x) for x in st.read(f"{p}-{d}-stat-{w}.txt").split()] for w in ("before", "after"))
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


def check_mirror_writes_raised(st, res, stack):
    """nomerges=2: both members receive every write, each leg remapped from the same md hop, and each member's
    (disk, origin) pair is raised with the collapse's evidence (4 KiB requests under 64 KiB bios, most of them
    missed merges: the legs of one plug, A0 B0 A1 B1, are the multi-queue plug above); no pair
    on either disk is raised under anything else. (Before the chain left the md hop's entry for the bio's other
    clone, the second member's requests counted under md, upper="", and its pair never paged.)"""
    disks, origin = multi_disks(res), res[f"{stack}_upper"]
    s = st.samples(f"multi-{stack}-nm2.prom")
    raised = {pair for pair, v in collapse_series(s, disks).items() if v == 1}
    assert raised == {(d, origin) for d in disks}, collapse_series(s, disks)
    verdicts = {(v["device"], v["upper"]): v for v in st.json(f"multi-{stack}-nm2-status.json")["verdicts"]}
    for d in disks:
        assert value(s, "mergewatch_collapse_missed_merge_ratio", device=d, upper=origin) >= 0.5
        assert value(s, "mergewatch_collapse_lower_request_bytes", device=d, upper=origin) == pytest.approx(4096, rel=0.1)
        assert value(s, "mergewatch_collapse_upper_bio_bytes", device=d, upper=origin) == 64 << 10
        assert verdicts[(d, origin)]["cause"].startswith(f"nomerges=2 on {d} "), verdicts[(d, origin)]
        assert f"merge collapse on {d} (under {origin})" in st.read("daemon-multi.log")
