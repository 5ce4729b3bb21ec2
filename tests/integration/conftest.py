"""Fixtures for the privileged tests: the real daemon, real loop devices, real I/O.

These tests need root and kernel BTF. When make test runs them (MERGEWATCH_NO_SKIP=1)
a skip is turned into a failure: on a machine that can run them, none may skip.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

DAEMON = os.environ.get("MERGEWATCHD", os.path.join(os.path.dirname(__file__), "../../build/mergewatchd"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("MERGEWATCH_NO_SKIP") == "1" and report.skipped and "privileged" in item.keywords:
        report.outcome = "failed"
        report.longrepr = f"privileged test skipped where it must run: {report.longrepr}"


def privileged_reason():
    if os.geteuid() != 0:
        return "needs root (BPF, loop devices)"
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        return "needs kernel BTF at /sys/kernel/btf/vmlinux"
    if shutil.which("fio") is None or shutil.which("losetup") is None:
        return "needs fio and losetup (make deps)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = privileged_reason()
    for item in items:
        if "privileged" in item.keywords and reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_configure(config):
    config.addinivalue_line("markers", "privileged: needs root, BTF, loop devices")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def links_of(pid):
    """IDs of the BPF links a process holds, from the fdinfo of its link fds."""
    ids = set()
    fd_dir = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fd_dir):
        try:
            with open(os.path.join(fd_dir, fd)) as f:
                for line in f:
                    if line.startswith("link_id:"):
                        ids.add(int(line.split()[1]))
        except OSError:
            continue
    return ids


def attached_link_ids():
    out = subprocess.run(["bpftool", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {link["id"] for link in json.loads(out or "[]")}


class Daemon:
    """mergewatchd started on a free loopback port; stopped with SIGTERM at teardown."""

    def __init__(self, args):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="mergewatchd-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([DAEMON, f"--web.listen-address=127.0.0.1:{self.port}", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "level=info msg=\"ready:" not in self.log_text():
            if self.proc.poll() is not None:
                raise AssertionError(f"mergewatchd exited with {self.proc.returncode}:\n{self.log_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"mergewatchd not ready in 30 s:\n{self.log_text()}")
            time.sleep(0.05)

    def log_text(self):
        with open(self.log.name) as f:
            return f.read()

    def scrape_text(self, path="/metrics"):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return r.read().decode()

    def scrape(self):
        """{(name, frozenset(labels.items())): value} for every sample."""
        samples = {}
        for family in text_string_to_metric_families(self.scrape_text()):
            for s in family.samples:
                samples[(s.name, frozenset(s.labels.items()))] = s.value
        return samples

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("mergewatchd did not stop within 20 s of " + sig.name)
        return self.proc.returncode


@pytest.fixture
def daemon_factory():
    started = []

    def start(*args):
        d = Daemon(list(args))
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
        os.unlink(d.log.name)


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()


class LoopDevice:
    """A RAM-backed loop device; detached and its file removed at teardown."""

    def __init__(self, size_mb=64):
        fd, self.backing = tempfile.mkstemp(prefix="mergewatch-", suffix=".img", dir="/dev/shm")
        os.ftruncate(fd, size_mb << 20)
        os.close(fd)
        self.path = subprocess.run(["losetup", "--find", "--show", self.backing], capture_output=True,
                                   text=True, check=True).stdout.strip()
        self.name = os.path.basename(self.path)
        self.size_mb = size_mb

    def set_queue(self, scheduler=None, nomerges=None):
        if scheduler is not None:
            with open(f"/sys/block/{self.name}/queue/scheduler", "w") as f:
                f.write(scheduler)
        if nomerges is not None:
            with open(f"/sys/block/{self.name}/queue/nomerges", "w") as f:
                f.write(str(nomerges))

    def stat(self):
        """(reads completed, reads merged) from /sys/block/X/stat."""
        with open(f"/sys/block/{self.name}/stat") as f:
            fields = [int(x) for x in f.read().split()]
        return fields[0], fields[1]

    def detach(self):
        subprocess.run(["losetup", "-d", self.path], check=False)
        if os.path.exists(self.backing):
            os.unlink(self.backing)


@pytest.fixture
def loop_device():
    made = []

    def make(**kw):
        dev = LoopDevice(**kw)
        made.append(dev)
        return dev

    yield make
    for dev in made:
        dev.detach()


def fio(device, rw="read", bs="4k", iodepth=64, batch=64, size_mb=32, extra=()):
    """Direct I/O with fio; the batch sizes decide how many bios share one plug."""
    cmd = ["fio", "--name=mergewatch-test", f"--filename={device.path}", f"--rw={rw}", f"--bs={bs}",
           "--direct=1", "--ioengine=libaio", f"--iodepth={iodepth}", f"--iodepth_batch_submit={batch}",
           f"--iodepth_batch_complete_min={batch}", f"--size={size_mb}M", "--output=/dev/null", *extra]
    subprocess.run(cmd, check=True, timeout=300)


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)
