# SPDX-License-Identifier: Apache-2.0
"""Shared helpers for the deployment tests: tools, free ports, processes stopped by PID, loop devices.

Run as `python3 -m pytest tests/deploy` with MERGEWATCHD pointing at the built daemon. Tests marked
`privileged` (they start the daemon, load BPF, create loop devices) need root. Run as root, a missing
prerequisite is a failure, never a skip; as another user they skip, unless MERGEWATCH_NO_SKIP=1 turns
the skip into a failure too.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mwtest import (LoopDevice, attached_bpf_link_ids, bpf_link_ids_of, free_port, loop_device,  # noqa: E402,F401
                    wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEPLOY = os.path.join(REPO, "deploy")
RULES = os.path.join(DEPLOY, "prometheus", "mergewatch.rules.yml")
UNIT_TEMPLATE = os.path.join(DEPLOY, "systemd", "mergewatchd.service.in")
DAEMON = os.path.abspath(os.environ.get("MERGEWATCHD", os.path.join(REPO, "build", "mergewatchd")))

# Debian package that provides each tool, for the failure message.
TOOLS = {
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
    "systemd-analyze": "systemd",
    "fio": "fio",
    "losetup": "util-linux",
    "setpriv": "util-linux",
    "strace": "strace",
    "bpftool": "bpftool",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "privileged: needs root (runs the daemon, loads BPF, creates loop devices)")


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    for item in items:
        if "privileged" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs root: runs mergewatchd (BPF) and creates loop devices"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("MERGEWATCH_NO_SKIP") == "1" and report.skipped and "privileged" in item.keywords:
        report.outcome = "failed"
        report.longrepr = f"privileged test skipped where it must run: {report.longrepr}"


def tool(name):
    """Absolute path of a required tool; fails (not skips) with the package to install."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: install the Debian package {TOOLS.get(name, name)} (make deps)")
    return path


def daemon_binary():
    if not (os.path.isfile(DAEMON) and os.access(DAEMON, os.X_OK)):
        pytest.fail(f"mergewatchd not found at {DAEMON}: run `make build` or set MERGEWATCHD=")
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        pytest.fail("this kernel has no BTF at /sys/kernel/btf/vmlinux; mergewatchd cannot run here")
    return DAEMON


def run(cmd, timeout=60, **kw):
    """subprocess.run with captured text output and a bound on time."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


class Proc:
    """A background process with its output in a log file; stopped by its PID only."""

    def __init__(self, name, cmd, logdir, env=None):
        self.name = name
        self.cmd = cmd
        self.log_path = os.path.join(logdir, f"{name}.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env)
        self.pid = self.proc.pid

    def log(self, tail=60):
        with open(self.log_path, errors="replace") as f:
            lines = f.read().splitlines()
        return f"--- {self.name} (pid {self.pid}) log, last {tail} lines ---\n" + "\n".join(lines[-tail:])

    def running(self):
        return self.proc.poll() is None

    def assert_running(self):
        if not self.running():
            pytest.fail(f"{self.name} exited with {self.proc.returncode}\n{self.log()}")

    def stop(self, timeout=15):
        """SIGTERM, then SIGKILL after timeout s; returns the exit status."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def workdir():
    """A private temporary directory, removed afterwards."""
    path = tempfile.mkdtemp(prefix="mergewatch-deploy-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def processes(workdir):
    """Start background processes with start(name, cmd); all are stopped (by PID, in reverse order) at teardown."""
    started = []

    def start(name, cmd, env=None):
        p = Proc(name, cmd, workdir, env=env)
        started.append(p)
        return p

    start.started = started
    yield start
    errors = []
    for p in reversed(started):
        try:
            p.stop()
        except Exception as e:  # keep stopping the others
            errors.append(f"{p.name}: {e}")
    if errors:
        pytest.fail("could not stop: " + "; ".join(errors))


def start_daemon(processes, *args, name="mergewatchd"):
    """mergewatchd on a free loopback port; returns (Proc, port) once it logged ready."""
    port = free_port()
    d = processes(name, [daemon_binary(), f"--web.listen-address=127.0.0.1:{port}", *args])

    def ready():
        d.assert_running()
        with open(d.log_path, errors="replace") as f:
            return 'msg="ready:' in f.read()

    # Ready takes a BPF load (the loader's own bound is 20 s): 60 s is a hang guard with room for a loaded host.
    wait_until(ready, 60, "mergewatchd to report ready", on_timeout=d.log)
    return d, port


class WebTls:
    """A web config file for mergewatchd (deploy/web-config.example.yml with its paths and hash replaced by
    ones made here): a self-signed certificate for localhost and 127.0.0.1 made with openssl, and a basic
    auth user whose bcrypt hash is made with python3-bcrypt."""

    USER = "prometheus"

    def __init__(self, workdir):
        import bcrypt
        self.dir = os.path.join(workdir, "web")
        os.makedirs(os.path.join(self.dir, "tls"))
        self.cert = os.path.join(self.dir, "tls", "server.crt")
        self.key = os.path.join(self.dir, "tls", "server.key")
        r = run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                 "-keyout", self.key, "-out", self.cert])
        assert r.returncode == 0, r.stderr
        self.password = "pw-" + os.urandom(8).hex()
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(10)).decode()
        with open(os.path.join(REPO, "deploy", "web-config.example.yml")) as f:
            example = f.read()
        text, n = re.subn(r"^(  prometheus: )\S+$", lambda m: m.group(1) + hashed, example, flags=re.M)
        assert n == 1 and "cert_file: tls/server.crt" in text and "key_file: tls/server.key" in text
        self.config = os.path.join(self.dir, "web-config.yml")
        with open(self.config, "w") as f:
            f.write(text)

    def ssl_context(self):
        import ssl
        return ssl.create_default_context(cafile=self.cert)

    def get(self, url, user=USER, password=None, timeout=5):
        """(status, body) of a GET over TLS with basic auth; HTTP errors are returned, not raised."""
        import base64
        import urllib.error
        headers = {}
        if password is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        req = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ssl_context()) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), dict(e.headers)

    def checked_get(self, url, user=USER, password=None, timeout=5, tries=6):
        """get(), past the password-check gate: after a failed check the daemon answers 429 with Retry-After
        (no check run) to the same client for a while (docs/operations.md, "Securing the endpoint"), longer on a loaded host where the
        check's CPU time is longer. A 429 is waited out as it says, and the request sent again."""
        for _ in range(tries):
            status, body, headers = self.get(url, user=user, password=password, timeout=timeout)
            if status != 429:
                return status, body, headers
            retry_after = headers.get("Retry-After", "")
            assert retry_after.isdigit() and 1 <= int(retry_after) <= 10, headers
            # Stays a sleep: waiting out Retry-After is what docs/operations.md asks of a client; the daemon
            # says how long, and the next try checks whether the gate is open again.
            time.sleep(int(retry_after))
        raise AssertionError(f"still 429 after {tries} tries, each waiting out Retry-After")

    def scrape_config(self):
        """What a Prometheus scrape_config needs to scrape the daemon."""
        return {"scheme": "https", "tls_config": {"ca_file": self.cert},
                "basic_auth": {"username": self.USER, "password": self.password}}


@pytest.fixture
def web_tls(workdir):
    return WebTls(workdir)


def assert_alertmanager_routes(config):
    """amtool accepts the Alertmanager config and routes the page to `pager`, the rest to `tickets`."""
    r = run([tool("amtool"), "check-config", config])
    assert r.returncode == 0, r.stdout + r.stderr
    for receiver, labels in (("pager", ["severity=critical", "alertname=MergewatchMergeCollapse"]),
                             ("tickets", ["severity=warning", "alertname=MergewatchDown"])):
        r = run([tool("amtool"), "config", "routes", "test", f"--config.file={config}",
                 f"--verify.receivers={receiver}", *labels])
        assert r.returncode == 0, f"{config}: {labels} did not route to {receiver}: {r.stdout}{r.stderr}"


# Bytecode caches would land in the source tree; the tests import nothing worth caching.
sys.dont_write_bytecode = True
