"""The sd_notify protocol as systemd sees it: READY only after listen and attach, STATUS, WATCHDOG, STOPPING."""
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import DAEMON, free_port

pytestmark = pytest.mark.privileged


def test_ready_after_listen_and_attach_then_watchdog_and_stopping():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "notify.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(30)
        port = free_port()
        env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="1000000")
        proc = subprocess.Popen([DAEMON, f"--web.listen-address=127.0.0.1:{port}"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            messages = []
            while not any("READY=1" in m for m in messages):
                messages.append(sock.recv(4096).decode())
            # At READY the port answers and the programs are attached.
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            assert 'mergewatch_bpf_program_attached{tracepoint="block_rq_issue",mode="tp_btf"} 1' in text
            assert any(m.startswith("STATUS=") for m in messages), messages
            ready = next(m for m in messages if "READY=1" in m)
            assert "STATUS=serving /metrics" in ready

            deadline = time.monotonic() + 5
            watchdogs = 0
            while watchdogs < 3 and time.monotonic() < deadline:
                watchdogs += sock.recv(4096).decode().count("WATCHDOG=1")
            assert watchdogs >= 3, "WATCHDOG=1 should come at half of WATCHDOG_USEC (0.5 s)"

            proc.send_signal(signal.SIGTERM)
            tail = []
            while not any("STOPPING=1" in m for m in tail):
                tail.append(sock.recv(4096).decode())
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            sock.close()


def test_startup_failure_is_reported_to_systemd():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "notify.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(10)
        r = subprocess.run([DAEMON, f"--web.listen-address=127.0.0.1:{free_port()}", "--path.btf=/nonexistent"],
                           env=dict(os.environ, NOTIFY_SOCKET=path), capture_output=True, timeout=30)
        assert r.returncode == 3
        messages = []
        while not any("ERRNO=" in m for m in messages):
            messages.append(sock.recv(4096).decode())
        assert any("STATUS=failed: cannot read kernel BTF" in m for m in messages), messages
        sock.close()
