# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the suites (tests/integration, tests/deploy, tests/vm): free ports, RAM-backed
loop devices, the BPF links a process holds, and the strict readers of a Prometheus scrape. Each
suite's conftest (tests/vm: vmtest.py) imports them from here."""
import ctypes
import errno
import json
import os
import socket
import struct
import subprocess
import tempfile
import time

import pytest
from loop_nodes import loop_nodes, remove_loop_node  # noqa: F401  (loop_nodes: the suites' import)
from prometheus_client.parser import text_string_to_metric_families


def wait_until(predicate, timeout, what, interval=0.1, on_timeout=None):
    """Polls predicate() until it returns a true value (which is returned), or fails after `timeout` s
    naming `what`, the last exception the predicate raised and on_timeout()'s text. A wait on a
    condition, never a fixed sleep: as fast as the condition on a quiet machine, still right on a
    loaded one. The timeout is a hang guard, generous for a loaded 2-core host; a test that asserts
    how fast something happens does so on the times it measures, not through this bound."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except Exception as e:  # the thing polled may not be up yet
            last_error = e
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    detail = on_timeout() if on_timeout else ""
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last error: {last_error!r})\n{detail}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopDevice:
    """A loop device over a file in /dev/shm (RAM); detached and its file removed by detach()."""

    def __init__(self, size_mb=64):
        fd, self.backing = tempfile.mkstemp(prefix="mergewatch-", suffix=".img", dir="/dev/shm")
        try:
            os.ftruncate(fd, size_mb << 20)
        finally:
            os.close(fd)
        nodes_before = loop_nodes()
        try:
            self.path = subprocess.run(["losetup", "--find", "--show", self.backing], capture_output=True,
                                       text=True, check=True, timeout=30).stdout.strip()
        except Exception:
            os.unlink(self.backing)
            raise
        self.name = os.path.basename(self.path)
        # losetup --find adds a node when every one is attached, and detach leaves it: removed at detach.
        self.added_node = self.name not in nodes_before
        self.size_mb = size_mb
        self.saved_queue = {}

    def set_queue_attr(self, attr, value):
        """Writes queue/<attr>; the first value seen is written back at detach: a loop minor keeps its
        queue settings across detach, and the next user of the minor (another test, another
        engineer's run on the same host) must not inherit them."""
        path = f"/sys/block/{self.name}/queue/{attr}"
        if attr not in self.saved_queue:
            with open(path) as f:
                current = f.read().strip()
            if attr == "scheduler":  # "[none] mq-deadline": the active one is bracketed
                current = current.split("[", 1)[1].split("]", 1)[0]
            self.saved_queue[attr] = current
        with open(path, "w") as f:
            f.write(str(value))

    def set_queue(self, scheduler=None, nomerges=None):
        if scheduler is not None:
            self.set_queue_attr("scheduler", scheduler)
        if nomerges is not None:
            self.set_queue_attr("nomerges", nomerges)

    def cap_requests_at_one_bio(self):
        """Sets queue/max_sectors_kb (restored at detach) to the largest read that always reaches the
        disk as one bio and one request, whatever fio's buffers look like in memory; returns it in KiB.

        A buffer of scattered 4 KiB pages is one physical segment per page. A block device's direct
        I/O builds bios of at most 256 vecs (BIO_MAX_VECS), and the queue splits a bio at
        max_segments. At the loop queue's default 1280 KiB (320 pages), a fragmented buffer became
        two bios, the first split at 128 segments. The split's last piece and the second bio are
        contiguous and within both limits: a merge the kernel really would do with merging on.
        bpftrace on 6.18 saw exactly that: 10450 of 18224 reads began with a short bio, with 11612
        block_split events. Capped at max_segments pages, there were 0 splits and every request was
        512 KiB, in the same runs."""
        queue = f"/sys/block/{self.name}/queue"
        with open(f"{queue}/max_sectors_kb") as f:
            max_kb = int(f.read())
        with open(f"{queue}/max_segments") as f:
            max_segments = int(f.read())
        page_kib, bio_max_vecs = 4, 256
        max_kb = min(max_kb, max_segments * page_kib, bio_max_vecs * page_kib)
        self.set_queue_attr("max_sectors_kb", max_kb)
        return max_kb

    def stat(self):
        """(reads completed, reads merged) from /sys/block/X/stat."""
        with open(f"/sys/block/{self.name}/stat") as f:
            fields = [int(x) for x in f.read().split()]
        return fields[0], fields[1]

    def detach(self):
        for attr, value in self.saved_queue.items():
            try:
                with open(f"/sys/block/{self.name}/queue/{attr}", "w") as f:
                    f.write(value)
            except OSError:
                pass  # restoring is best effort; detaching must still happen
        subprocess.run(["losetup", "-d", self.path], check=False, timeout=30)
        if os.path.exists(self.backing):
            os.unlink(self.backing)
        if self.added_node:
            try:
                remove_loop_node(self.name)
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise
                # attached again by someone else meanwhile: theirs now, left in place


@pytest.fixture
def loop_device():
    """loop_device(size_mb=...) makes a LoopDevice; all are detached at teardown."""
    made = []

    def make(**kw):
        dev = LoopDevice(**kw)
        made.append(dev)
        return dev

    yield make
    for dev in made:
        dev.detach()


def bpf_link_ids_of(pid):
    """IDs of the BPF links a process holds, from the fdinfo of its file descriptors."""
    ids = set()
    fd_dir = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fd_dir):
        try:
            with open(os.path.join(fd_dir, fd)) as f:
                for line in f:
                    if line.startswith("link_id:"):
                        ids.add(int(line.split()[1]))
        except OSError:  # the fd was closed meanwhile
            continue
    return ids


def attached_bpf_link_ids():
    """IDs of every BPF link attached on the machine (bpftool)."""
    out = subprocess.run(["bpftool", "-j", "link", "show"], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    return {link["id"] for link in json.loads(out or "[]")}


def parse_samples(text):
    """Prometheus text: {(name, frozenset(labels.items())): value} for every sample."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples, name, **labels):
    """The value of one series. A missing series is an error that names what is there: a renamed
    metric or label must fail the test, not read as 0. Tests that expect absence use absent()."""
    key = (name, frozenset(labels.items()))
    if key in samples:
        return samples[key]
    present = sorted(str(dict(sorted(k[1]))) for k in samples if k[0] == name)
    shown = "\n  ".join(present[:20]) + (f"\n  ... {len(present) - 20} more" if len(present) > 20 else "")
    raise AssertionError(f"no series {name}{dict(sorted(labels.items()))}; {name} has {len(present)} series"
                         + (":\n  " + shown if present else ""))


def absent(samples, name, **labels):
    """True if no series of `name` carries all of `labels` (others may differ): for a family whose
    other labels are not known, such as mergewatch_device_info{device=...}."""
    want = set(labels.items())
    return not any(k[0] == name and want <= k[1] for k in samples)


def baseline(samples, name, **labels):
    """A counter's value before a workload: 0 while the series does not exist yet (a fresh device has
    no per-op series before its first request). Only for "before" readings; the "after" reading
    must use value()."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def find(s, name, **labels):
    """Samples of `name` whose labels include `labels`: {frozenset(labels): value}."""
    return {k[1]: v for k, v in s.items() if k[0] == name and set(labels.items()) <= set(k[1])}


def status_kib(pid, field):
    """A size field of /proc/PID/status in KiB: VmRSS, VmHWM (the peak RSS), ..."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def rss_kib(pid):
    """The process's resident set size in KiB (/proc/PID/status VmRSS)."""
    return status_kib(pid, "VmRSS")


def _bpf_syscall(cmd, attr):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(321, cmd, ctypes.byref(attr), ctypes.sizeof(attr))  # SYS_bpf on x86-64
    if rc < 0:
        raise OSError(ctypes.get_errno(), f"bpf({cmd}): {os.strerror(ctypes.get_errno())}")
    return rc


def undone_dispatches(pid, dev_path, op=0):
    """Dispatches of the block device at `dev_path` (REQ_OP `op`, 0 = read) that the daemon `pid`'s
    in-flight table still holds with neither a completion nor a requeue seen (struct mw_inflight in
    include/mergewatch/abi.h: rq, insert_ns, issue_ns, u32 requeued, op, devt (major << 20 | minor), origin,
    u64 diskseq; a completion frees the slot: rq 0).
    Once the device is idle each is a latency sample lost, which the daemon counts under
    complete_not_seen only when the request is next dispatched."""
    map_ids = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                map_ids |= {int(line.split()[1]) for line in f if line.startswith("map_id:")}
        except OSError:
            continue
    info = None
    for map_id in map_ids:
        shown = json.loads(subprocess.run(["bpftool", "-j", "map", "show", "id", str(map_id)], capture_output=True,
                                          text=True, check=True, timeout=30).stdout)
        if shown.get("name") == "inflight":
            info = shown
    assert info is not None, f"no in-flight map among the daemon's maps {sorted(map_ids)}"
    assert info["bytes_value"] == 48, info
    rdev = os.stat(dev_path).st_rdev
    with open(f"/sys/block/{os.path.basename(dev_path)}/diskseq") as f:
        diskseq = int(f.read())
    want = (op, os.major(rdev) << 20 | os.minor(rdev), diskseq)  # MW_MKDEV
    fd = _bpf_syscall(14, (ctypes.c_uint32 * 3)(info["id"], 0, 0))  # BPF_MAP_GET_FD_BY_ID
    try:
        key, value_buf = ctypes.c_uint32(0), ctypes.create_string_buffer(48)
        # BPF_MAP_LOOKUP_ELEM: map_fd, pad, key pointer, value pointer, flags
        attr = (ctypes.c_uint64 * 4)(fd, ctypes.addressof(key), ctypes.addressof(value_buf), 0)
        undone = 0
        for slot in range(info["max_entries"]):
            key.value = slot
            _bpf_syscall(1, attr)
            rq, _insert, issue, requeued, slot_op, devt, _origin, slot_diskseq = struct.unpack("<QQQIIIIQ",
                                                                                              value_buf.raw)
            if rq and issue and not requeued and (slot_op, devt, slot_diskseq) == want:
                undone += 1
        return undone
    finally:
        os.close(fd)


def churn_tracepoint(tracepoint, stop):
    """Attaches a do-nothing raw_tp program to `tracepoint` and detaches it again, over and over until
    `stop` (a threading.Event) is set; returns the cycles. Attaching to a tracepoint nobody else uses
    turns its static key on and off, which patches kernel text: on 6.18 that is what makes the kernel
    skip BPF programs on block_rq_complete (measured: 56-128 of 2 M with a few hundred cycles a
    second on block_plug; 0 of 2.3 M with 25,884 cycles on block_rq_complete itself)."""
    insns = (ctypes.c_uint64 * 2)(0x00000000000000b7, 0x0000000000000095)  # r0 = 0; exit
    license = ctypes.create_string_buffer(b"GPL")
    # BPF_PROG_LOAD: prog_type (BPF_PROG_TYPE_RAW_TRACEPOINT), insn_cnt, insns, license, then zeros
    attr = (ctypes.c_uint32 * 32)()
    attr[0], attr[1] = 17, 2
    struct.pack_into("<QQ", attr, 8, ctypes.addressof(insns), ctypes.addressof(license))
    prog_fd = _bpf_syscall(5, attr)
    name = ctypes.create_string_buffer(tracepoint.encode())
    open_attr = (ctypes.c_uint64 * 2)(ctypes.addressof(name), prog_fd)  # raw_tracepoint.name, prog_fd
    cycles = 0
    try:
        while not stop.is_set():
            os.close(_bpf_syscall(17, open_attr))  # BPF_RAW_TRACEPOINT_OPEN; closing the link detaches
            cycles += 1
    finally:
        os.close(prog_fd)
    return cycles
