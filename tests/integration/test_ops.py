# SPDX-License-Identifier: Apache-2.0
"""Writes, flushes, FUA, discards, front merges and the max_sectors limit on real tracepoints, each
counted against the loop device's own /sys/block/X/stat (reads are in test_requests.py)."""
import mmap
import os
import subprocess

import pytest

from conftest import absent, baseline, fio, value

pytestmark = pytest.mark.privileged

SIZE = "mergewatch_request_size_bytes"
MERGES = "mergewatch_bio_merges_total"
MISSED = "mergewatch_missed_merges_total"
NOT_IO = "mergewatch_non_io_requests_total"

# /sys/block/X/stat fields (Documentation/block/stat.rst): discards since 4.19, flushes since 5.5.
STAT_FIELDS = ("reads", "read_merges", "read_sectors", "read_ticks", "writes", "write_merges", "write_sectors",
               "write_ticks", "in_flight", "io_ticks", "queue_ticks", "discards", "discard_merges",
               "discard_sectors", "discard_ticks", "flushes", "flush_ticks")


def diskstat(dev):
    with open(f"/sys/block/{dev.name}/stat") as f:
        return dict(zip(STAT_FIELDS, (int(x) for x in f.read().split())))


def op_shape(samples, dev, op, get=value):
    labels = dict(device=dev.name, op=op)
    return {"requests": get(samples, SIZE + "_count", **labels), "bytes": get(samples, SIZE + "_sum", **labels),
            "back": get(samples, MERGES, kind="back", **labels), "front": get(samples, MERGES, kind="front", **labels),
            "missed": get(samples, MISSED, **labels)}


def measure(daemon, dev, ops, workload):
    """Deltas of /metrics (per op) and of diskstats across workload()."""
    s = daemon.scrape()
    before = {op: op_shape(s, dev, op, get=baseline) for op in ops}
    stat_before = diskstat(dev)
    workload()
    s = daemon.scrape()
    after = {op: op_shape(s, dev, op) for op in ops}
    stat_after = diskstat(dev)
    delta = {op: {k: after[op][k] - before[op][k] for k in after[op]} for op in ops}
    delta["stat"] = {k: stat_after[k] - stat_before[k] for k in STAT_FIELDS}
    return delta


@pytest.mark.parametrize("scheduler", ["mq-deadline", "none"])
def test_sequential_writes_match_diskstats(daemon, loop_device, scheduler):
    dev = loop_device()
    dev.set_queue(scheduler=scheduler, nomerges=0)
    d = measure(daemon, dev, ["write"], lambda: fio(dev, rw="write", size_mb=8))
    w, stat = d["write"], d["stat"]
    assert w["requests"] == stat["writes"] > 0, d
    assert w["bytes"] == stat["write_sectors"] * 512 == 8 << 20, d
    assert w["back"] == stat["write_merges"], d
    assert w["requests"] + w["back"] == 2048, d   # each 4 KiB bio started a request or was merged
    assert w["missed"] == 0, d

    dev.set_queue(nomerges=2)
    d = measure(daemon, dev, ["write"], lambda: fio(dev, rw="write", size_mb=8))
    w, stat = d["write"], d["stat"]
    assert w["requests"] == stat["writes"] == 2048, d
    assert w["back"] == stat["write_merges"] == 0, d
    # 32 batches of 64 contiguous bios, two plug runs of 32 each (see test_requests.py).
    assert 32 * 62 <= w["missed"] <= 32 * 63, d


@pytest.mark.parametrize("scheduler", ["mq-deadline", "none"])
def test_descending_batched_writes_front_merge(daemon, loop_device, scheduler):
    """Each batch of 64 writes goes down from the end of a 256 KiB stretch: every bio ends where the
    plug's request starts, so it is front-merged; the kernel's write-merge count is the oracle."""
    dev = loop_device()
    dev.set_queue(scheduler=scheduler, nomerges=0)
    d = measure(daemon, dev, ["write"],
                lambda: fio(dev, rw="write:-8k", size_mb=8, extra=("--offset=0", "--io_size=8M")))
    w, stat = d["write"], d["stat"]
    assert w["requests"] == stat["writes"] > 0, d
    assert w["bytes"] == stat["write_sectors"] * 512 == 8 << 20, d
    assert w["front"] == stat["write_merges"], d
    assert w["back"] == 0, d
    assert w["requests"] + w["front"] == 2048, d
    assert w["front"] >= 2048 - 2 * 32, d   # at most the first bio of each plug run starts a request
    assert w["missed"] == 0, d


def sync_writes(dev, count, flags, fsync):
    """`count` 4 KiB O_DIRECT writes, one at a time, each followed by fsync if asked."""
    fd = os.open(dev.path, os.O_WRONLY | os.O_DIRECT | flags)
    buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
    try:
        for i in range(count):
            assert os.pwrite(fd, buf, (1024 + i) * 4096) == 4096
            if fsync:
                os.fsync(fd)
    finally:
        os.close(fd)
        buf.close()


def test_fsync_sends_empty_flushes_and_dsync_writes_flush_as_fua(daemon, loop_device):
    dev = loop_device()
    dev.set_queue(scheduler="none", nomerges=0)
    with open(f"/sys/block/{dev.name}/queue/write_cache") as f:
        assert f.read().strip() == "write back", "a loop device caches writes: flushes reach it"

    # fsync after each write: one empty flush request each (REQ_OP_FLUSH at block_rq_issue). Flushes
    # are not block I/O: no per-device "flush" op series, the host-wide non-I/O counter instead
    # (at least the disk's own flushes: another disk on the host may flush meanwhile).
    flushes_before = baseline(daemon.scrape(), NOT_IO, kind="flush")
    d = measure(daemon, dev, ["write"], lambda: sync_writes(dev, 20, 0, fsync=True))
    s = daemon.scrape()
    assert d["write"]["requests"] == 20 and d["write"]["bytes"] == 20 * 4096, d
    assert d["stat"]["write_sectors"] * 512 == 20 * 4096, d
    assert d["stat"]["flushes"] == 20, d
    assert value(s, NOT_IO, kind="flush") - flushes_before >= d["stat"]["flushes"], d
    assert absent(s, SIZE + "_count", device=dev.name, op="flush"), "a flush counted as I/O"

    # O_DSYNC: the write carries FUA, emulated on a disk without it (queue/fua 0) by a flush after
    # the data, and the write path's own sync adds another: the data writes are the I/O.
    flushes_before = value(s, NOT_IO, kind="flush")
    d = measure(daemon, dev, ["write"], lambda: sync_writes(dev, 20, os.O_DSYNC, fsync=False))
    s = daemon.scrape()
    assert d["write"]["requests"] == 20 and d["write"]["bytes"] == 20 * 4096, d
    assert d["stat"]["flushes"] >= 20, d
    assert value(s, NOT_IO, kind="flush") - flushes_before >= d["stat"]["flushes"], d
    assert absent(s, SIZE + "_count", device=dev.name, op="flush"), "a flush counted as I/O"


def test_discards_have_their_own_op_and_match_diskstats(daemon, loop_device):
    dev = loop_device()

    def discard():
        subprocess.run(["blkdiscard", "--offset", "0", "--length", str(8 << 20), dev.path], check=True, timeout=60)
        subprocess.run(["blkdiscard", "--offset", str(16 << 20), "--length", str(1 << 20), dev.path], check=True,
                       timeout=60)

    d = measure(daemon, dev, ["discard"], discard)
    assert d["discard"]["requests"] == d["stat"]["discards"] > 0, d
    assert d["discard"]["bytes"] == d["stat"]["discard_sectors"] * 512 == 9 << 20, d
    assert d["stat"]["write_sectors"] == 0, "discards are not writes"


def test_missed_merges_respect_max_sectors(daemon, loop_device):
    """max_sectors_kb=16: merging 4 KiB reads can build 16 KiB requests and no larger, so with
    nomerges=2 only 3 of each 4 contiguous requests were missed merges (a plug run of 32 is 8 full
    requests' worth), and with merging every request is exactly 16 KiB."""
    dev = loop_device()
    dev.set_queue(scheduler="none", nomerges=0)
    dev.set_queue_attr("max_sectors_kb", 16)  # restored at detach: the minor keeps it otherwise
    d = measure(daemon, dev, ["read"], lambda: fio(dev, size_mb=32))
    r = d["read"]
    assert r["requests"] == d["stat"]["reads"] == 2048, d
    s = daemon.scrape()
    assert value(s, SIZE + "_bucket", device=dev.name, op="read", le="16384") == r["requests"]
    assert value(s, SIZE + "_bucket", device=dev.name, op="read", le="8192") == 0
    assert r["missed"] == 0, d

    dev.set_queue(nomerges=2)
    d = measure(daemon, dev, ["read"], lambda: fio(dev, size_mb=32))
    r = d["read"]
    assert r["requests"] == d["stat"]["reads"] == 8192, d
    assert r["missed"] == 8192 * 3 // 4, d
