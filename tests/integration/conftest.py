# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the privileged tests: the real daemon, real loop devices, real I/O.

These tests need root and kernel BTF. When make test runs them (MERGEWATCH_NO_SKIP=1)
a skip is turned into a failure: on a machine that can run them, none may skip.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mwtest import (LoopDevice, absent, attached_bpf_link_ids, baseline, bpf_link_ids_of, churn_tracepoint,  # noqa: E402,F401,E501
                    free_port, loop_device, parse_samples, rss_kib, status_kib, undone_dispatches, value, wait_until)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The binaries under test: the build's by default; MERGEWATCHD and MERGEWATCH_CLI point the suite at any other
# (make test-privileged-release: the release tarball's). What the build makes beside them (the BPF object, the
# ASan daemon) is named by its own variable, never found next to the binary.
DAEMON = os.environ.get("MERGEWATCHD", os.path.join(REPO, "build", "mergewatchd"))
BPF_OBJECT = os.environ.get("MERGEWATCH_BPF_OBJECT", os.path.join(REPO, "build", "mergewatch.bpf.o"))
ASAN_DAEMON = os.environ.get("MERGEWATCHD_ASAN", os.path.join(REPO, "build", "asan", "mergewatchd"))
READY_TIMEOUT = 60


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


class Daemon:
    """mergewatchd started on a free loopback port; stopped with SIGTERM at teardown."""

    def __init__(self, args, wrapper=()):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="mergewatchd-", suffix=".log", delete=False)
        # wrapper: a command that execs the daemon in its place (setpriv), so proc.pid stays the daemon's.
        self.proc = subprocess.Popen([*wrapper, DAEMON, f"--web.listen-address=127.0.0.1:{self.port}", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        # Ready takes a BPF load (the loader's own bound is 20 s) on top of the start: 60 s is a hang
        # guard with room for a loaded host.
        try:
            wait_until(self._ready, READY_TIMEOUT, "mergewatchd to log ready", interval=0.05, on_timeout=self.log_text)
        except BaseException:  # not handed to the factory yet: stopped here, not left running
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            raise

    def _ready(self):
        if self.proc.poll() is not None:
            pytest.fail(f"mergewatchd exited with {self.proc.returncode}:\n{self.log_text()}")
        return "level=info msg=\"ready:" in self.log_text()

    def log_text(self):
        with open(self.log.name) as f:
            return f.read()

    def scrape_text(self, path="/metrics"):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return r.read().decode()

    def scrape(self):
        """{(name, frozenset(labels.items())): value} for every sample."""
        return parse_samples(self.scrape_text())

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

    def start(*args, wrapper=()):
        d = Daemon(list(args), wrapper)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
        os.unlink(d.log.name)


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()


def fio(device, rw="read", bs="4k", iodepth=64, batch=64, size_mb=32, extra=()):
    """Direct I/O with fio; the batch sizes decide how many bios share one plug."""
    cmd = ["fio", "--name=mergewatch-test", f"--filename={device.path}", f"--rw={rw}", f"--bs={bs}",
           "--direct=1", "--ioengine=libaio", f"--iodepth={iodepth}", f"--iodepth_batch_submit={batch}",
           f"--iodepth_batch_complete_min={batch}", f"--size={size_mb}M", "--output=/dev/null", *extra]
    subprocess.run(cmd, check=True, timeout=300)


