# SPDX-License-Identifier: Apache-2.0
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
        env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="3000000")
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

            # systemd kills the service when WATCHDOG=1 does not come within WATCHDOG_USEC (3 s here):
            # every gap between pings must stay below that, not just the count over a span. The
            # daemon pings at its tick, half the interval capped at 1 s: gaps of ~1 s, a third of
            # the deadline (a bound of 3x the measured gap, safe on a loaded machine).
            pings = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                message = sock.recv(4096).decode()
                pings.extend([time.monotonic()] * message.count("WATCHDOG=1"))
            gaps = [b - a for a, b in zip(pings, pings[1:])]
            assert len(pings) >= 4, f"{len(pings)} WATCHDOG=1 in 10 s with WATCHDOG_USEC=3 s"
            assert max(gaps) < 3.0, f"largest gap between WATCHDOG=1 {max(gaps):.3f} s: systemd would kill at 3 s"
            print(f"watchdog: {len(pings)} pings in 10 s, gaps {min(gaps):.3f}-{max(gaps):.3f} s")

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
        r = subprocess.run([DAEMON, f"--web.listen-address=127.0.0.1:{free_port()}", "--path.btf=/nonexistent",
                            "--source=bpf"],
                           env=dict(os.environ, NOTIFY_SOCKET=path), capture_output=True, timeout=30)
        assert r.returncode == 3
        messages = []
        while not any("ERRNO=" in m for m in messages):
            messages.append(sock.recv(4096).decode())
        assert any("STATUS=failed: cannot read kernel BTF" in m for m in messages), messages
        sock.close()
