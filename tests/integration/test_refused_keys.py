# SPDX-License-Identifier: Apache-2.0
"""A device whose stats key the BPF map refuses is still counted (dev_stats_spill, bpf/mergewatch.bpf.c).

On Debian's 6.1 a program's update of dev_stats failed now and then with -ENOMEM: the map is not
preallocated, and the BPF memory allocator's per-CPU free list can be empty until its irq_work refills
it. The first bio of an LV created after the daemon started went uncounted (63 of 64, device_map_full
1: the VM stacking test). The kernel cannot be made to do that on demand; a full map refuses a new key
the same way (-E2BIG instead of -ENOMEM) on every kernel. So this test fills the daemon's dev_stats to
its max_entries with keys of a device that exists (a loop device, diskseq 0 and operation numbers no
request carries: known to the topology, so never pruned as stale, and all zero, so never shown), then
reads a loop device attached after that: its key can only go to the spill map, and every request is
counted there, as /sys/block/X/stat counts it, with nothing under device_map_full.
"""
import ctypes
import json
import os
import struct
import subprocess
import time

import pytest

from conftest import baseline, value
from mwtest import _bpf_syscall

pytestmark = pytest.mark.privileged

SIZE_COUNT = "mergewatch_request_size_bytes_count"
DROPPED = "mergewatch_bpf_events_dropped_total"
BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_GET_FD_BY_ID = 1, 2, 14
BPF_NOEXIST = 1
E2BIG, ENOMEM, EEXIST, ENOENT = 7, 12, 17, 2


def daemon_maps(pid):
    """{name: bpftool's map info} of the maps the daemon `pid` holds."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                ids |= {int(line.split()[1]) for line in f if line.startswith("map_id:")}
        except OSError:
            continue
    maps = {}
    for map_id in ids:
        info = json.loads(subprocess.run(["bpftool", "-j", "map", "show", "id", str(map_id)], capture_output=True,
                                         text=True, check=True, timeout=30).stdout)
        maps[info.get("name", "")] = info
    return maps


def possible_cpus():
    with open("/sys/devices/system/cpu/possible") as f:
        count = 0
        for part in f.read().strip().split(","):
            low, _, high = part.partition("-")
            count += int(high or low) - int(low) + 1
        return count


def dev_key(major, minor, op, diskseq):
    """struct mw_dev_key (include/mergewatch/abi.h): major, minor, op, pad, diskseq."""
    return ctypes.create_string_buffer(struct.pack("<IIIIQ", major, minor, op, 0, diskseq), 24)


def map_elem(cmd, fd, key, value_buf, flags=0):
    """BPF_MAP_LOOKUP_ELEM / BPF_MAP_UPDATE_ELEM: map_fd (and pad), key, value, flags."""
    attr = (ctypes.c_uint64 * 4)(fd, ctypes.addressof(key), ctypes.addressof(value_buf), flags)
    return _bpf_syscall(cmd, attr)


def fill(fd, info, major, minor):
    """Creates all-zero keys of major:minor in the per-CPU hash map `fd` until it refuses one as full.
    A transient -ENOMEM (the kernel's BPF allocator, refilled by an irq_work) is tried again."""
    zero = ctypes.create_string_buffer(((info["bytes_value"] + 7) // 8 * 8) * possible_cpus())
    op, made, retries = 256, 0, 0
    while True:
        try:
            map_elem(BPF_MAP_UPDATE_ELEM, fd, dev_key(major, minor, op, 0), zero, BPF_NOEXIST)
            made += 1
        except OSError as e:
            if e.errno == E2BIG:
                return made
            if e.errno == ENOMEM and retries < 1000:
                retries += 1
                time.sleep(0.001)
                continue
            if e.errno != EEXIST:
                raise
        op += 1
        assert op < 256 + 2 * info["max_entries"], f"{made} keys made and the map is not full"


@pytest.mark.parametrize("mode", ["tp_btf", "raw_tp"])
def test_requests_of_a_device_the_full_stats_map_refuses_are_counted(daemon_factory, loop_device, mode):
    d = daemon_factory(f"--bpf.program-type={mode}")
    filler = loop_device(size_mb=8)
    maps = daemon_maps(d.proc.pid)
    stats_fd = _bpf_syscall(BPF_MAP_GET_FD_BY_ID, (ctypes.c_uint32 * 3)(maps["dev_stats"]["id"], 0, 0))
    try:
        rdev = os.stat(filler.path).st_rdev
        fill(stats_fd, maps["dev_stats"], os.major(rdev), os.minor(rdev))
        dev = loop_device(size_mb=16)  # attached after: none of its keys can be in dev_stats
        s0 = d.scrape()
        before_count = baseline(s0, SIZE_COUNT, device=dev.name, op="read")
        before_full = value(s0, DROPPED, reason="device_map_full")
        reads_before = dev.stat()[0]
        subprocess.run(["dd", f"if={dev.path}", "of=/dev/null", "bs=64k", "count=128", "iflag=direct",
                        "status=none"], check=True, timeout=120)
        reads = dev.stat()[0] - reads_before
        assert reads >= 128, reads
        time.sleep(1.5)  # a tick of the daemon after the reads
        s1 = d.scrape()
        counted = baseline(s1, SIZE_COUNT, device=dev.name, op="read") - before_count
        dropped = value(s1, DROPPED, reason="device_map_full") - before_full
        assert (counted, dropped) == (reads, 0), f"requests counted, device_map_full: {(counted, dropped)}"
        # The read's key went where the test put it: refused by dev_stats, made in the spill map.
        assert "dev_stats_spill" in maps, f"no spill map among the daemon's maps {sorted(maps)}"
        with open(f"/sys/block/{dev.name}/diskseq") as f:
            diskseq = int(f.read())
        rdev = os.stat(dev.path).st_rdev
        key = dev_key(os.major(rdev), os.minor(rdev), 0, diskseq)
        out = ctypes.create_string_buffer(((maps["dev_stats"]["bytes_value"] + 7) // 8 * 8) * possible_cpus())
        with pytest.raises(OSError) as missing:
            map_elem(BPF_MAP_LOOKUP_ELEM, stats_fd, key, out)
        assert missing.value.errno == ENOENT
        spill_fd = _bpf_syscall(BPF_MAP_GET_FD_BY_ID, (ctypes.c_uint32 * 3)(maps["dev_stats_spill"]["id"], 0, 0))
        try:
            map_elem(BPF_MAP_LOOKUP_ELEM, spill_fd, key, out)
        finally:
            os.close(spill_fd)
    finally:
        os.close(stats_fd)
