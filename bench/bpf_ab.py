#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A/B of the BPF cost per I/O: two or more mergewatchd builds, run in turn on one RAM-backed loop device.

What BENCHMARKS.md's per-change tables were measured with (section "The BPF half of the performance work"): a 1 GiB
loop device on /dev/shm, scheduler none; each build started alone, fio run for AB_SECONDS (default 4) with
kernel.bpf_stats_enabled=1, the build stopped; AB_REPEATS rounds (default 3), builds alternating, so load from
other users falls on all alike. BPF time is the run_time_ns of the daemon's own programs (found by the prog_id
lines of its /proc/PID/fdinfo) over the requests /sys/block/X/stat completed. AB_WORK=randread (default: 4 KiB
random reads, libaio, QD32, 2 jobs) or collapse (4 KiB sequential reads in batches of 64, nomerges=2). Needs
root, fio and bpftool. Prints per build the median ns per I/O and each program's ns/run and runs per I/O.

  bench/bpf_ab.py BEFORE_BINARY AFTER_BINARY [MORE ...]

An argument with a space in it is a whole command instead of a daemon, run as it is: any BPF loader whose
programs the process holds, such as the floor loader with a scratch object (BENCHMARKS.md, "the lower bound"):
  bench/bpf_ab.py build/mergewatchd "build/bench/floor /tmp/lb.bpf.o block_getrq block_rq_issue block_rq_complete"
"""
import json, os, shlex, subprocess, sys, time, signal

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (bench/run.py: remove_loop_node, which knows the loop nodes that were there before)


def sh(c, **k): return subprocess.run(c, shell=True, check=True, capture_output=True, text=True, **k).stdout


def fio_command(work, loop, seconds):
    """The workload AB_WORK names on `loop` (setting its nomerges), as one fio command line."""
    dev = loop.split("/")[-1]
    if work == "randread":
        sh(f"echo 0 > /sys/block/{dev}/queue/nomerges")
        return f"fio --name=r --filename={loop} --direct=1 --rw=randread --bs=4k --ioengine=libaio --iodepth=32 --numjobs=2 --time_based --runtime={seconds} --group_reporting --output-format=json"
    sh(f"echo 2 > /sys/block/{dev}/queue/nomerges")
    return f"fio --name=c --filename={loop} --direct=1 --rw=read --bs=4k --ioengine=libaio --iodepth=64 --iodepth_batch_submit=64 --iodepth_batch_complete_min=64 --time_based --runtime={seconds} --output-format=json"


def ram_loop(img):
    """A 1 GiB loop device on a file in /dev/shm, filled, scheduler none."""
    sh(f"truncate -s 1G {img}")
    loop = sh(f"losetup --find --show {img}").strip()
    sh(f"dd if=/dev/zero of={loop} bs=1M count=1024 oflag=direct status=none")
    sh(f"echo none > /sys/block/{loop.split('/')[-1]}/queue/scheduler")
    return loop


def release_loop(loop, img):
    """Detaches ram_loop()'s device, removes the node the attach added (losetup leaves it) and the image."""
    sh(f"echo 0 > /sys/block/{loop.split('/')[-1]}/queue/nomerges")
    sh(f"losetup -d {loop}")
    run.remove_loop_node(loop)
    os.unlink(img)


def prog_ids(pid):
    """The ids of the BPF programs process `pid` holds (its fdinfo's prog_id lines)."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            for line in open(f"/proc/{pid}/fdinfo/{fd}"):
                if line.startswith("prog_id:"): ids.add(int(line.split()[1]))
        except OSError: pass
    return ids


def main():
    daemons = sys.argv[1:]
    SEC = int(os.environ.get("AB_SECONDS", "4"))
    REP = int(os.environ.get("AB_REPEATS", "3"))
    WORK = os.environ.get("AB_WORK", "randread")
    img = "/dev/shm/ab.img"
    loop = ram_loop(img)
    dev = loop.split("/")[-1]
    res = {d: [] for d in daemons}
    try:
        for r in range(REP):
            for i, d in enumerate(daemons):
                port = 19700 + i
                argv = shlex.split(d) if " " in d else [d, f"--web.listen-address=127.0.0.1:{port}"]
                p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.5)
                fio = fio_command(WORK, loop, SEC)
                sh("sysctl -q kernel.bpf_stats_enabled=1")
                def progs():
                    out = {}
                    ids = prog_ids(p.pid)
                    for pr in json.loads(sh("bpftool prog show --json")):
                        if pr["id"] in ids:
                            out[pr["name"]] = (pr.get("run_time_ns", 0), pr.get("run_cnt", 0))
                    return out
                a = progs()
                st0 = open(f"/sys/block/{dev}/stat").read().split()
                sh(fio)
                st1 = open(f"/sys/block/{dev}/stat").read().split()
                b = progs()
                sh("sysctl -q kernel.bpf_stats_enabled=0")
                ios = (int(st1[0]) - int(st0[0]))
                per = {n: ((b[n][0]-a[n][0]) / max(1, b[n][1]-a[n][1]), (b[n][1]-a[n][1]) / max(1, ios)) for n in b}
                total = sum(b[n][0]-a[n][0] for n in b) / max(1, ios)
                res[d].append((total, per))
                p.send_signal(signal.SIGTERM); p.wait()
    finally:
        release_loop(loop, img)
    for d in daemons:
        tots = sorted(t for t, _ in res[d])
        print(f"{d}: ns/IO median {tots[len(tots)//2]:.0f} all {[round(t) for t in tots]}")
        names = res[d][0][1].keys()
        for n in sorted(names):
            v = sorted(x[1][n][0] for x in res[d] if n in x[1])
            rate = res[d][0][1][n][1]
            print(f"   {n:22s} ns/run {v[len(v)//2]:7.1f}  runs/IO {rate:.3f}")


if __name__ == "__main__":
    main()
