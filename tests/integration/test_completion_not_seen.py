# SPDX-License-Identifier: Apache-2.0
"""A dispatch whose completion never reached the programs is counted.

On 6.18 the latency count fell behind the request count with every drop reason at 0. Measured
(tracefs instance and a second, independent BPF program on the same tracepoints, loop device
under `none`): the requests completed (diskstats counted them, the tracefs instance saw their
block_rq_complete), yet no BPF program on block_rq_complete ran for them, without a
recursion_misses count; far more often while other BPF programs were being attached to and
detached from the block tracepoints. The kernel cannot be made to do that on demand, so this
test plays the tracepoints' order itself: it runs the daemon's own raw_tp programs with
BPF_PROG_TEST_RUN on a made-up request pointer (an address bpf_probe_read_kernel refuses, so
every field reads as 0 and the request has no disk). What it checks is the programs' bookkeeping:
a request dispatched again with neither a completion nor a requeue seen in between is counted
under reason="complete_not_seen", and the orders the kernel really uses count nothing.
"""
import ctypes
import json
import os
import struct
import subprocess

import pytest

from conftest import value

pytestmark = pytest.mark.privileged

DROPPED = "mergewatch_bpf_events_dropped_total"
SYS_BPF = 321  # x86-64
BPF_PROG_TEST_RUN = 10
BPF_PROG_GET_FD_BY_ID = 13

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def bpf(cmd, attr):
    rc = libc.syscall(SYS_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if rc < 0:
        raise OSError(ctypes.get_errno(), f"bpf({cmd}): {os.strerror(ctypes.get_errno())}")
    return rc


def prog_fd(prog_id):
    attr = (ctypes.c_uint32 * 3)(prog_id, 0, 0)  # prog_id, next_id, open_flags
    return bpf(BPF_PROG_GET_FD_BY_ID, attr)


class ProgTestRunAttr(ctypes.Structure):
    _fields_ = [("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32), ("data_size_in", ctypes.c_uint32),
                ("data_size_out", ctypes.c_uint32), ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
                ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32), ("ctx_size_in", ctypes.c_uint32),
                ("ctx_size_out", ctypes.c_uint32), ("ctx_in", ctypes.c_uint64), ("ctx_out", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32),
                ("pad", ctypes.c_uint32)]


def run(fd, *args):
    """One run of a raw_tp program with the tracepoint arguments `args` (u64 each)."""
    ctx = ctypes.create_string_buffer(struct.pack("<4Q", *(list(args) + [0] * (4 - len(args)))), 32)
    attr = ProgTestRunAttr(prog_fd=fd, ctx_size_in=32, ctx_in=ctypes.addressof(ctx))
    bpf(BPF_PROG_TEST_RUN, attr)


def daemon_programs(pid):
    """{name: fd} of the daemon's raw_tp request programs, opened by id."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                ids.update(int(line.split()[1]) for line in f if line.startswith("prog_id:"))
        except OSError:
            continue
    progs = {}
    for prog_id in ids:
        out = subprocess.run(["bpftool", "-j", "prog", "show", "id", str(prog_id)], capture_output=True, text=True,
                             check=True, timeout=30).stdout
        name = json.loads(out).get("name", "")
        if name in ("raw_rq_issue", "raw_rq_requeue", "raw_rq_insert", "raw_rq_complete"):
            progs[name] = prog_fd(prog_id)
    assert len(progs) == 4, f"the daemon's raw_tp request programs, found {sorted(progs)}"
    return progs


def test_a_dispatch_without_a_seen_completion_is_counted_once_and_real_orders_are_not(daemon_factory):
    # The in-flight table's bookkeeping: the made-up request has no queue, so no scheduler, which the
    # default request clock would time without the table (test_request_clock.py covers that one).
    d = daemon_factory("--bpf.program-type=raw_tp", "--bpf.request-clock=table")
    p = daemon_programs(d.proc.pid)
    try:
        issue = lambda rq: run(p["raw_rq_issue"], rq)  # noqa: E731
        requeue = lambda rq: run(p["raw_rq_requeue"], rq)  # noqa: E731
        insert = lambda rq: run(p["raw_rq_insert"], rq)  # noqa: E731
        complete = lambda rq: run(p["raw_rq_complete"], rq, 0, 0)  # noqa: E731  (rq, error, nr_bytes)
        before = value(d.scrape(), DROPPED, reason="complete_not_seen")
        # Request pointers below the kernel's half: the programs' reads of them fail and read 0.
        base = 0x7f1200000000
        # 1. Dispatched twice, no completion seen between: the first dispatch's sample is lost.
        issue(base + 0x40)
        issue(base + 0x40)
        complete(base + 0x40)
        # 2. Requeued in between (BLK_STS_RESOURCE, a reset): dispatched again, nothing lost.
        issue(base + 0x80)
        requeue(base + 0x80)
        issue(base + 0x80)
        complete(base + 0x80)
        # 3. Requeued, then inserted into the scheduler (the requeue list's way back), then dispatched.
        issue(base + 0xc0)
        requeue(base + 0xc0)
        insert(base + 0xc0)
        issue(base + 0xc0)
        complete(base + 0xc0)
        # 4. Completed, then the preallocated request is reused: nothing lost.
        issue(base + 0x100)
        complete(base + 0x100)
        insert(base + 0x100)
        issue(base + 0x100)
        complete(base + 0x100)
        # 5. Inserted again after a dispatch with no completion or requeue seen: lost, counted at the insert.
        issue(base + 0x140)
        insert(base + 0x140)
        issue(base + 0x140)
        complete(base + 0x140)
        after = value(d.scrape(), DROPPED, reason="complete_not_seen")
        assert after - before == 2, (before, after)
    finally:
        for fd in p.values():
            os.close(fd)
