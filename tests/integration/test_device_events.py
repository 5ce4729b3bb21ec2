# SPDX-License-Identifier: Apache-2.0
"""Devices added and removed reach /metrics through the kernel's uevents, not the periodic rescan:
every daemon here runs with --topology.refresh-interval=1h. A new loop device made with
/dev/loop-control has no backing file, so no I/O of its own can make BPF report an unknown device.
Other engineers' loop devices on a shared host can (a rescan at most once a second), so each test
also asserts the log line of the rescan that only the event path writes."""
import datetime
import fcntl
import os
import random
import signal
import subprocess
import time

import pytest

from conftest import value

pytestmark = pytest.mark.privileged

INFO = "mergewatch_device_info"
LOOP_CTL_ADD, LOOP_CTL_REMOVE = 0x4C80, 0x4C81
# The bound: a device added or removed is reflected in /metrics within 1 s.
WITHIN_S = 1.0


def device_names(d):
    return {dict(labels)["device"] for name, labels in d.scrape() if name == INFO}


def seconds_until(d, predicate, limit=30.0):
    """Seconds from now until a scrape satisfies predicate(names), measured at the start of that
    scrape (what the daemon had published by then); fails after `limit`."""
    t0 = time.monotonic()
    while True:
        started = time.monotonic()
        if predicate(device_names(d)):
            return started - t0
        assert started - t0 < limit, f"not reflected in /metrics after {limit} s:\n{d.log_text()[-3000:]}"
        time.sleep(0.02)


class NewLoopDevice:
    """A loop device created and removed through /dev/loop-control, at an index no one uses, so
    that it is ours alone (losetup --find takes the lowest free index)."""

    def __init__(self):
        existing = set(os.listdir("/sys/block"))
        candidates = [i for i in range(1000, 2000) if f"loop{i}" not in existing]
        self.index = random.choice(candidates)
        self.name = f"loop{self.index}"
        self.alive = False

    def add(self):
        with open("/dev/loop-control", "wb") as ctl:
            assert fcntl.ioctl(ctl, LOOP_CTL_ADD, self.index) == self.index
        self.alive = True

    def remove(self):
        with open("/dev/loop-control", "wb") as ctl:
            fcntl.ioctl(ctl, LOOP_CTL_REMOVE, self.index)
        self.alive = False


@pytest.fixture
def new_loop():
    made = []

    def make():
        dev = NewLoopDevice()
        made.append(dev)
        return dev

    yield make
    for dev in made:
        if dev.alive:
            subprocess.run(["losetup", "-d", f"/dev/{dev.name}"], capture_output=True, timeout=30)
            try:
                dev.remove()
            except OSError:
                pass


def rescan_delay(d, event, since):
    """Seconds from `since` (time.time()) to the daemon's log line of the rescan that covered
    `event` ("add loop1234"), from the line's timestamp; None when there is no such line."""
    for line in d.log_text().splitlines():
        if "rescanned block devices after" in line and (event + "," in line or event + ":" in line):
            ts = datetime.datetime.strptime(line.split()[0][3:], "%Y-%m-%dT%H:%M:%S.%fZ")
            return ts.replace(tzinfo=datetime.timezone.utc).timestamp() - since
    return None


def test_added_and_removed_device_reflected_within_a_second(daemon_factory, new_loop, tmp_path):
    """The contract is about /metrics: a scrape that starts 1 s after the add (remove) shows (no
    longer shows) the device. How long a scrape then takes on a loaded machine is not the event
    path's latency, so the scrape is started at that moment rather than polled."""
    d = daemon_factory("--topology.refresh-interval=1h", "--log.level=debug")
    dev, marker = new_loop(), new_loop()
    while marker.index == dev.index:
        marker = new_loop()
    assert dev.name not in device_names(d)

    t0, wall0 = time.monotonic(), time.time()
    dev.add()  # kernel: add@/devices/virtual/block/loopN
    # These two sleeps stay: the 1 s bound is the contract under test (the daemon's debounce is
    # 100-500 ms and a rescan tens of ms, measured), and the scrape starts when it runs out.
    time.sleep(max(0.0, t0 + WITHIN_S - time.monotonic()))
    assert dev.name in device_names(d), f"not in /metrics 1 s after the add:\n{d.log_text()[-3000:]}"
    # Attached to a backing file of its own and detached again (change@ events): still the same
    # device, still shown. (Partitions would be a second kind of add/remove, but loop devices get
    # none with the module's default max_part=0: GENHD_FL_NO_PART, measured here.)
    backing = tmp_path / f"{dev.name}.img"
    with open(backing, "wb") as f:
        f.truncate(4 << 20)
    subprocess.run(["losetup", f"/dev/{dev.name}", str(backing)], check=True, timeout=30)
    subprocess.run(["losetup", "-d", f"/dev/{dev.name}"], check=True, timeout=30)
    # Until the rescan that followed those change@ events is in /metrics: the kernel sent them before
    # losetup returned, so a rescan that saw the next event (the add of a device of our own) saw them.
    marker.add()
    seconds_until(d, lambda names: marker.name in names)
    assert dev.name in device_names(d)
    marker.remove()
    seconds_until(d, lambda names: marker.name not in names)

    t1, wall1 = time.monotonic(), time.time()
    dev.remove()  # remove@
    time.sleep(max(0.0, t1 + WITHIN_S - time.monotonic()))
    assert dev.name not in device_names(d), f"still in /metrics 1 s after the remove:\n{d.log_text()[-3000:]}"

    added, removed = rescan_delay(d, f"add {dev.name}", wall0), rescan_delay(d, f"remove {dev.name}", wall1)
    print(f"rescan after the event, from the daemon's log: add {added:.3f} s, remove {removed:.3f} s")
    log = d.log_text()
    assert "watching block device uevents" in log
    # The rescans that showed it were the event path's (not one of the once-a-second rescans for a
    # device BPF does not know, which other engineers' loop devices can cause on a shared host).
    assert added is not None and removed is not None, log[-3000:]
    assert d.proc.poll() is None
    assert d.stop() == 0


def test_lost_events_trigger_a_full_rescan(daemon_factory, new_loop):
    """While the daemon is stopped, uevents of another subsystem (bdi) fill its socket buffer, so
    the kernel drops the add@ of a new block device and reports ENOBUFS. The queued events alone
    would not make a rescan due (none is a block event): only the overrun handling can show it."""
    d = daemon_factory("--topology.refresh-interval=1h")
    assert "watching block device uevents" in d.log_text()
    helper, dev = new_loop(), new_loop()
    while dev.index == helper.index:
        dev = new_loop()
    helper.add()
    seconds_until(d, lambda names: helper.name in names)
    # Our own helper's backing_dev_info: writing "change" to its uevent file makes the kernel
    # send one SUBSYSTEM=bdi uevent, a few hundred bytes, far more cheaply than devices.
    bdi_uevent = os.path.realpath(f"/sys/block/{helper.name}/bdi") + "/uevent"
    d.proc.send_signal(signal.SIGSTOP)
    try:
        with open(bdi_uevent, "w") as f:
            for _ in range(5000):  # 2 MiB of buffer holds about 2500 of them (830 bytes each, measured)
                f.write("change")
                f.flush()
        dev.add()
    finally:
        d.proc.send_signal(signal.SIGCONT)
    seconds_until(d, lambda names: dev.name in names, limit=10)
    log = d.log_text()
    assert "device events lost (netlink receive buffer overran)" in log
    # The rescan the loss made due, at info level. (On a shared host another engineer's loop
    # device can also make a rescan due, so the device showing alone proves less; the unit test
    # RescanPlanner.LostEventsMakeARescanDueAtOnceEvenWithoutABlockEvent pins the rule.)
    assert "events were lost:" in log, log[-3000:]
    dev.remove()
    helper.remove()
    seconds_until(d, lambda names: dev.name not in names and helper.name not in names, limit=10)
    assert d.stop() == 0


def traced_by_all_threads(pid):
    """True once every thread of pid has a tracer (strace -f -p attaches them one by one)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                if any(line.startswith("TracerPid:\t0") for line in f):
                    return False
        except FileNotFoundError:
            pass
    return True


def test_scrapes_name_devices_from_the_topology_while_it_is_current(daemon_factory, loop_device, new_loop, tmp_path):
    """With no device event pending, a scrape names a device from the event-driven topology: it
    does not open the device's sysfs diskseq file (strace on the daemon's own threads), and still
    names it right (its request count). Other engineers' devices send uevents at any time on a
    shared host, during which every scrape rightly asks sysfs: so windows of a few scrapes are
    traced until one is clean, and the test fails only if none is."""
    d = daemon_factory("--topology.refresh-interval=1h")
    assert "watching block device uevents" in d.log_text()
    dev = loop_device(size_mb=4)
    rdev = os.stat(dev.path).st_rdev
    diskseq_path = f"dev/block/{os.major(rdev)}:{os.minor(rdev)}/diskseq"
    reads = 12
    subprocess.run(["dd", f"if={dev.path}", "of=/dev/null", "bs=4k", f"count={reads}", "iflag=direct"],
                   check=True, capture_output=True, timeout=30)
    seconds_until(d, lambda names: dev.name in names)
    # The attach's own events rescanned: a device of our own added after them is in /metrics only
    # once a rescan that drained them is published (one socket, in order), and leaves no event behind.
    marker = new_loop()
    marker.add()
    seconds_until(d, lambda names: marker.name in names)
    scrapes_per_window, windows = 5, []
    for window in range(20):
        out = tmp_path / f"strace-{window}.txt"
        tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=openat2,openat,readlink", "-o", str(out),
                                   "-p", str(d.proc.pid)], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not traced_by_all_threads(d.proc.pid):
                assert time.monotonic() < deadline, "strace did not attach within 30 s"
                time.sleep(0.01)
            for _ in range(scrapes_per_window):
                s = d.scrape()
                assert value(s, "mergewatch_request_size_bytes_count", device=dev.name, op="read") == reads
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=30)
        opened = out.read_text().count(diskseq_path)
        windows.append(opened)
        if opened == 0:
            break
    print(f"opens of {diskseq_path} per window of {scrapes_per_window} scrapes: {windows}")
    # Without the topology every scrape opens it once: `scrapes_per_window` in every window.
    assert windows[-1] == 0, f"every traced scrape read {diskseq_path}: {windows}\n{d.log_text()[-2000:]}"
    assert d.stop() == 0
