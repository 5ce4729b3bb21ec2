#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A/B of the /metrics scrape: two mergewatchd builds side by side on the same 32 loop devices.

The bench's scrape setup (bench/run.py metrics_latency: 32 loop devices, fio doing 20 random 4 KiB
reads/s on each), but both daemons run at once and are scraped in alternating rounds, so load from
other users of a shared machine falls on both alike. Per build: wall time percentiles of plain and
of gzip scrapes, and the daemon's CPU per scrape (utime+stime, as run.py reads it, over the scrapes
of its own rounds only). Needs root.

  bench/scrape_ab.py BEFORE_BINARY AFTER_BINARY [--rounds 10] [--scrapes 50]
"""
import argparse
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: loop devices, daemon start/stop, cleanup by PID)


def scrape_round(daemon, scrapes, gzip):
    url = f"http://127.0.0.1:{daemon.port}/metrics"
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzip else {})
    cpu0 = run.proc_cpu_seconds(daemon.proc.pid)
    times, body = [], b""
    for _ in range(scrapes):
        t0 = time.perf_counter()
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, run.proc_cpu_seconds(daemon.proc.pid) - cpu0, body


def summary(times, cpu_s, scrapes):
    times = sorted(times)
    return {"median_ms": run.median(times), "p90_ms": run.percentile(times, 90),
            "p99_ms": run.percentile(times, 99), "max_ms": times[-1], "cpu_ms_per_scrape": cpu_s * 1e3 / scrapes}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binaries", nargs=2, metavar="BINARY")
    ap.add_argument("--devices", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--scrapes", type=int, default=50, help="scrapes per daemon per round")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("scrape_ab: needs root")
    results = {}
    try:
        devs = [run.make_loop(32, f"ab{i}") for i in range(args.devices)]
        daemons = [run.Mergewatchd(b, name=f"{'AB'[i]}: {b}") for i, b in enumerate(args.binaries)]
        for d in daemons:
            d.start()
        jobs = sum([[f"--name=d{i}", f"--filename={dev}"] for i, dev in enumerate(devs)], [])
        light = run.spawn(["fio", "--thread", "--direct=1", "--ioengine=psync", "--rw=randread", "--bs=4k",
                           "--time_based", "--runtime=3600", "--rate_iops=20"] + jobs,
                          stdout=run.subprocess.DEVNULL, stderr=run.subprocess.DEVNULL)
        time.sleep(3)
        for d in daemons:  # warm-up
            scrape_round(d, 20, False)
        plain = {d.name: ([], 0.0) for d in daemons}
        gz = {d.name: ([], 0.0) for d in daemons}
        last = {}
        for r in range(args.rounds):
            order = daemons if r % 2 == 0 else daemons[::-1]  # neither always goes first
            for d in order:
                t, c, body = scrape_round(d, args.scrapes, False)
                plain[d.name] = (plain[d.name][0] + t, plain[d.name][1] + c)
                last[d.name] = body
                t, c, _ = scrape_round(d, args.scrapes, True)
                gz[d.name] = (gz[d.name][0] + t, gz[d.name][1] + c)
        light.kill()
        light.wait()
        n = args.rounds * args.scrapes
        for d in daemons:
            text = last[d.name].decode()
            results[d.name] = {
                "plain": summary(*plain[d.name], n), "gzip": summary(*gz[d.name], n),
                "bytes": len(text),
                "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
                "rss_kib": run.status_kib(d.proc.pid, "VmRSS"), "hwm_kib": run.status_kib(d.proc.pid, "VmHWM")}
        for d in daemons:
            d.stop()
    finally:
        run.CLEANUP.release()
    load = os.getloadavg()
    print(f"{args.devices} devices, {args.rounds} rounds x {args.scrapes} scrapes per daemon, "
          f"load average at the end {load[0]:.1f}")
    for name, r in results.items():
        print(f"{name}: {r['series']} series, {r['bytes']} bytes, RSS {r['rss_kib']} KiB (peak {r['hwm_kib']})")
        for kind in ("plain", "gzip"):
            s = r[kind]
            print(f"  {kind:5}: CPU {s['cpu_ms_per_scrape']:.3f} ms/scrape; median {s['median_ms']:.2f} ms, "
                  f"p90 {s['p90_ms']:.2f}, p99 {s['p99_ms']:.2f}, max {s['max_ms']:.2f}")


if __name__ == "__main__":
    main()
