#!/usr/bin/env python3
"""make bench: what mergewatchd costs, side by side with the tools a user would pick instead.

Workloads on a RAM-backed loop device (file in /dev/shm, scheduler none):
  randread  fio 4 KiB random reads, libaio, queue depth 32, two jobs (both cores busy)
  collapse  fio 4 KiB sequential reads submitted in batches of 64 with nomerges=2 (the incident)
Tracers, interleaved and repeated: none, mergewatchd, bench/mergewatch-equivalent.bt (bpftrace),
libbpf-tools `biolatency -D -Q`. For each: IOPS relative to no tracer and BPF time per I/O, the
sum of the tracer's programs' run_time_ns (kernel.bpf_stats_enabled=1) over the I/Os the disk
completed. Then the daemon's own cost: time to READY, CPU idle and under load, peak RSS, and
/metrics latency with 32 loop devices active.

Usage: bench/run.py --daemon build/mergewatchd [--seconds 6] [--repeats 3] [--quick] [--json out.json]
Needs root. Leaves nothing behind: loop devices detached, processes stopped, sysctl and tracefs
restored.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BPFTRACE_SCRIPT = os.path.join(HERE, "mergewatch-equivalent.bt")
BIOLATENCY = "/usr/sbin/biolatency"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class Cleanup:
    """Undo stack: every resource registers how to release it, released in reverse order."""

    def __init__(self):
        self.steps = []

    def push(self, what, fn):
        self.steps.append((what, fn))

    def release(self):
        while self.steps:
            what, fn = self.steps.pop()
            try:
                fn()
            except Exception as e:  # keep releasing the rest
                log(f"cleanup of {what} failed: {e}")


def make_loop(cleanup, size_mb, name):
    path = f"/dev/shm/mergewatch-bench-{os.getpid()}-{name}.img"
    with open(path, "wb") as f:
        f.truncate(size_mb << 20)
    cleanup.push(f"rm {path}", lambda: os.unlink(path))
    dev = run(["losetup", "-f", "--show", path]).stdout.strip()
    cleanup.push(f"losetup -d {dev}", lambda: run(["losetup", "-d", dev]))
    return dev


def set_queue(dev, **attrs):
    name = os.path.basename(dev)
    for attr, value in attrs.items():
        with open(f"/sys/block/{name}/queue/{attr}", "w") as f:
            f.write(str(value))


def reads_completed(dev):
    with open(f"/sys/block/{os.path.basename(dev)}/stat") as f:
        return int(f.read().split()[0])


def prog_ids_of(pid):
    """BPF programs a process holds: prog_id lines in the fdinfo of its prog and link fds."""
    ids = set()
    fd_dir = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fd_dir):
        try:
            with open(os.path.join(fd_dir, fd)) as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        ids.add(int(line.split()[1]))
        except OSError:
            pass
    return ids


def prog_stats():
    out = json.loads(run(["bpftool", "prog", "show", "-j"]).stdout)
    return {p["id"]: (p.get("name", "?"), p.get("run_time_ns", 0), p.get("run_cnt", 0)) for p in out}


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


# --- tracers ---------------------------------------------------------------------------------

class Tracer:
    def __init__(self, name):
        self.name = name
        self.proc = None

    def start(self):
        pass

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT if self.name != "mergewatchd" else signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def wait_for_programs(proc, count, timeout=60):
    """Until the process holds `count` attachments (bpf_link fds, or perf_event fds for classic
    tracepoints), then a moment for the last one to take effect."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before attaching")
        attached = 0
        fd_dir = f"/proc/{proc.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            attached += target in ("anon_inode:bpf_link", "anon_inode:[perf_event]")
        if attached >= count:
            time.sleep(0.5)
            return
        time.sleep(0.1)
    raise RuntimeError(f"{proc.args[0]} did not attach {count} programs within {timeout} s")


class Floor(Tracer):
    """Empty programs on the same tracepoints (bench/floor.bpf.c): the cost of being attached."""

    def __init__(self, loader, obj):
        super().__init__("floor (empty programs)")
        self.loader, self.obj = loader, obj

    def start(self):
        self.proc = subprocess.Popen([self.loader, self.obj], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_programs(self.proc, 7)


class Mergewatchd(Tracer):
    def __init__(self, binary):
        super().__init__("mergewatchd")
        self.binary = binary
        self.ready_seconds = None

    def start(self):
        sock_dir = tempfile.mkdtemp(prefix="mw-bench-")
        path = os.path.join(sock_dir, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(0.2)
        env = dict(os.environ, NOTIFY_SOCKET=path)
        self.port = free_port()
        t0 = time.monotonic()
        self.proc = subprocess.Popen([self.binary, f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            while True:
                try:
                    if "READY=1" in sock.recv(4096).decode():
                        self.ready_seconds = time.monotonic() - t0
                        break
                except socket.timeout:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mergewatchd exited with {self.proc.returncode}: {self.proc.stderr.read()}")
                if time.monotonic() - t0 > 30:
                    self.stop()
                    raise RuntimeError("mergewatchd sent no READY=1 within 30 s")
        finally:
            sock.close()
            shutil.rmtree(sock_dir)


class Bpftrace(Tracer):
    def __init__(self):
        super().__init__("bpftrace")

    def start(self):
        self.proc = subprocess.Popen(["bpftrace", BPFTRACE_SCRIPT], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for_programs(self.proc, 7)  # the seven probes of the script (END is not a BPF program)

    def stop(self):
        super().stop()


class Biolatency(Tracer):
    def __init__(self):
        super().__init__("biolatency -D -Q")

    def start(self):
        # One long interval: it prints only when stopped.
        self.proc = subprocess.Popen([BIOLATENCY, "-D", "-Q", "3600", "1"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for_programs(self.proc, 3)  # its stdout is block-buffered in a pipe: watch its fds


# --- measurements ----------------------------------------------------------------------------

def fio(dev, workload, seconds):
    common = ["fio", "--name=bench", f"--filename={dev}", "--direct=1", "--ioengine=libaio", "--time_based",
              f"--runtime={seconds}", "--group_reporting", "--output-format=json"]
    if workload == "randread":
        args = ["--rw=randread", "--bs=4k", "--iodepth=32", "--numjobs=2"]
    else:
        args = ["--rw=read", "--bs=4k", "--iodepth=64", "--iodepth_batch_submit=64",
                "--iodepth_batch_complete_min=64", "--numjobs=1"]
    out = json.loads(run(common + args).stdout)
    return out["jobs"][0]["read"]["iops"]


def measure(tracer, dev, workload, seconds):
    tracer.start()
    try:
        ids = prog_ids_of(tracer.proc.pid) if tracer.proc else set()
        before = prog_stats()
        ios0 = reads_completed(dev)
        cpu0 = cpu_seconds(tracer.proc.pid) if tracer.proc else 0
        t0 = time.monotonic()
        iops = fio(dev, workload, seconds)
        elapsed = time.monotonic() - t0
        cpu = (cpu_seconds(tracer.proc.pid) - cpu0) / elapsed if tracer.proc else 0
        ios = reads_completed(dev) - ios0
        after = prog_stats()
        per_prog = {}
        for pid_ in ids:
            if pid_ in before and pid_ in after:
                name, t1, c1 = after[pid_]
                _, t0_, c0 = before[pid_]
                if c1 > c0:
                    prev = per_prog.get(name, (0, 0))
                    per_prog[name] = (prev[0] + t1 - t0_, prev[1] + c1 - c0)
        bpf_ns = sum(t for t, _ in per_prog.values()) / ios if ios else 0
        rss = status_kib(tracer.proc.pid, "VmHWM") if tracer.proc else 0
        return {"iops": iops, "ios": ios, "bpf_ns_per_io": bpf_ns, "cpu_per_s": cpu, "hwm_kib": rss,
                "programs": {n: {"ns_per_run": t / c, "runs_per_io": c / ios if ios else 0}
                             for n, (t, c) in per_prog.items()}}
    finally:
        tracer.stop()


def median(values):
    return statistics.median(values) if values else 0


def spread(values):
    return (min(values), max(values)) if values else (0, 0)


def set_bpf_stats(on):
    run(["sysctl", "-qw", f"kernel.bpf_stats_enabled={1 if on else 0}"])


def compare(tracers, dev, workload, seconds, repeats):
    """Each tracer twice per repeat: with bpf_stats on for the BPF time (the accounting itself
    costs two clock reads per program run), then off for the IOPS a user would see."""
    results = {t.name: [] for t in tracers}
    for r in range(repeats):
        order = tracers[r % len(tracers):] + tracers[:r % len(tracers)]
        for t in order:
            set_bpf_stats(True)
            res = measure(t, dev, workload, seconds)
            set_bpf_stats(False)
            res["iops_with_stats"] = res["iops"]
            res["iops"] = measure(t, dev, workload, seconds)["iops"]
            results[t.name].append(res)
            log(f"{workload} #{r + 1} {t.name}: {res['iops']:.0f} IOPS, {res['bpf_ns_per_io']:.0f} BPF ns/I/O")
    return results


def metrics_latency(daemon, cleanup, devices, scrapes):
    """Median and p99 of /metrics with `devices` loop devices doing light I/O."""
    devs = [make_loop(cleanup, 32, f"m{i}") for i in range(devices)]
    proc = Mergewatchd(daemon)
    proc.start()
    try:
        for d in devs:  # every device gets series: reads, so histograms and merges exist
            run(["dd", f"if={d}", "of=/dev/null", "bs=64k", "count=64", "iflag=direct"])
        # Global options first, then one job per device: 20 random reads/s each, for the whole scrape phase.
        jobs = sum([[f"--name=d{i}", f"--filename={d}"] for i, d in enumerate(devs)], [])
        # --thread: one process (forked fio jobs call setsid() and would outlive a kill of the parent,
        # keeping the loop devices busy).
        light = subprocess.Popen(["fio", "--thread", "--direct=1", "--ioengine=psync", "--rw=randread", "--bs=4k",
                                  "--time_based", "--runtime=600", "--rate_iops=20"] + jobs,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cleanup.push("light fio", lambda: (light.kill(), light.wait()))
        time.sleep(2)
        url = f"http://127.0.0.1:{proc.port}/metrics"
        times, sizes = [], []
        for _ in range(scrapes):
            t0 = time.perf_counter()
            body = urllib.request.urlopen(url, timeout=10).read()
            times.append(time.perf_counter() - t0)
            sizes.append(len(body))
        times.sort()
        text = body.decode()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        return {"devices": devices, "scrapes": scrapes, "median_ms": times[len(times) // 2] * 1e3,
                "p99_ms": times[int(len(times) * 0.99) - 1] * 1e3, "bytes": sizes[-1], "series": series,
                "hwm_kib": status_kib(proc.proc.pid, "VmHWM")}
    finally:
        proc.stop()


def daemon_idle_cost(daemon, seconds):
    proc = Mergewatchd(daemon)
    readies = []
    for _ in range(5):
        proc.start()
        readies.append(proc.ready_seconds)
        proc.stop()
    proc.start()
    try:
        time.sleep(2)
        c0, t0 = cpu_seconds(proc.proc.pid), time.monotonic()
        time.sleep(seconds)
        idle = (cpu_seconds(proc.proc.pid) - c0) / (time.monotonic() - t0)
        rss = status_kib(proc.proc.pid, "VmRSS")
    finally:
        proc.stop()
    return {"ready_ms": [r * 1e3 for r in readies], "idle_cpu_per_s": idle, "idle_rss_kib": rss}


def print_table(title, results, baseline):
    base = median([r["iops"] for r in results[baseline]])
    print(f"\n{title}")
    print(f"| tracer | IOPS, bpf_stats off (median) | vs none | BPF ns per I/O (median, min-max) |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        iops = median([r["iops"] for r in runs])
        ns = [r["bpf_ns_per_io"] for r in runs]
        lo, hi = spread(ns)
        print(f"| {name} | {iops:,.0f} | {100 * iops / base:.1f}% | {median(ns):.0f} ({lo:.0f}-{hi:.0f}) |")
    mw = results.get("mergewatchd")
    if mw:
        print("\nmergewatchd per program (median of runs): ns per run x runs per I/O")
        names = sorted({n for r in mw for n in r["programs"]})
        for n in names:
            per = [r["programs"][n]["ns_per_run"] for r in mw if n in r["programs"]]
            rate = [r["programs"][n]["runs_per_io"] for r in mw if n in r["programs"]]
            print(f"  {n:22s} {median(per):7.1f} ns x {median(rate):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 s runs, 1 repeat, 100 scrapes: a smoke test")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--floor", nargs=2, metavar=("LOADER", "OBJECT"),
                    help="the empty-programs floor: build/bench/floor build/bench/floor.bpf.o")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (BPF, loop devices, sysctl)")
    for tool in ("fio", "losetup", "bpftool", "bpftrace", BIOLATENCY):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} not found (make bench installs it)")
    if args.quick:
        args.seconds, args.repeats = 2, 1
    scrapes = 100 if args.quick else 1000

    cleanup = Cleanup()
    try:
        with open("/proc/sys/kernel/bpf_stats_enabled") as f:
            old_stats = f.read().strip()
        cleanup.push("bpf_stats_enabled", lambda: run(["sysctl", "-qw", f"kernel.bpf_stats_enabled={old_stats}"]))
        # bpftrace attaches classic tracepoints through tracefs; mount it only for the run.
        if not os.path.isdir("/sys/kernel/tracing/events"):
            run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            cleanup.push("tracefs", lambda: run(["umount", "/sys/kernel/tracing"]))

        dev = make_loop(cleanup, 1024, "main")
        set_queue(dev, scheduler="none", nomerges=0)
        run(["dd", "if=/dev/zero", f"of={dev}", "bs=1M", "count=1024", "oflag=direct"])
        daemon = Mergewatchd(args.daemon)
        tracers = [Tracer("none"), daemon, Bpftrace(), Biolatency()]
        if args.floor:
            tracers.append(Floor(*args.floor))
        log(f"randread on {dev}: {args.repeats} x {args.seconds} s per tracer, interleaved")
        randread = compare(tracers, dev, "randread", args.seconds, args.repeats)
        set_queue(dev, nomerges=2)
        log("collapse: sequential 4 KiB in batches of 64, nomerges=2")
        collapse = compare([Tracer("none"), daemon] + tracers[4:], dev, "collapse", args.seconds, args.repeats)
        set_queue(dev, nomerges=0)
        log("daemon idle cost and time to READY")
        idle = daemon_idle_cost(args.daemon, 5 if args.quick else 10)
        log(f"/metrics latency with 32 loop devices, {scrapes} scrapes")
        scrape = metrics_latency(args.daemon, cleanup, 32, scrapes)
    finally:
        cleanup.release()

    print(f"\nmachine: {os.uname().release}, {os.cpu_count()} CPUs; {args.repeats} x {args.seconds} s per tracer")
    print_table("randread: fio 4 KiB random reads, libaio, QD32, 2 jobs, scheduler none", randread, "none")
    print_table("collapse: 4 KiB sequential reads in batches of 64, nomerges=2", collapse, "none")
    mw_load = randread["mergewatchd"]
    print("\nmergewatchd itself")
    print(f"| time to READY (5 starts) | {median(idle['ready_ms']):.0f} ms median, max {max(idle['ready_ms']):.0f} ms |")
    print(f"| CPU idle | {idle['idle_cpu_per_s'] * 1e3:.2f} ms/s |")
    print(f"| CPU under randread load | {median([r['cpu_per_s'] for r in mw_load]) * 1e3:.2f} ms/s |")
    print(f"| RSS idle / peak (VmHWM) | {idle['idle_rss_kib'] / 1024:.1f} MiB / "
          f"{max([r['hwm_kib'] for r in mw_load] + [scrape['hwm_kib']]) / 1024:.1f} MiB |")
    print(f"| /metrics, {scrape['devices']} devices ({scrape['series']} series, {scrape['bytes']} bytes) | "
          f"median {scrape['median_ms']:.2f} ms, p99 {scrape['p99_ms']:.2f} ms over {scrape['scrapes']} scrapes |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"randread": randread, "collapse": collapse, "idle": idle, "scrape": scrape}, f, indent=1)


if __name__ == "__main__":
    main()
