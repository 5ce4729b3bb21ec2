#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A/B of two mergewatchd binaries: time to READY=1 (sd_notify) and memory (VmHWM, VmRSS, RssAnon,
RssFile) at READY and after one scrape, starts alternating A, B, A, B... The numbers of
BENCHMARKS.md's "Peak RSS" table. Root, kernel BTF. Usage: peak_rss_ab.py A_BINARY B_BINARY [STARTS]"""
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile")


def status(pid):
    with open(f"/proc/{pid}/status") as f:
        rows = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: int(rows[k].split()[0]) for k in FIELDS}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_start(binary):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(30)
        port = free_port()
        env = dict(os.environ, NOTIFY_SOCKET=path)
        t0 = time.monotonic()
        proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while "READY=1" not in sock.recv(4096).decode().split("\n"):
                pass
            ready_ms = (time.monotonic() - t0) * 1e3
            at_ready = status(proc.pid)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                r.read()
            after_scrape = status(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            sock.close()
    return ready_ms, at_ready, after_scrape


def main():
    binaries = sys.argv[1:3]
    starts = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    results = {b: [] for b in binaries}
    for _ in range(starts):
        for b in binaries:
            results[b].append(one_start(b))
    for b in binaries:
        runs = results[b]
        ready = sorted(r[0] for r in runs)
        print(f"{b}: {starts} starts, READY median {statistics.median(ready):.0f} ms (min {ready[0]:.0f}, "
              f"max {ready[-1]:.0f})")
        for i, moment in ((1, "at READY"), (2, "after a scrape")):
            cells = []
            for k in FIELDS:
                v = sorted(r[i][k] / 1024 for r in runs)
                cells.append(f"{k} {v[0]:.1f}-{v[-1]:.1f}")
            print(f"  {moment}: " + ", ".join(cells) + " MiB")


if __name__ == "__main__":
    main()
