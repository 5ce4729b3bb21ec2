# SPDX-License-Identifier: Apache-2.0
"""The 2019 incident for real: Debian's 6.1 kernel in qemu, an LVM snapshot on an emulated NVMe disk.

One VM run (tests/vm/run-vm.sh --part-disk --multipath, a few minutes under TCG) plays the
cases with the project's own mergewatchd in the guest, one daemon per case, default policy (no
loop flags); the assertions read the /metrics scrapes, /sys/block stat deltas and daemon logs
it leaves in the run directory. Besides the incident on the disk with serial mw0001 (4 KiB chunks): snapshots with
8 and 16 KiB chunks on an LVM on an NVMe partition, an LVM snapshot on a native-multipath
namespace (two controllers), and requeues forced with scsi_debug.
"""
import os
import re
import select
import subprocess
import time

import pytest

import vmtest
from vmtest import DAEMON, KERNELS, SCENARIOS, find, get, scenario_boot

SCENARIO = SCENARIOS["6.1"]  # the run the module's readers use: set per kernel by scenario_run
KERNEL = "6.1"


@pytest.fixture(scope="module", params=KERNELS)
def scenario_run(request):
    """This session's scenario boot of each kernel (vmtest.scenario_boot: one per kernel for test_vm.py,
    test_vm_stacking.py and test_vm_kernels.py). Module-scoped and parametrized, so pytest runs every
    test of one kernel before the next kernel's boot; the readers below follow SCENARIO."""
    global SCENARIO, KERNEL
    SCENARIO, KERNEL = SCENARIOS[request.param], request.param
    return scenario_boot(request.param)


# The tests of cases that the 6.1 boot alone plays (vmtest.KERNEL_CASES lists the 5.10 and 6.12 boots' cases).
only_6_1 = pytest.mark.parametrize("scenario_run", [k for k in KERNELS if k == "6.1"], indirect=True)


def disks():
    """What the guest found by serial: disk, part_disk, mp_head, mp_paths (comma list), sd_disk."""
    return vmtest.disks(SCENARIO)


def scenario_disk():
    """The scenario's disk (serial mw0001): the incident's snapshot sits on it."""
    return disks()["disk"]


class Case:
    def __init__(self, name):
        p = f"case-{name}"
        self.path = SCENARIO.file(p)
        self.before, self.after = (SCENARIO.samples(f"{p}.{x}.prom") for x in ("before", "after"))
        # A case with nothing to detect (kind direct) has no settled scrape: after is the last.
        self.settled = SCENARIO.samples(f"{p}.settled.prom") if SCENARIO.exists(f"{p}.settled.prom") else self.after
        self.log = SCENARIO.read(f"{p}.daemon.log")

    def delta(self, name, **labels):
        return get(self.after, name, **labels) - get(self.before, name, **labels)

    def raised(self, disk=None):
        """The upper devices whose (disk, upper) pair is raised; every other pair of the disk must be 0."""
        series = self.collapse(disk or scenario_disk())
        assert set(series.values()) <= {0.0, 1.0}, series
        return {upper for upper, v in series.items() if v == 1.0}

    def collapse(self, disk=None):
        """The merge_collapse series of the disk (the scenario's by default) at the settled scrape: {upper: value}."""
        return {dict(k)["upper"]: v for k, v in
                find(self.settled, "mergewatch_merge_collapse", device=disk or scenario_disk()).items()}

    def stat_reads(self):
        """Read requests per device from the guest's /sys/block/*/stat deltas: {name: reads}."""
        out = {}
        with open(f"{self.path}.diskstats") as f:
            for line in f:
                fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
                out[fields["dev"]] = int(fields["reads"])
        return out

    def dm_device(self, dm_name):
        for labels in find(self.settled, "mergewatch_device_info", dm_name=dm_name):
            return dict(labels)["device"]
        raise AssertionError(f"no dm device named {dm_name}")

    def read_sizes(self, disk=None, le="4096"):
        disk = disk or scenario_disk()
        count = self.delta("mergewatch_request_size_bytes_count", device=disk, op="read")
        small = self.delta("mergewatch_request_size_bytes_bucket", device=disk, op="read", le=le)
        total = self.delta("mergewatch_request_size_bytes_sum", device=disk, op="read")
        return count, small, total


def test_same_bpf_object_loads_on_both_kernels(scenario_run):
    # The first case's daemon at its start, parsed: the issue and completion programs attached (1),
    # each in one mode, the same for both. (Not daemon.ready.prom, the last daemon's: on 5.10 that is a
    # nocap-* case's, which runs without BPF.)
    ready = SCENARIO.samples("case-snap-nm2.before.prom")
    attached = {dict(k)["tracepoint"]: (dict(k)["mode"], v) for k, v in find(ready, "mergewatch_bpf_program_attached").items()}
    for tracepoint in ("block_rq_issue", "block_rq_complete"):
        assert attached.get(tracepoint, (None, 0))[1] == 1.0, attached
    guest_mode = attached["block_rq_issue"][0]
    assert guest_mode in ("tp_btf", "raw_tp") and attached["block_rq_complete"][0] == guest_mode, attached
    print(f"ATTACH guest kernel {os.path.basename(SCENARIO.path)} (Debian): {guest_mode}")
    # The same binary, with the same embedded object, attached on this host's kernel: its log
    # must say "attached" before it exits or 60 s pass (an exit or silence fails the test).
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([DAEMON, f"--web.listen-address=127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True)
    seen, attached_line = [], None
    try:
        deadline = time.monotonic() + 60
        while attached_line is None and time.monotonic() < deadline:
            ready_fds, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
            if not ready_fds:
                break
            line = proc.stderr.readline()
            if line == "":  # EOF: the daemon exited
                break
            seen.append(line)
            if "attached" in line:
                attached_line = line.strip()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert attached_line is not None, f"host daemon never logged 'attached' (exit {proc.returncode}):\n{''.join(seen)}"
    print(f"ATTACH host {os.uname().release}: {attached_line}")
    assert "tp_btf" in attached_line or "raw_tp" in attached_line, attached_line


def test_nomerges_2_snapshot_read_raises_collapse_naming_the_snapshot(scenario_run):
    c, disk = Case("snap-nm2"), scenario_disk()
    snapshot = c.dm_device("vg0-snap")
    assert c.raised() == {snapshot}, c.collapse()
    count, small, total = c.read_sizes()
    assert count >= 16384 and small >= 0.99 * count, (count, small)
    # The snapshot received the reader's large bios; the disk got 4 KiB requests.
    bios = c.delta("mergewatch_bio_size_bytes_count", device=snapshot, op="read")
    bio_bytes = c.delta("mergewatch_bio_size_bytes_sum", device=snapshot, op="read")
    assert bios > 0 and bio_bytes / bios >= 128 * 1024, (bios, bio_bytes)
    assert c.delta("mergewatch_bio_merges_total", device=disk, op="read", kind="back") == 0
    assert c.delta("mergewatch_missed_merges_total", device=disk, op="read") >= 0.9 * count
    assert f"merge collapse on {disk} (under {snapshot})" in c.log
    # The block_bio_remap chain (snapshot -> its -real layer -> the disk) attributes the
    # disk's requests to the snapshot itself, not to the layer they passed through.
    remapped = c.delta("mergewatch_remapped_requests_total", device=disk, origin=snapshot, op="read")
    assert remapped >= 0.9 * count, (remapped, count, find(c.after, "mergewatch_remapped_requests_total"))
    real = c.dm_device("vg0-origin-real")
    assert c.delta("mergewatch_remapped_requests_total", device=disk, origin=real, op="read") == 0
    assert c.delta("mergewatch_remapped_missed_merges_total", device=disk, origin=snapshot, op="read") >= 0.9 * count
    assert f"% of them remapped from {snapshot}" in c.log
    assert f"nomerges=2 on {disk}" in c.log and f"echo 0 > /sys/block/{disk}/queue/nomerges" in c.log


def test_nomerges_0_snapshot_read_merges_and_never_raises(scenario_run):
    c, disk = Case("snap-nm0"), scenario_disk()
    assert set(c.collapse().values()) == {0.0}, c.collapse()
    count, small, total = c.read_sizes()
    assert 0 < count <= 16384 / 16 and total / count >= 128 * 1024, (count, total)
    assert c.delta("mergewatch_bio_merges_total", device=disk, op="read", kind="back") >= 16000
    assert "merge collapse on" not in c.log


@only_6_1
def test_random_4k_reads_on_the_snapshot_never_raise(scenario_run):
    c = Case("snap-rand-nm2")
    assert set(c.collapse().values()) == {0.0}, c.collapse()
    count, small, total = c.read_sizes()
    assert count >= 4096 and small == count  # small requests, healthy: nothing to merge
    assert "merge collapse on" not in c.log


@only_6_1
def test_origin_read_is_recorded(scenario_run):
    """Reading the origin LV: a linear layer passes the reader's large bios through, so
    the disk sees large requests and there is nothing to detect (docs/testing.md, "The VM test")."""
    c, disk = Case("origin-nm2"), scenario_disk()
    count, small, total = c.read_sizes()
    print(f"origin-nm2: {count:.0f} requests, mean {total / max(count, 1):.0f} bytes, "
          f"collapse={c.collapse()}")
    assert count > 0 and total / count >= 128 * 1024
    assert set(c.collapse().values()) == {0.0}
    origin = c.dm_device("vg0-origin")
    remapped = c.delta("mergewatch_remapped_requests_total", device=disk, origin=origin, op="read")
    assert remapped >= 0.9 * count, (remapped, count, find(c.after, "mergewatch_remapped_requests_total"))


# 8 KiB chunks on every kernel (LVM on an NVMe partition), 16 KiB on 6.1 only.
@pytest.mark.parametrize("scenario_run,kib", [(k, 8) for k in KERNELS] +
                         [(k, 16) for k in KERNELS if k == "6.1"],
                         indirect=["scenario_run"])
def test_snapshot_chunks_of_8_and_16_kib_with_nomerges_2_raise_naming_the_snapshot(scenario_run, kib):
    """The snapshot sends its bios down as kib-sized requests, one by one;
    the detector pages as for 4 KiB chunks. The VG sits on a partition (nvme?n1p1), so this
    also shows LVM on an NVMe partition raising."""
    c = Case(f"snap{kib}-nm2")
    disk = disks()["part_disk"]
    snapshot = c.dm_device(f"vg2-snap{kib}")
    partition = [dict(k)["device"] for k in find(c.settled, "mergewatch_device_info", disk=disk)
                 if dict(k)["device"] != disk]
    assert partition == [f"{disk}p1"], partition
    assert c.raised(disk) == {snapshot}, c.collapse(disk)
    count, at_chunk, total = c.read_sizes(disk, le=str(kib * 1024))
    smaller = c.delta("mergewatch_request_size_bytes_bucket", device=disk, op="read", le=str(kib * 512))
    bios = c.delta("mergewatch_bio_size_bytes_count", device=snapshot, op="read")
    # kib-sized requests: none above the chunk, and below it at most the piece at each end of a bio that does
    # not start or end on a chunk boundary. Measured: on 6.1 nearly all in the chunk's bucket; on 5.10 each
    # of the 128 readahead bios of 256 KiB left a 4 KiB piece at both ends (256 of 4224 requests at 8 KiB).
    assert count >= 32 * 1024 / kib and at_chunk >= 0.98 * count, (count, at_chunk)
    assert bios > 0 and smaller <= 2 * bios, (count, smaller, bios)
    assert count <= c.stat_reads()[disk], (count, c.stat_reads())
    assert c.delta("mergewatch_missed_merges_total", device=disk, op="read") >= 0.9 * count
    # The remap chain passes the partition's hop on (blk_partition_remap()'s block_bio_remap): the disk's
    # requests come from the snapshot, never from the partition. On 5.10 the partition's dev_t comes from the
    # disk's partition table (an NVMe partition is not first_minor + bi_partno: bpf/core_fixes.bpf.h); with
    # that sum the partition took the chain over and the pair (disk, snapshot) did not page whenever the partition's
    # number was not the disk's next minor (it depends on the probe order: 259:0 and 259:5 in one boot, 259:4 and 259:5
    # in another).
    remapped = c.delta("mergewatch_remapped_requests_total", device=disk, origin=snapshot, op="read")
    assert remapped >= 0.9 * count, (remapped, count, find(c.after, "mergewatch_remapped_requests_total"))
    assert c.delta("mergewatch_remapped_requests_total", device=disk, origin=partition[0], op="read") == 0
    assert c.delta("mergewatch_bio_merges_total", device=disk, op="read", kind="back") == 0
    assert f"merge collapse on {disk} (under {snapshot})" in c.log, c.log[-3000:]
    assert f"echo 0 > /sys/block/{disk}/queue/nomerges" in c.log


@only_6_1
def test_snapshot_chunks_of_8_and_16_kib_with_nomerges_0_never_raise(scenario_run):
    """One case reads the same 32 MiB file through both snapshots, merging on."""
    c = Case("snap8-16-nm0")
    disk = disks()["part_disk"]
    assert set(c.collapse(disk).values()) == {0.0}, c.collapse(disk)
    for kib in (8, 16):
        snapshot = c.dm_device(f"vg2-snap{kib}")
        assert c.delta("mergewatch_bio_size_bytes_sum", device=snapshot, op="read") >= 32 << 20, snapshot
    count, small, total = c.read_sizes(disk)
    assert count > 0 and total / count >= 128 * 1024, (count, total)
    # 4096 8 KiB + 2048 16 KiB pieces merged back into about 2 x 128 requests: 5888 back merges.
    assert c.delta("mergewatch_bio_merges_total", device=disk, op="read", kind="back") >= 0.9 * 5888
    assert "merge collapse on" not in c.log


def test_lvm_on_a_native_multipath_namespace_raises_and_counts_the_paths(scenario_run):
    """Two controllers share namespace 1: LVM sits on the head, requests run on the hidden
    path disks. The head's series counts them: exactly the paths' /sys/block stat summed (the
    head's own stat stays 0 on 5.10 and 6.1; 6.12 accounts the head's I/O too, nvme-multipath's I/O
    statistics on the head disk, added after 6.1: there it equals the paths' sum)."""
    c = Case("mp-nm2")
    d = disks()
    head, paths = d["mp_head"], d["mp_paths"].split(",")
    subsystem, namespace = re.fullmatch(r"nvme(\d+)n(\d+)", head).groups()
    assert len(paths) == 2 and all(re.fullmatch(rf"nvme{subsystem}c\d+n{namespace}", p) for p in paths), d
    snapshot = c.dm_device("vg1-mpsnap")
    stat = c.stat_reads()
    path_reads = sum(stat.get(p, 0) for p in paths)
    assert stat.get(head, 0) == (path_reads if KERNEL == "6.12" else 0), stat
    count, small, total = c.read_sizes(head)
    if KERNEL == "5.10":
        # NOT COVERED on 5.10: the hidden path disks have no dev file there and no diskseq (v5.15) to
        # key them by, so the daemon skips them (a warning per path) and their requests reach no series:
        # the head shows none. Asserted as it is, so a change either way shows.
        print(f"NOT COVERED on 5.10: {path_reads} requests on the multipath paths {paths} are not exported")
        assert count == 0 and path_reads >= 8192, (count, stat)
        for p in paths:
            assert f"{p}: no dev file, skipped" in c.log, c.log[-3000:]
        return
    assert count == path_reads and count >= 8192, (count, stat)  # 32 MiB in 4 KiB chunks
    assert get(c.settled, "mergewatch_unresolved_devices") == 0
    assert c.raised(head) == {snapshot}, c.collapse(head)
    assert c.delta("mergewatch_missed_merges_total", device=head, op="read") >= 0.9 * count
    assert f"merge collapse on {head} (under {snapshot})" in c.log, c.log[-3000:]
    assert f"nomerges=2 on {','.join(sorted(paths))}" in c.log, c.log[-3000:]


@only_6_1
def test_requeued_requests_are_counted_once(scenario_run):
    """scsi_debug answers every 7th command "host busy": the block layer requeues the request
    (block_rq_requeue) and issues it again. The daemon's request count must still equal the
    disk's stat."""
    c = Case("requeue")
    sd = disks()["sd_disk"]
    with open(f"{c.path}.requeues") as f:
        requeues = int(f.read().strip() or 0)
    assert requeues > 0, "scsi_debug forced no requeue: the case proves nothing"
    count, small, total = c.read_sizes(sd, le="16384")
    stat = c.stat_reads()
    assert count == stat[sd] == 512, (count, stat, requeues)
    assert total == 512 * 16384
