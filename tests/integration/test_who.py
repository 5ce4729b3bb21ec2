# SPDX-License-Identifier: Apache-2.0
"""Who, on this host: what the daemon names without a stacked device and on a cgroup v1 (or hybrid) host.

The services behind a collapse are named per (disk, upper device) pair, and only a stacking driver's
remap chain makes a pair: loop devices have none, so on this host no service series may appear, the
/status verdict lists no services, and nothing crashes. What the daemon says of the host's cgroups
follows its mountinfo: a cgroup2 tree (pure or systemd's hybrid /sys/fs/cgroup/unified), the io
controller on v1 (page-cache writes are then "writeback"), or no cgroup2 at all. The named cases
(snapshot backups, LUKS, writeback) run in the VMs (tests/vm/test_vm_who.py)."""
import json
import os
import urllib.request

import pytest

from conftest import absent, value
from test_collapse import POLICY, start_fio, stop_fio, wait_for

pytestmark = pytest.mark.privileged


def cgroup2_mount_of(mountinfo):
    """The first cgroup2 mount of a root "/" (the daemon's Cgroup2MountPoint), or None."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype = line.split(" - ", 1)[1].split()[0]
        if fstype == "cgroup2" and fields[3] == "/":
            return fields[4].replace("\\040", " ")
    return None


def io_on_v1(mountinfo):
    return any(" - cgroup " in l and "blkio" in l.split(" - ", 1)[1].split()[-1].split(",") for l in mountinfo.splitlines())


def status(daemon):
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/status", timeout=10) as r:
        return json.load(r)


def test_a_collapse_without_an_upper_device_names_no_service(daemon_factory, loop_device):
    mountinfo = open("/proc/self/mountinfo").read()
    mount = cgroup2_mount_of(mountinfo)
    d = daemon_factory(*POLICY)
    if mount is None:
        assert "no cgroup2 mount: the services behind a collapse are not named" in d.log_text()
    else:
        said = f"services behind a collapse are named from the cgroup2 tree at {mount}"
        assert said in d.log_text()
        assert ("io controller on cgroup v1" in d.log_text()) == io_on_v1(mountinfo)
    dev = loop_device(size_mb=128)
    dev.set_queue(scheduler="none", nomerges=2)
    fio = start_fio(dev)
    try:
        wait_for(d, dev, 1)
        samples = d.scrape()
        doc = status(d)
    finally:
        stop_fio(fio)
    assert value(samples, "mergewatch_collapse_condition", device=dev.name, upper="") == 1
    assert absent(samples, "mergewatch_collapse_service_request_ratio", device=dev.name)
    assert absent(samples, "mergewatch_remapped_dispatched_requests_total", device=dev.name)
    verdict = next(v for v in doc["verdicts"] if v["device"] == dev.name)
    assert verdict["state"] in ("collapsed", "clearing") and verdict["services"] == []
    assert d.proc.poll() is None


@pytest.mark.parametrize("mountinfo", [
    # A cgroup v1-only host: blkio and the other controllers on v1 hierarchies, no cgroup2.
    "25 30 0:22 / /sys/fs/cgroup/blkio rw,nosuid shared:9 - cgroup cgroup rw,blkio\n"
    "26 30 0:23 / /sys/fs/cgroup/memory rw,nosuid shared:10 - cgroup cgroup rw,memory\n",
    # Nothing a parser can use.
    "\x00\xff garbage - - -\n-\n" + "x " * 5000,
    "",
], ids=["v1-only", "garbage", "empty"])
def test_a_host_without_cgroup2_says_so_and_runs(daemon_factory, tmp_path, mountinfo):
    procfs = tmp_path / "proc"
    (procfs / "self").mkdir(parents=True)
    (procfs / "self" / "mountinfo").write_bytes(mountinfo.encode("utf-8", "surrogateescape"))
    d = daemon_factory(*POLICY, f"--path.procfs={procfs}", "--source=bpf")
    assert "no cgroup2 mount: the services behind a collapse are not named" in d.log_text()
    samples = d.scrape()
    assert value(samples, "mergewatch_bpf_program_attached", tracepoint="block_bio_remap", mode="tp_btf") == 1
    assert status(d)["verdicts"] is not None
    assert d.proc.poll() is None
