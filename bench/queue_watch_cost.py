#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A/B of the daemon's idle CPU with many disks: what re-reading every disk's queue settings each tick
(topology/queue_watch.*) costs. Attaches --disks loop devices (sparse files on /dev/shm, no I/O), then starts
each build in turn with --source=diskstats (its tick reads /proc/diskstats, the detector and the queue
settings; no BPF, so nothing else moves) and measures its CPU over --idle seconds from the threads'
schedstat, --rounds times alternating. The daemons get --collapse.lower-devices=^loop: every loop disk is one the
detector watches, so its queue settings are read each tick (the worst case). Root. Cleans up its loop devices
and daemons by PID.

  bench/queue_watch_cost.py BEFORE_BINARY AFTER_BINARY [--disks 100] [--idle 20] [--rounds 3]"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diskstats_cost import cpu_seconds, free_port  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binaries", nargs=2)
    p.add_argument("--disks", type=int, default=100)
    p.add_argument("--idle", type=float, default=20)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    workdir = tempfile.mkdtemp(prefix="mw-qw-", dir="/dev/shm")
    loops = []
    results = {b: [] for b in a.binaries}
    try:
        for i in range(a.disks):
            path = os.path.join(workdir, f"d{i}")
            with open(path, "wb") as f:
                f.truncate(16 << 20)
            loops.append(subprocess.run(["losetup", "--find", "--show", path], check=True, capture_output=True,
                                        text=True).stdout.strip())
        time.sleep(2)  # the loop devices' uevents settle before any daemon starts
        for r in range(a.rounds):
            for b in a.binaries:
                port = free_port()
                proc = subprocess.Popen([b, "--source=diskstats", f"--web.listen-address=127.0.0.1:{port}",
                                         "--log.level=warn", "--collapse.lower-devices=^loop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    time.sleep(3)  # start-up scan and first ticks
                    c0 = cpu_seconds(proc.pid)
                    time.sleep(a.idle)
                    results[b].append((cpu_seconds(proc.pid) - c0) / a.idle * 1e3)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=30)
    finally:
        for loop in loops:
            subprocess.run(["losetup", "-d", loop], check=False)
        for name in os.listdir(workdir):
            os.unlink(os.path.join(workdir, name))
        os.rmdir(workdir)
    for b, ms in results.items():
        print(f"{b}: daemon CPU {sorted(ms)[len(ms) // 2]:.2f} ms per second idle (median of {len(ms)}: "
              + ", ".join(f"{m:.2f}" for m in ms) + f") with {a.disks} loop disks")


if __name__ == "__main__":
    main()
