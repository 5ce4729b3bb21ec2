# SPDX-License-Identifier: Apache-2.0
"""The diskstats source's cost: no BPF, so nothing per I/O; what it costs is the 1 s tick (read
/proc/diskstats or /sys/block/*/stat, the detector) and each scrape. Starts mergewatchd --source=diskstats,
measures its CPU (the threads' /proc/PID/task/*/schedstat) idle over --idle seconds, then --scrapes scrapes back to
back: daemon CPU per scrape and wall time per scrape (median, p99). With --procfs-hidden the daemon gets an
empty --path.procfs, as under the unit's ProcSubset=pid: the per-disk sysfs stat files instead.

Usage: bench/diskstats_cost.py --daemon build/mergewatchd [--idle 10] [--scrapes 200] [--procfs-hidden]"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

def cpu_seconds(pid):
    """CPU time of every thread in ns precision (schedstat's first field), not utime+stime's 10 ms ticks:
    the tick costs well under a tick per second."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:  # a thread that ended
            pass
    return total / 1e9


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--idle", type=float, default=10)
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--procfs-hidden", action="store_true")
    a = ap.parse_args()
    port = free_port()
    empty = tempfile.mkdtemp(prefix="mw-bench-procfs-")
    args = [a.daemon, "--source=diskstats", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    if a.procfs_hidden:
        args.append(f"--path.procfs={empty}")
    proc = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                body = urllib.request.urlopen(url, timeout=5).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"mergewatchd did not serve {url} (exit {proc.poll()})")
                time.sleep(0.1)
        disks = len(os.listdir("/sys/block"))
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        time.sleep(2)  # past the start
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(a.idle)
        idle_ms_per_s = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0) * 1000
        walls = []
        c0 = cpu_seconds(proc.pid)
        t0 = time.monotonic()
        for _ in range(a.scrapes):
            s = time.monotonic()
            urllib.request.urlopen(url, timeout=10).read()
            walls.append((time.monotonic() - s) * 1000)
        elapsed = time.monotonic() - t0
        # The ticks during the scrapes are in the CPU too: take them out at the idle rate.
        scrape_cpu_ms = ((cpu_seconds(proc.pid) - c0) * 1000 - idle_ms_per_s * elapsed) / a.scrapes
        source = f"{empty}/diskstats absent: /sys/block/*/stat" if a.procfs_hidden else "/proc/diskstats"
        print(f"diskstats source ({source}), {disks} disks in /sys/block, {series} series per scrape")
        print(f"  idle CPU (1 s tick: read + detector), {a.idle:.0f} s: {idle_ms_per_s:.2f} ms/s")
        print(f"  per scrape, {a.scrapes} back to back: daemon CPU {scrape_cpu_ms:.2f} ms, wall median {percentile(walls, 50):.2f} ms, "
              f"p99 {percentile(walls, 99):.2f} ms")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.rmdir(empty)


if __name__ == "__main__":
    main()
