#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""make bench: what mergewatchd costs, next to the tools a user would pick instead.

Workloads on a RAM-backed loop device (a file in /dev/shm, scheduler none):
  randread  fio 4 KiB random reads, libaio, queue depth 32, two jobs (both cores busy)
  collapse  fio 4 KiB sequential reads submitted and reaped in batches of 64, nomerges=2 (the
            2019 incident: every bio its own request, the most events per byte)
Tracers, interleaved (the order rotates every repeat) and repeated:
  none; mergewatchd; mergewatchd with block_bio_queue forced on (a sysfs fixture with a stacked
  dm device, so all nine programs are attached: the full feature set); bench/mergewatch-equivalent.bt
  (bpftrace); libbpf-tools `biolatency -D -Q`; and the floor: empty tp_btf programs
  (bench/floor.bpf.c) on exactly the tracepoints mergewatchd attached, once for each daemon variant.
  On randread also the lower bound (bench/lower_bound.bpf.c): the least a per-device size and latency
  histogram costs, without merge rules, scheduler time, requeues or stacking; counting at completion
  (the design proposed for the 300 ns target) and at dispatch (what mergewatchd does), on
  block_getrq (empty), block_rq_issue and block_rq_complete; and at dispatch with the least missed-merge
  evidence on block_getrq (one per-CPU record of the last new request: the floor of the detector's evidence);
  and without a table (sizes at dispatch, latency from the kernel's stamp at completion, as Rezolus since its
  PR #1148), on collapse too.
Each tracer start runs fio twice: once with kernel.bpf_stats_enabled=0 for the IOPS a user sees and
once with it on for the BPF time (the accounting itself costs two clock reads per program run). BPF
time per I/O is the sum of the run_time_ns of the tracer's own programs (found through the fds its
process holds) over the I/Os every disk completed meanwhile; per program, the tracepoint comes from
the program's link or perf event.
Then the daemon's own cost: time to READY (NOTIFY_SOCKET datagram socket bound here), CPU idle and
under load (utime+stime in /proc/PID/stat), CPU idle with 100 loop devices attached and the rescans
their attach and detach bursts cause (uevent-driven, counted in the daemon's debug log), peak RSS
(VmHWM), and /metrics latency with 32 loop devices doing light I/O.

The machine may be shared: before each measurement the script waits (up to --quiet-wait s) until no
foreign BPF program is attached to a block tracepoint and other disks are idle, and it flags every
run during which either happened. Medians are taken over the repeats; the spread is min-max.

Configuration: flags, or the environment (make bench passes it on)
  --seconds / BENCH_SECONDS   fio run length, default 5
  --repeats / BENCH_REPEATS   repetitions per tracer, default 3
  --scrapes / BENCH_SCRAPES   /metrics scrapes, default 1000
  --quick   / BENCH_QUICK=1   smoke test: 2 s, 1 repeat, 200 scrapes, fewer READY starts
Needs root. Leaves nothing behind: loop devices it created detached (and removed if it added them), their files removed, every
process it started stopped by PID, bpf_stats_enabled restored; bpftrace gets tracefs in a private
mount namespace, so the host's mounts are never touched. The end of the run checks all of it.
"""
import argparse
import datetime
import json
import math
import os
import platform
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
REPO = os.path.dirname(HERE)
BPFTRACE_SCRIPT = os.path.join(HERE, "mergewatch-equivalent.bt")
# A sysfs tree with dm devices stacked on a disk: mergewatchd then attaches block_bio_queue too.
STACKED_SYSFS = os.path.join(REPO, "tests", "fixtures", "sysfs", "seed-lvm-snapshot")
BIOLATENCY = "/usr/sbin/biolatency"
sys.path.insert(0, os.path.join(REPO, "tests"))
import loop_nodes  # noqa: E402  (tests/loop_nodes.py: standard library only, shared with the suites)
SHM_PREFIX = f"/dev/shm/mergewatch-bench-{os.getpid()}-"

# The performance targets, checked in the summary.
TARGET_BPF_NS = 300
TARGET_IOPS_SHARE = 0.97
TARGET_COLLAPSE_IOPS_SHARE = 0.90
LOWER_BOUND_TRACEPOINTS = ["block_getrq", "block_rq_issue", "block_rq_complete"]
LOWER_BOUND_COMPLETION = "lower bound, counting at completion"
LOWER_BOUND_DISPATCH = "lower bound, counting at dispatch"
LOWER_BOUND_EVIDENCE = "lower bound at dispatch, with the least missed-merge evidence"
LOWER_BOUND_HASHLESS = "lower bound without a table (the kernel's stamps at completion)"
LOWER_BOUNDS = (LOWER_BOUND_COMPLETION, LOWER_BOUND_DISPATCH, LOWER_BOUND_EVIDENCE, LOWER_BOUND_HASHLESS)
TARGET_RSS_MIB = 12
TARGET_SCRAPE_P99_MS = 2
TARGET_READY_MS = 300
# The hot path's ratios: mergewatchd's randread BPF time per I/O against the lower bound counting at
# dispatch (all nine programs too), and its collapse time against biolatency -D -Q, each in the same run.
TARGET_BOUND_RATIO = 1.1
TARGET_FORCED_BOUND_RATIO = 1.2
TARGET_COLLAPSE_BIOLATENCY_RATIO = 0.8
BIOLATENCY_NAME = "biolatency -D -Q"
TARGET_IDLE_MS_PER_S = 1


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def median(values):
    return statistics.median(values) if values else float("nan")


def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def spread(values):
    return (min(values), max(values)) if values else (float("nan"), float("nan"))


class Cleanup:
    """Undo stack: every resource registers how to release it; released in reverse order."""

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


CLEANUP = Cleanup()
OWN_PIDS = set()        # every process this run started
OWN_PROG_IDS = set()    # every BPF program those processes held
OWN_LOOPS = []          # (device, backing file)


def spawn(cmd, **kw):
    """Popen registered for cleanup: killed by PID if still running at the end."""
    proc = subprocess.Popen(cmd, **kw)
    OWN_PIDS.add(proc.pid)

    def stop():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    CLEANUP.push(f"pid {proc.pid} ({os.path.basename(cmd[0])})", stop)
    return proc


# The loop device nodes there were before this run: the ones it adds (losetup -f makes a node when none is
# free) are removed once detached, or every run would leave its devices as empty nodes in /sys/block
# (101 of them on this host once, each a device with series in every daemon's scrape).
LOOPS_BEFORE = loop_nodes.loop_nodes()


def remove_loop_node(dev):
    """Removes the node of detached loop device `dev` if this run added it; the detach may take a moment."""
    name = os.path.basename(dev)
    if name in LOOPS_BEFORE or not name.removeprefix("loop").isdigit():
        return
    loop_nodes.remove_loop_node(name)


def make_loop(size_mb, name, fill=False):
    path = f"{SHM_PREFIX}{name}.img"
    with open(path, "wb") as f:
        f.truncate(size_mb << 20)
    CLEANUP.push(f"rm {path}", lambda: os.path.exists(path) and os.unlink(path))
    dev = run(["losetup", "-f", "--show", path]).stdout.strip()
    OWN_LOOPS.append((dev, path))

    def detach():
        # By the device's own backing file, not `losetup -j path`: a second make_loop of the same name
        # (metrics_latency run twice in one process) reuses the path, whose file is gone by the time
        # the first device is released, and `losetup -j` then finds nothing (96 devices leaked once).
        try:
            with open(f"/sys/block/{os.path.basename(dev)}/loop/backing_file") as f:
                backing = f.read().strip()
        except OSError:  # already detached (the idle-devices burst detaches its own)
            remove_loop_node(dev)
            return
        if backing.removesuffix(" (deleted)") == path:
            run(["losetup", "-d", dev])
            remove_loop_node(dev)
    CLEANUP.push(f"losetup -d {dev}", detach)
    if fill:  # real pages, not holes
        run(["dd", "if=/dev/zero", f"of={dev}", "bs=1M", f"count={size_mb}", "oflag=direct"])
    return dev


def set_queue(dev, **attrs):
    for attr, value in attrs.items():
        with open(f"/sys/block/{os.path.basename(dev)}/queue/{attr}", "w") as f:
            f.write(str(value))


def disk_ios():
    """Reads + writes completed per whole disk (partitions are inside their disk's count)."""
    ios = {}
    for name in os.listdir("/sys/block"):
        try:
            with open(f"/sys/block/{name}/stat") as f:
                fields = f.read().split()
            ios[name] = int(fields[0]) + int(fields[4])
        except (OSError, IndexError, ValueError):
            pass
    return ios


def io_delta(before, after, mine):
    own = sum(after.get(n, 0) - before.get(n, 0) for n in mine)
    other = sum(max(0, v - before.get(n, 0)) for n, v in after.items() if n not in mine)
    return own, other


def cpu_times():
    """(steal, idle + iowait, total) of all CPUs, in clock ticks."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[7] if len(fields) > 7 else 0, fields[3] + fields[4], sum(fields[:8])


PF_KTHREAD = 0x00200000


def other_cpu_ticks():
    """pid -> utime+stime+cutime+cstime of every user-space process not started by this run (kernel
    threads are the I/O path itself: loop workers, softirqs). With cutime/cstime, children reaped
    during a run are counted through their parent."""
    out = {}
    own = OWN_PIDS | {os.getpid()}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in own:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[6]) & PF_KTHREAD:
            continue
        out[int(name)] = sum(int(x) for x in fields[11:15])
    return out


def other_cpu_share(before, after, total_ticks):
    used = sum(v - before.get(pid, 0) for pid, v in after.items())
    return max(0, used) / max(1, total_ticks)


def proc_cpu_seconds(pid):
    """CPU time of a process: utime + stime of /proc/PID/stat (clock ticks, 10 ms here), refined
    by the nanosecond run time of its live threads (/proc/PID/task/*/schedstat) when available."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    try:
        ns = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
        return ns / 1e9
    except (OSError, ValueError, IndexError):
        return ticks


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def fd_targets(pid):
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append((fd, os.readlink(f"/proc/{pid}/fd/{fd}")))
        except OSError:
            pass
    return out


def prog_ids_of(pid):
    """BPF programs a process holds: the prog_id lines in the fdinfo of its prog and link fds."""
    ids = set()
    for fd, _ in fd_targets(pid):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        ids.add(int(line.split()[1]))
        except OSError:
            pass
    return ids


def bpftool_json(*args):
    try:
        return json.loads(run(["bpftool", *args, "-j"]).stdout or "[]")
    except (subprocess.CalledProcessError, json.JSONDecodeError):
        return []


def prog_stats():
    return {p["id"]: (p.get("name", "?"), p.get("run_time_ns", 0), p.get("run_cnt", 0))
            for p in bpftool_json("prog", "show")}


def attachments():
    """(prog_id, pid or None, tracepoint) of every BPF program on a tracepoint: raw_tp/tp_btf
    links, and classic tracepoints through perf events (bpftrace)."""
    out = []
    for link in bpftool_json("link", "show"):
        if link.get("tp_name"):
            out.append((link.get("prog_id"), None, link["tp_name"]))
    for ev in bpftool_json("perf", "show"):
        if ev.get("tracepoint"):
            out.append((ev.get("prog_id"), ev.get("pid"), ev["tracepoint"]))
    return out


def foreign_block_tracers(mine):
    """Programs on block tracepoints that are not this run's: another tracer on the machine."""
    return sorted({(f"pid {pid}" if pid else f"prog {prog}") + f" on {tp}" for prog, pid, tp in attachments()
                   if tp.startswith("block_") and prog not in mine and pid not in OWN_PIDS})


# --- tracers ---------------------------------------------------------------------------------

def wait_for_attach(proc, count, what, timeout=60):
    """Until the process holds `count` attachments (bpf_link fds, or perf_event fds for classic
    tracepoints), then a moment for the last to take effect."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"{what} exited with {proc.returncode} before attaching: {err.strip()[-500:]}")
        attached = sum(t in ("anon_inode:bpf_link", "anon_inode:[perf_event]") for _, t in fd_targets(proc.pid))
        if attached >= count:
            time.sleep(0.3)
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not attach {count} programs within {timeout} s")


class Tracer:
    """A tracer that runs as one process; the base class is 'no tracer'."""
    stop_signal = signal.SIGINT

    def __init__(self, name):
        self.name = name
        self.proc = None
        self.tracepoints = []  # what it attached, learned at start

    def start(self):
        pass

    def programs(self):
        if not self.proc:
            return set()
        ids = prog_ids_of(self.proc.pid)
        OWN_PROG_IDS.update(ids)
        return ids

    def learn_tracepoints(self):
        ids = self.programs()
        self.tracepoints = sorted({tp for prog, pid, tp in attachments()
                                   if prog in ids or (self.proc and pid == self.proc.pid)})

    def stop(self):
        if not self.proc:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log(f"{self.name} ignored signal {self.stop_signal} for 30 s; killing pid {self.proc.pid}")
                self.proc.kill()
                self.proc.wait()
            if self.proc.returncode != 0:
                log(f"{self.name} (pid {self.proc.pid}) exited with {self.proc.returncode} when stopped")
        else:
            log(f"{self.name} (pid {self.proc.pid}) had exited early with {self.proc.returncode}")
        self.proc = None


class Mergewatchd(Tracer):
    stop_signal = signal.SIGTERM  # its documented clean shutdown (exit 0, every link detached)

    def __init__(self, binary, name="mergewatchd", extra_args=(), log_level="warn", log_path=None):
        super().__init__(name)
        self.binary, self.extra_args = binary, list(extra_args)
        self.log_level, self.log_path = log_level, log_path
        self.ready_ms = None
        self.port = None

    def start(self):
        sock_dir = tempfile.mkdtemp(prefix="mw-bench-")
        path = os.path.join(sock_dir, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(0.05)
        env = dict(os.environ, NOTIFY_SOCKET=path)
        with socket.socket() as s:  # a free port per start: a lingering socket never collides
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        # A log file rather than a pipe when the log is read while the daemon runs (a debug log
        # would fill a pipe nobody drains).
        log = open(self.log_path, "w") if self.log_path else subprocess.PIPE
        t0 = time.monotonic()
        self.proc = spawn([self.binary, f"--web.listen-address=127.0.0.1:{self.port}",
                           f"--log.level={self.log_level}", *self.extra_args], env=env, stdout=subprocess.DEVNULL,
                          stderr=log, text=True)
        if self.log_path:
            log.close()
        try:
            while True:
                try:
                    if "READY=1" in sock.recv(4096).decode().split("\n"):
                        self.ready_ms = (time.monotonic() - t0) * 1e3
                        break
                except socket.timeout:
                    pass
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read() if self.proc.stderr else open(self.log_path).read()
                    raise RuntimeError(f"mergewatchd exited with {self.proc.returncode}: {err}")
                if time.monotonic() - t0 > 30:
                    self.stop()
                    raise RuntimeError("mergewatchd sent no READY=1 within 30 s")
        finally:
            sock.close()
            shutil.rmtree(sock_dir)
        self.learn_tracepoints()


class Bpftrace(Tracer):
    PROBES = 8  # the script's probes; END is not attached to a tracepoint

    def __init__(self):
        super().__init__("bpftrace (equivalent script)")

    def start(self):
        cmd = ["bpftrace", BPFTRACE_SCRIPT]
        if not os.path.isdir("/sys/kernel/tracing/events"):
            # Classic tracepoints need tracefs; mount it in a private mount namespace of this
            # process only (unshare and sh exec, so the PID stays bpftrace's).
            cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                   'mount -t tracefs nodev /sys/kernel/tracing && exec "$@"', "sh"] + cmd
        self.proc = spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for_attach(self.proc, self.PROBES, "bpftrace")
        self.learn_tracepoints()


class Biolatency(Tracer):
    def __init__(self):
        super().__init__(BIOLATENCY_NAME)

    def start(self):
        # One long interval: it prints only when stopped.
        self.proc = spawn([BIOLATENCY, "-D", "-Q", "3600", "1"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
        wait_for_attach(self.proc, 3, "biolatency")  # insert (-Q), issue, complete
        self.learn_tracepoints()


class Floor(Tracer):
    """Empty programs on the tracepoints a mergewatchd variant attached: the cost of being there.
    With `tracepoints` instead of a daemon: those (the lower bound's programs)."""

    def __init__(self, loader, obj, daemon, name, tracepoints=None):
        super().__init__(name)
        self.loader, self.obj, self.daemon, self.fixed = loader, obj, daemon, tracepoints

    def start(self):
        tps = self.fixed or self.daemon.tracepoints
        if not tps:
            raise RuntimeError(f"{self.name}: the tracepoints of {self.daemon.name} are not known yet")
        self.proc = spawn([self.loader, self.obj, *tps], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
        wait_for_attach(self.proc, len(tps), "floor")
        self.learn_tracepoints()


# --- measurements ----------------------------------------------------------------------------

def fio(dev, workload, seconds):
    # --thread: one process (forked fio jobs setsid() and would outlive a kill of the parent).
    cmd = ["fio", "--name=bench", f"--filename={dev}", "--direct=1", "--ioengine=libaio", "--thread",
           "--time_based", f"--runtime={seconds}", "--group_reporting", "--output-format=json"]
    if workload == "randread":
        cmd += ["--rw=randread", "--bs=4k", "--iodepth=32", "--numjobs=2"]
    else:
        cmd += ["--rw=read", "--bs=4k", "--iodepth=64", "--iodepth_batch_submit=64",
                "--iodepth_batch_complete_min=64", "--numjobs=1"]
    out = run(cmd).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]["read"]["iops"]


def set_bpf_stats(on):
    with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
        f.write("1" if on else "0")


def wait_quiet(mine_disks, limit):
    """Up to `limit` seconds until no foreign tracer is on a block tracepoint and the other disks
    do under 200 I/Os per second. Returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        a = disk_ios()
        time.sleep(0.3)
        _, other = io_delta(a, disk_ios(), mine_disks)
        if (not foreign_block_tracers(set()) and other < 60) or time.monotonic() - t0 >= limit:
            return time.monotonic() - t0


def fio_phase(tracer, dev, workload, seconds, stats, mine_progs):
    mine_disks = {os.path.basename(d) for d, _ in OWN_LOOPS}
    set_bpf_stats(stats)
    before = prog_stats() if stats else {}
    foreign = set(foreign_block_tracers(mine_progs))
    ios0, cpu_t0, load0, others0 = disk_ios(), cpu_times(), os.getloadavg()[0], other_cpu_ticks()
    cpu0 = proc_cpu_seconds(tracer.proc.pid) if tracer.proc else 0
    t0 = time.monotonic()
    iops = fio(dev, workload, seconds)
    elapsed = time.monotonic() - t0
    cpu = (proc_cpu_seconds(tracer.proc.pid) - cpu0) / elapsed if tracer.proc else 0
    after = prog_stats() if stats else {}
    set_bpf_stats(False)
    own_ios, other_ios = io_delta(ios0, disk_ios(), mine_disks)
    cpu_t1, others1 = cpu_times(), other_cpu_ticks()
    foreign |= set(foreign_block_tracers(mine_progs))
    ticks = max(1, cpu_t1[2] - cpu_t0[2])
    res = {"iops": iops, "own_ios": own_ios, "other_ios": other_ios, "tracer_cpu_s_per_s": cpu,
           "steal_share": (cpu_t1[0] - cpu_t0[0]) / ticks,
           "busy_share": 1 - (cpu_t1[1] - cpu_t0[1]) / ticks,
           "other_processes_cpu_share": other_cpu_share(others0, others1, ticks),
           "loadavg": [load0, os.getloadavg()[0]], "foreign_tracers": sorted(foreign)}
    if stats:
        tp_of = {}
        for prog, pid, tp in attachments():
            if prog in mine_progs:
                tp_of[prog] = tp
        progs = {}
        for pid_ in mine_progs:
            if pid_ in before and pid_ in after:
                name, t1, c1 = after[pid_]
                _, t0_, c0 = before[pid_]
                if c1 > c0:
                    key = tp_of.get(pid_, name)
                    p = progs.setdefault(key, {"run_ns": 0, "runs": 0, "names": []})
                    p["run_ns"] += t1 - t0_
                    p["runs"] += c1 - c0
                    p["names"].append(name)
        ios = own_ios + other_ios  # every disk's I/O ran the tracer's programs
        res["programs"] = progs
        res["bpf_ns_per_io"] = sum(p["run_ns"] for p in progs.values()) / ios if ios else 0
        res["ios_counted"] = ios
    return res


def measure(tracer, dev, workload, seconds, stats_first):
    tracer.start()
    try:
        mine = tracer.programs()
        phases = [False] if not tracer.proc else ([True, False] if stats_first else [False, True])
        out = {}
        for stats in phases:
            out["stats" if stats else "plain"] = fio_phase(tracer, dev, workload, seconds, stats, mine)
        if isinstance(tracer, Mergewatchd):
            out["plain"]["hwm_kib"] = status_kib(tracer.proc.pid, "VmHWM")
            out["plain"]["ready_ms"] = tracer.ready_ms
        return out
    finally:
        tracer.stop()


def compare(tracers, dev, workload, seconds, repeats, quiet_wait):
    """Repeats x tracers, the order rotated every repeat; runs[name][repeat] = measure()."""
    runs = {t.name: [] for t in tracers}
    mine_disks = {os.path.basename(dev)}
    for r in range(repeats):
        k = r % len(tracers)
        for t in tracers[k:] + tracers[:k]:
            waited = wait_quiet(mine_disks, quiet_wait) if quiet_wait else 0
            res = measure(t, dev, workload, seconds, stats_first=(r % 2 == 1))
            res["repeat"], res["waited_s"] = r, waited
            runs[t.name].append(res)
            p, s = res["plain"], res.get("stats", {})
            noise = contamination(res)
            log(f"{workload} #{r + 1} {t.name}: {p['iops']:,.0f} IOPS"
                + (f", {s['bpf_ns_per_io']:.0f} BPF ns/I/O" if s else "")
                + (f"  [noisy: {noise}]" if noise else ""))
    return runs


def contamination(res):
    """Why a run is not clean, or '' when it is."""
    why = []
    for phase in res.values():
        if not isinstance(phase, dict):
            continue
        if phase.get("foreign_tracers"):
            why.append(f"{len(phase['foreign_tracers'])} foreign block tracers")
        total = phase["own_ios"] + phase["other_ios"]
        if total and phase["other_ios"] / total > 0.01:
            why.append(f"other disks {100 * phase['other_ios'] / total:.0f}% of I/O")
        if phase.get("other_processes_cpu_share", 0) > 0.03:
            why.append("other processes used CPU")
    return ", ".join(sorted(set(why)))


def metrics_latency(daemon_bin, devices, scrapes):
    """/metrics median and p99 with `devices` loop devices doing light I/O (so all have series)."""
    devs = [make_loop(32, f"m{i}") for i in range(devices)]
    d = Mergewatchd(daemon_bin)
    d.start()
    ready_ms = d.ready_ms
    try:
        # Global options, then one job per device: 20 random reads/s each for the whole phase.
        jobs = sum([[f"--name=d{i}", f"--filename={dev}"] for i, dev in enumerate(devs)], [])
        light = spawn(["fio", "--thread", "--direct=1", "--ioengine=psync", "--rw=randread", "--bs=4k",
                       "--time_based", "--runtime=3600", "--rate_iops=20"] + jobs,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(3)
            url = f"http://127.0.0.1:{d.port}/metrics"
            for _ in range(20):  # warm-up
                urllib.request.urlopen(url, timeout=10).read()
            cpu0, w0 = proc_cpu_seconds(d.proc.pid), time.monotonic()
            times = []
            for _ in range(scrapes):
                t0 = time.perf_counter()
                body = urllib.request.urlopen(url, timeout=10).read()
                times.append((time.perf_counter() - t0) * 1e3)
            cpu = (proc_cpu_seconds(d.proc.pid) - cpu0) / scrapes
            # Prometheus asks for gzip (Accept-Encoding), and prometheus-cpp compresses when asked.
            gzip_request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
            gzip_times = []
            gzip_cpu0 = proc_cpu_seconds(d.proc.pid)
            for _ in range(scrapes):
                t0 = time.perf_counter()
                with urllib.request.urlopen(gzip_request, timeout=10) as response:
                    gzip_body = response.read()
                    encoding = response.headers.get("Content-Encoding", "")
                gzip_times.append((time.perf_counter() - t0) * 1e3)
            gzip_cpu = (proc_cpu_seconds(d.proc.pid) - gzip_cpu0) / scrapes
            gzip_times.sort()
            text = body.decode()
            names = {os.path.basename(x) for x in devs}
            seen = {n for n in names if f'device="{n}"' in text}
            times.sort()
            return {"devices": devices, "devices_with_series": len(seen), "scrapes": scrapes,
                    "median_ms": median(times), "p90_ms": percentile(times, 90), "p99_ms": percentile(times, 99),
                    "max_ms": times[-1], "bytes": len(body), "cpu_ms_per_scrape": cpu * 1e3,
                    "gzip_median_ms": median(gzip_times), "gzip_p90_ms": percentile(gzip_times, 90),
                    "gzip_p99_ms": percentile(gzip_times, 99), "gzip_cpu_ms_per_scrape": gzip_cpu * 1e3,
                    "gzip_bytes": len(gzip_body), "gzip_encoding": encoding,
                    "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
                    "hwm_kib": status_kib(d.proc.pid, "VmHWM"), "rss_kib": status_kib(d.proc.pid, "VmRSS"),
                    "ready_ms": ready_ms, "wall_s": time.monotonic() - w0}
        finally:
            light.kill()
            light.wait()
    finally:
        d.stop()


def daemon_idle(daemon_bin, starts, idle_seconds):
    readies, hwms = [], []
    d = Mergewatchd(daemon_bin)
    for _ in range(starts):
        d.start()
        readies.append(d.ready_ms)
        hwms.append(status_kib(d.proc.pid, "VmHWM"))
        d.stop()
    d.start()
    try:
        time.sleep(2)
        c0, t0 = proc_cpu_seconds(d.proc.pid), time.monotonic()
        time.sleep(idle_seconds)
        idle = (proc_cpu_seconds(d.proc.pid) - c0) / (time.monotonic() - t0)
        rss, hwm = status_kib(d.proc.pid, "VmRSS"), status_kib(d.proc.pid, "VmHWM")
    finally:
        d.stop()
    return {"ready_ms": readies, "idle_cpu_s_per_s": idle, "idle_seconds": idle_seconds,
            "idle_rss_kib": rss, "hwm_kib": max(hwms + [hwm])}


def rescans_in(log_path):
    """Event-driven rescans the daemon logged (debug level): "rescanned block devices after N block
    device events..." lines, and the events they covered."""
    rescans = events = 0
    with open(log_path) as f:
        for line in f:
            if "rescanned block devices after " in line:
                rescans += 1
                events += int(line.split("rescanned block devices after ", 1)[1].split()[0])
    return rescans, events


def idle_with_devices(daemon_bin, count, idle_seconds):
    """The daemon while `count` loop devices are attached in a burst, then idle, then detached in a
    burst: rescans per burst (uevent-driven, debounced) and CPU per second while they sit idle."""
    log_dir = tempfile.mkdtemp(prefix="mw-bench-log-")
    CLEANUP.push(f"rm -r {log_dir}", lambda: shutil.rmtree(log_dir, ignore_errors=True))
    log_path = os.path.join(log_dir, "mergewatchd.log")
    d = Mergewatchd(daemon_bin, log_level="debug", log_path=log_path)
    d.start()
    devs = []
    try:
        time.sleep(1)
        r0 = rescans_in(log_path)
        t0 = time.monotonic()
        for i in range(count):
            devs.append(make_loop(1, f"idle{i}"))
        attach_s = time.monotonic() - t0
        time.sleep(2)  # the last debounced rescan
        r1 = rescans_in(log_path)
        names = {os.path.basename(x) for x in devs}
        text = urllib.request.urlopen(f"http://127.0.0.1:{d.port}/metrics", timeout=10).read().decode()
        shown = {n for n in names if f'mergewatch_device_info{{device="{n}"' in text}
        cpu_s, t_idle = proc_cpu_seconds(d.proc.pid), time.monotonic()
        time.sleep(idle_seconds)
        idle = (proc_cpu_seconds(d.proc.pid) - cpu_s) / (time.monotonic() - t_idle)
        r_idle = rescans_in(log_path)  # other devices' events (a shared machine) rescan too
        t0 = time.monotonic()
        for dev in devs:
            run(["losetup", "-d", dev])
        detach_s = time.monotonic() - t0
        time.sleep(2)
        r2 = rescans_in(log_path)
        rss, hwm = status_kib(d.proc.pid, "VmRSS"), status_kib(d.proc.pid, "VmHWM")
    finally:
        d.stop()
        for dev, path in OWN_LOOPS:  # their cleanup steps tolerate a device detached here
            if dev in devs and os.path.exists(path):
                os.unlink(path)
    return {"devices": count, "shown_after_burst": len(shown), "attach_s": attach_s, "detach_s": detach_s,
            "attach_rescans": r1[0] - r0[0], "attach_events": r1[1] - r0[1],
            "detach_rescans": r2[0] - r_idle[0], "detach_events": r2[1] - r_idle[1],
            "idle_rescans": r_idle[0] - r1[0], "idle_events": r_idle[1] - r1[1],
            "idle_cpu_s_per_s": idle, "idle_seconds": idle_seconds, "rss_kib": rss, "hwm_kib": hwm}


# --- report ----------------------------------------------------------------------------------

def fmt_range(values, digits=0, unit=""):
    lo, hi = spread(values)
    return f"{median(values):.{digits}f}{unit} ({lo:.{digits}f}-{hi:.{digits}f})"


def num(value, digits=1):
    return "-" if value != value else f"{value:.{digits}f}"  # NaN: did not run


def workload_table(title, runs, baseline="none"):
    lines = [f"### {title}", "",
             "| tracer | IOPS (median) | IOPS vs none, per repeat: median (min-max) | BPF ns per I/O: median"
             " (min-max) | CPU ns per I/O added, from IOPS | tracer's own CPU ms/s | CPUs busy | other processes' CPU"
             " (max) | clean runs |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = runs[baseline]
    ncpu = os.cpu_count()
    for name, rs in runs.items():
        iops = [r["plain"]["iops"] for r in rs]
        ratios = [100 * r["plain"]["iops"] / b["plain"]["iops"] for r, b in zip(rs, base)]
        # With every CPU busy, CPU time per I/O is ncpu / IOPS: what the tracer added, all included.
        added = [ncpu * 1e9 * (1 / r["plain"]["iops"] - 1 / b["plain"]["iops"]) for r, b in zip(rs, base)]
        ns = [r["stats"]["bpf_ns_per_io"] for r in rs if "stats" in r]
        cpu = [r["plain"]["tracer_cpu_s_per_s"] * 1e3 for r in rs]
        busy = [100 * r["plain"]["busy_share"] for r in rs]
        others = [100 * ph["other_processes_cpu_share"] for r in rs for k, ph in r.items() if k in ("plain", "stats")]
        clean = sum(1 for r in rs if not contamination(r))
        lines.append(f"| {name} | {median(iops):,.0f} | "
                     + ("100%" if name == baseline else fmt_range(ratios, 1, "%"))
                     + f" | {fmt_range(ns) if ns else '0'} | "
                     + ("0" if name == baseline else fmt_range(added))
                     + f" | {median(cpu):.2f} | {median(busy):.0f}% | {max(others):.1f}% | {clean}/{len(rs)} |")
    return lines


def per_program(runs, name):
    """tracepoint -> (median ns per run, median runs per I/O) over the repeats."""
    out = {}
    rs = [r["stats"] for r in runs.get(name, []) if "stats" in r]
    for tp in sorted({tp for s in rs for tp in s["programs"]}):
        per = [s["programs"][tp]["run_ns"] / s["programs"][tp]["runs"] for s in rs if tp in s["programs"]]
        rate = [s["programs"][tp]["runs"] / s["ios_counted"] for s in rs if tp in s["programs"] and s["ios_counted"]]
        out[tp] = (median(per), median(rate) if rate else 0.0)
    return out


def program_table(title, runs, daemon, floor, peers):
    mw, fl = per_program(runs, daemon), per_program(runs, floor)
    peer_tabs = [(p, per_program(runs, p)) for p in peers if p in runs]
    lines = [f"### {title}", "",
             f"| tracepoint | runs per I/O | {daemon} ns/run | floor ns/run | above floor | {daemon} ns per I/O"
             + "".join(f" | {p} ns/run" for p, _ in peer_tabs) + " |",
             "|---|---|---|---|---|---" + "|---" * len(peer_tabs) + "|"]
    total = total_floor = 0.0
    nan = float("nan")
    for tp in sorted(set(mw) | set(fl), key=lambda t: (-mw.get(t, (0, 0))[1], t)):
        ns, rate = mw.get(tp, (nan, 0.0))
        fns = fl.get(tp, (nan, 0.0))[0]
        total += ns * rate if rate else 0
        total_floor += fns * rate if rate and fns == fns else 0
        lines.append(f"| {tp} | {rate:.3f} | {num(ns)} | {num(fns)} | {num(ns - fns)} | "
                     f"{num(ns * rate if rate else 0)}"
                     + "".join(f" | {num(t.get(tp, (nan, 0))[0])}" for _, t in peer_tabs) + " |")
    lines.append(f"| **sum** | | | | | **{total:.0f}** (floor at these rates: {total_floor:.0f})"
                 + " |" * (len(peer_tabs) + 1))
    return lines


def check(ok):
    return "met" if ok else "**missed**"


def main():
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--daemon", default=os.path.join(REPO, "build", "mergewatchd"))
    ap.add_argument("--floor", nargs=2, metavar=("LOADER", "OBJECT"),
                    default=[os.path.join(REPO, "build", "bench", "floor"),
                             os.path.join(REPO, "build", "bench", "floor.bpf.o")],
                    help="the empty-programs floor (make bench builds both)")
    ap.add_argument("--lower-bound", nargs=4, metavar=("AT_COMPLETION", "AT_DISPATCH", "WITH_EVIDENCE", "HASHLESS"),
                    default=[os.path.join(REPO, "build", "bench", f"lower_bound_{w}.bpf.o")
                             for w in ("at_completion", "at_dispatch", "with_evidence", "hashless")],
                    help="bench/lower_bound.bpf.c built four ways (make bench builds them)")
    ap.add_argument("--seconds", type=int, default=int(env("BENCH_SECONDS") or 5))
    ap.add_argument("--repeats", type=int, default=int(env("BENCH_REPEATS") or 3))
    ap.add_argument("--scrapes", type=int, default=int(env("BENCH_SCRAPES") or 1000))
    ap.add_argument("--quick", action="store_true", default=env("BENCH_QUICK", "") not in ("", "0"),
                    help="smoke test: 2 s runs, 1 repeat, 200 scrapes")
    ap.add_argument("--quiet-wait", type=float, default=float(env("BENCH_QUIET_WAIT") or 10),
                    help="seconds to wait for foreign block tracers and disk I/O to stop before each run (0: never)")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--markdown", help="write the summary tables here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (BPF, loop devices, sysctl)")
    for tool in ("fio", "losetup", "bpftool", "bpftrace", "unshare", BIOLATENCY, args.daemon, args.floor[0]):
        if not shutil.which(tool) and not os.access(tool, os.X_OK):
            sys.exit(f"bench: {tool} not found (make bench installs and builds what it needs)")
    for obj in (args.floor[1], *args.lower_bound):
        if not os.path.exists(obj):
            sys.exit(f"bench: {obj} not found (make bench builds it)")
    if args.quick:
        args.seconds, args.repeats, args.scrapes = 2, 1, min(args.scrapes, 200)
    ready_starts, idle_seconds = (3, 5) if args.quick else (10, 15)

    # SIGTERM/SIGHUP unwind like Ctrl-C, so the cleanup runs.
    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    started = time.monotonic()
    when = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()
    progs_before = set(prog_stats())
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        old_stats = f.read().strip()
    results = {}
    try:
        CLEANUP.push("bpf_stats_enabled", lambda: open("/proc/sys/kernel/bpf_stats_enabled", "w").write(old_stats))

        dev = make_loop(1024, "main", fill=True)
        set_queue(dev, scheduler="none", nomerges=0)
        daemon = Mergewatchd(args.daemon)
        forced = Mergewatchd(args.daemon, "mergewatchd, bio_queue forced on", [f"--path.sysfs={STACKED_SYSFS}"])
        for d in (daemon, forced):  # learn what each variant attaches, for its floor
            d.start()
            d.stop()
            log(f"{d.name} attaches {len(d.tracepoints)}: {' '.join(d.tracepoints)}")
        floor = Floor(*args.floor, daemon, "floor (empty programs)")
        floor_forced = Floor(*args.floor, forced, "floor, with bio_queue")
        biolat, bpftrace = Biolatency(), Bpftrace()
        lower = [Floor(args.floor[0], obj, None, name, LOWER_BOUND_TRACEPOINTS)
                 for obj, name in zip(args.lower_bound, LOWER_BOUNDS)]
        tracers = [Tracer("none"), daemon, forced, bpftrace, biolat, floor, floor_forced, *lower]
        log(f"randread on {dev}: {args.repeats} x {args.seconds} s x 2 (bpf_stats off/on) per tracer")
        results["randread"] = compare(tracers, dev, "randread", args.seconds, args.repeats, args.quiet_wait)
        set_queue(dev, nomerges=2)
        log("collapse: sequential 4 KiB in batches of 64, nomerges=2")
        results["collapse"] = compare([Tracer("none"), daemon, bpftrace, biolat, floor, lower[3]], dev, "collapse",
                                      args.seconds, args.repeats, args.quiet_wait)
        set_queue(dev, nomerges=0)
        log(f"daemon: {ready_starts} starts to READY, {idle_seconds} s idle")
        results["idle"] = daemon_idle(args.daemon, ready_starts, idle_seconds)
        log(f"daemon: 100 loop devices attached in a burst, {idle_seconds} s idle, detached in a burst")
        results["idle_devices"] = idle_with_devices(args.daemon, 100, idle_seconds)
        log(f"/metrics with 32 loop devices doing light I/O, {args.scrapes} scrapes")
        results["scrape"] = metrics_latency(args.daemon, 32, args.scrapes)
    finally:
        CLEANUP.release()
        leftovers = verify_clean(old_stats)
    results["cleanup_problems"] = leftovers
    results["progs_loaded_before"] = len(progs_before)

    if args.json:  # first: the raw numbers survive a failure in the report
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    lines = report(results, args, when, load_start, time.monotonic() - started, daemon, forced)
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    if leftovers:
        sys.exit(1)


def verify_clean(old_stats):
    """Everything this run made is gone; returns what is not."""
    problems = []
    for dev, path in OWN_LOOPS:
        if os.path.basename(dev) not in LOOPS_BEFORE and os.path.exists(f"/sys/block/{os.path.basename(dev)}"):
            problems.append(f"{dev} was added by this run and is still there")
        if os.path.exists(path):
            problems.append(f"{path} still exists")
        try:
            if run(["losetup", "-j", path]).stdout.strip():
                problems.append(f"{dev} still attached to {path}")
        except subprocess.CalledProcessError:
            pass
    for pid in OWN_PIDS:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    problems.append(f"pid {pid} still running")
        except OSError:
            pass
    still = OWN_PROG_IDS & set(prog_stats())
    if still:
        problems.append(f"BPF programs still loaded: {sorted(still)}")
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        if f.read().strip() != old_stats:
            problems.append("kernel.bpf_stats_enabled not restored")
    for p in problems:
        log(f"CLEANUP PROBLEM: {p}")
    if not problems:
        log(f"cleanup verified: {len(OWN_LOOPS)} loop devices detached (the ones it added removed) and files removed, "
            f"{len(OWN_PIDS)} processes"
            f" gone, {len(OWN_PROG_IDS)} BPF programs unloaded, bpf_stats_enabled={old_stats}")
    return problems


def package_versions():
    names = ["fio", "bpftrace", "libbpf-tools", "bpftool", "libbpf1"]
    try:
        out = run(["dpkg-query", "-W", "-f=${Package} ${Version}\n", *names]).stdout
        return ", ".join(out.split("\n")[:-1])
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def report(results, args, when, load_start, wall, daemon, forced):
    load_end = os.getloadavg()
    with open("/proc/cpuinfo") as f:
        model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), platform.machine())
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    all_runs = [r for w in ("randread", "collapse") for rs in results[w].values() for r in rs]
    noisy = sum(1 for r in all_runs if contamination(r))
    loads = [l for r in all_runs for ph in r.values() if isinstance(ph, dict) for l in ph["loadavg"]]
    disks = os.listdir("/sys/block")
    lines = [f"## make bench, {when:%Y-%m-%d %H:%M} UTC", "",
             f"Machine: Linux {os.uname().release}, {os.cpu_count()} CPUs ({model}), {mem_gib:.0f} GiB; "
             f"{len(disks)} block devices in /sys/block ({sum(d.startswith('loop') for d in disks)} loop, most "
             f"unattached; the daemon's topology scan visits them all). "
             f"{args.repeats} repeats x {args.seconds} s per tracer and bpf_stats setting; {wall / 60:.1f} min in all.",
             f"Load average (1 min): {load_start[0]:.2f} at the start, {min(loads):.2f}-{max(loads):.2f} during the "
             f"runs, {load_end[0]:.2f} at the end. Noisy runs (a foreign tracer on a block tracepoint, other disks "
             f"busy, or other processes above 3% of the CPUs): {noisy} of {len(all_runs)}.",
             f"Versions: {package_versions()}.", ""]
    lines += workload_table("randread: fio 4 KiB random reads, libaio, QD32, 2 jobs, scheduler none",
                            results["randread"]) + [""]
    lines += workload_table("collapse: 4 KiB sequential reads in batches of 64, nomerges=2",
                            results["collapse"]) + [""]
    peers = ["bpftrace (equivalent script)", BIOLATENCY_NAME]
    lines += program_table("randread: where mergewatchd's BPF time goes (per tracepoint, medians)",
                           results["randread"], daemon.name, "floor (empty programs)", peers) + [""]
    lines += program_table("randread, all nine programs attached (block_bio_queue forced on)",
                           results["randread"], forced.name, "floor, with bio_queue", []) + [""]
    lines += program_table("collapse: where mergewatchd's BPF time goes", results["collapse"], daemon.name,
                           "floor (empty programs)", peers) + [""]

    idle, scrape, idev = results["idle"], results["scrape"], results["idle_devices"]
    rr = results["randread"]
    load_cpu = [r["plain"]["tracer_cpu_s_per_s"] * 1e3 for r in rr[daemon.name]]
    hwm = max([idle["hwm_kib"], scrape["hwm_kib"]]
              + [r["plain"]["hwm_kib"] for w in ("randread", "collapse") for r in results[w][daemon.name]]) / 1024
    ready = sorted(idle["ready_ms"])
    lines += ["### mergewatchd itself", "", "| | measured | target |", "|---|---|---|",
              f"| time to READY ({len(ready)} starts, no other devices) | median {median(ready):.0f} ms, max "
              f"{ready[-1]:.0f} ms | {TARGET_READY_MS} ms |",
              f"| time to READY with 32 more loop devices | {scrape['ready_ms']:.0f} ms | {TARGET_READY_MS} ms |",
              f"| CPU idle ({idle['idle_seconds']} s) | {idle['idle_cpu_s_per_s'] * 1e3:.1f} ms/s | |",
              f"| CPU idle with {idev['devices']} more loop devices attached and idle ({idev['idle_seconds']} s) | "
              f"{idev['idle_cpu_s_per_s'] * 1e3:.2f} ms/s ({idev['idle_rescans']} rescans for {idev['idle_events']} "
              f"uevents of other devices meanwhile) | {TARGET_IDLE_MS_PER_S} ms/s |",
              f"| {idev['devices']} loop devices attached in a burst ({idev['attach_s']:.1f} s), then detached "
              f"({idev['detach_s']:.1f} s) | {idev['attach_rescans']} rescans for {idev['attach_events']} uevents, "
              f"then {idev['detach_rescans']} for {idev['detach_events']}; {idev['shown_after_burst']} of "
              f"{idev['devices']} in /metrics 2 s after the burst | |",
              f"| CPU under randread load | {median(load_cpu):.1f} ms/s (min-max {min(load_cpu):.1f}-"
              f"{max(load_cpu):.1f}) | |",
              f"| RSS idle / peak (VmHWM, every start) | {idle['idle_rss_kib'] / 1024:.1f} MiB / {hwm:.1f} MiB | "
              f"{TARGET_RSS_MIB} MiB |",
              f"| `/metrics`, 32 loop devices ({scrape['devices_with_series']} with series; {scrape['series']} series,"
              f" {scrape['bytes'] / 1024:.0f} KiB) | median {scrape['median_ms']:.2f} ms, p90 {scrape['p90_ms']:.2f}, "
              f"p99 {scrape['p99_ms']:.2f}, max {scrape['max_ms']:.2f} ms over {scrape['scrapes']} scrapes; "
              f"{scrape['cpu_ms_per_scrape']:.2f} ms CPU per scrape | p99 {TARGET_SCRAPE_P99_MS} ms |",
              f"| `/metrics` the same, asking for gzip as Prometheus does (Content-Encoding: "
              f"{scrape['gzip_encoding'] or 'none'}, {scrape['gzip_bytes'] / 1024:.0f} KiB) | median "
              f"{scrape['gzip_median_ms']:.2f} ms, p90 {scrape['gzip_p90_ms']:.2f}, p99 {scrape['gzip_p99_ms']:.2f} ms; "
              f"{scrape['gzip_cpu_ms_per_scrape']:.2f} ms CPU per scrape | |",
              f"| RSS after the scrapes / peak | {scrape['rss_kib'] / 1024:.1f} MiB / {scrape['hwm_kib'] / 1024:.1f} MiB | |",
              ""]

    ns = median([r["stats"]["bpf_ns_per_io"] for r in rr[daemon.name]])
    ns_forced = median([r["stats"]["bpf_ns_per_io"] for r in rr[forced.name]])
    def iops_share(workload, name):
        w = results[workload]
        return median([r["plain"]["iops"] / b["plain"]["iops"] for r, b in zip(w[name], w["none"])])
    share = iops_share("randread", daemon.name)
    collapse_share = iops_share("collapse", daemon.name)
    bound = {n: median([r["stats"]["bpf_ns_per_io"] for r in rr[n]]) for n in LOWER_BOUNDS}
    collapse_ns = {n: median([r["stats"]["bpf_ns_per_io"] for r in results["collapse"][n]])
                   for n in (daemon.name, BIOLATENCY_NAME, LOWER_BOUND_HASHLESS)}
    floor_ns = median([r["stats"]["bpf_ns_per_io"] for r in rr["floor (empty programs)"]])
    lines += ["### Targets", "", "| target | measured | |", "|---|---|---|",
              f"| BPF time per I/O <= {TARGET_BPF_NS} ns (randread) | {ns:.0f} ns; all nine programs {ns_forced:.0f} ns"
              f" | {check(max(ns, ns_forced) <= TARGET_BPF_NS)} |",
              f"| (the same, lower bound of any per-device size and latency histogram: empty programs, then "
              f"one device lookup at completion / at dispatch and completion) | {floor_ns:.0f} ns, then "
              f"{bound[LOWER_BOUND_COMPLETION]:.0f} / {bound[LOWER_BOUND_DISPATCH]:.0f} ns | "
              f"{check(bound[LOWER_BOUND_COMPLETION] <= TARGET_BPF_NS)} |",
              f"| randread: mergewatchd <= {TARGET_BOUND_RATIO}x the lower bound counting at dispatch | "
              f"{ns / bound[LOWER_BOUND_DISPATCH]:.2f}x ({ns:.0f} / {bound[LOWER_BOUND_DISPATCH]:.0f} ns; against "
              f"the bound with the least missed-merge evidence {ns / bound[LOWER_BOUND_EVIDENCE]:.2f}x, "
              f"{bound[LOWER_BOUND_EVIDENCE]:.0f} ns) | {check(ns <= TARGET_BOUND_RATIO * bound[LOWER_BOUND_DISPATCH])} |",
              f"| (randread and collapse: mergewatchd against the bound without a table, whatever they come to) | "
              f"{ns / bound[LOWER_BOUND_HASHLESS]:.2f}x ({bound[LOWER_BOUND_HASHLESS]:.0f} ns) and "
              f"{collapse_ns[daemon.name] / collapse_ns[LOWER_BOUND_HASHLESS]:.2f}x "
              f"({collapse_ns[LOWER_BOUND_HASHLESS]:.0f} ns) | |",
              f"| randread, all nine programs: <= {TARGET_FORCED_BOUND_RATIO}x the same bound | "
              f"{ns_forced / bound[LOWER_BOUND_DISPATCH]:.2f}x | "
              f"{check(ns_forced <= TARGET_FORCED_BOUND_RATIO * bound[LOWER_BOUND_DISPATCH])} |",
              f"| collapse: mergewatchd <= {TARGET_COLLAPSE_BIOLATENCY_RATIO}x `biolatency -D -Q` | "
              f"{collapse_ns[daemon.name] / collapse_ns[BIOLATENCY_NAME]:.2f}x ({collapse_ns[daemon.name]:.0f} / "
              f"{collapse_ns[BIOLATENCY_NAME]:.0f} ns) | "
              f"{check(collapse_ns[daemon.name] <= TARGET_COLLAPSE_BIOLATENCY_RATIO * collapse_ns[BIOLATENCY_NAME])} |",
              f"| IOPS >= {TARGET_IOPS_SHARE:.0%} of no tracer (randread) | {share:.1%} (lower bound "
              f"{iops_share('randread', LOWER_BOUND_COMPLETION):.1%} / {iops_share('randread', LOWER_BOUND_DISPATCH):.1%})"
              f" | {check(share >= TARGET_IOPS_SHARE)} |",
              f"| IOPS >= {TARGET_COLLAPSE_IOPS_SHARE:.0%} of no tracer (collapse) | {collapse_share:.1%} | "
              f"{check(collapse_share >= TARGET_COLLAPSE_IOPS_SHARE)} |",
              f"| RSS <= {TARGET_RSS_MIB} MiB (peak) | {hwm:.1f} MiB | {check(hwm <= TARGET_RSS_MIB)} |",
              f"| `/metrics` p99 <= {TARGET_SCRAPE_P99_MS} ms, 32 devices | {scrape['p99_ms']:.2f} ms | "
              f"{check(scrape['p99_ms'] <= TARGET_SCRAPE_P99_MS)} |",
              f"| CPU idle <= {TARGET_IDLE_MS_PER_S} ms/s with {idev['devices']} loop devices attached | "
              f"{idev['idle_cpu_s_per_s'] * 1e3:.2f} ms/s | {check(idev['idle_cpu_s_per_s'] * 1e3 <= TARGET_IDLE_MS_PER_S)} |",
              f"| READY <= {TARGET_READY_MS} ms | max {max(ready + [scrape['ready_ms']]):.0f} ms | "
              f"{check(max(ready + [scrape['ready_ms']]) <= TARGET_READY_MS)} |"]
    if results["cleanup_problems"]:
        lines += ["", "CLEANUP PROBLEMS: " + "; ".join(results["cleanup_problems"])]
    return lines


if __name__ == "__main__":
    main()
