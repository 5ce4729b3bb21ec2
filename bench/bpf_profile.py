#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Where a BPF program's time goes, per source line: perf samples in each JIT image, mapped to the lines.

Runs one daemon (or any BPF loader: an argument with a space in it is a whole command, as in bpf_ab.py) on a
RAM-backed loop device under AB_WORK (randread or collapse, bpf_ab.py's workloads), records every CPU with
`perf record -a` for AB_SECONDS (default 6) in the middle of the fio run, then, while the programs are still
loaded, reads each program's JIT image and line info (build/bench/jit_lines) and its translated code with
source lines (`bpftool prog dump xlated linum`). A sample at offset X of bpf_prog_<tag>_<name> belongs to the
last source line whose machine code starts at or before X. Prints, per program named on block tracepoints,
its samples and the source lines holding the most of them (PROFILE_TOP, default 15).

An x86 sample lands on the instruction after the one that stalled (skid), so a line right after a load that
missed the cache carries that load's wait: read a hot line together with the one above it. Needs root, fio,
bpftool and perf (linux-perf); make bench installs them and builds jit_lines.

  bench/bpf_profile.py build/mergewatchd
  AB_WORK=collapse bench/bpf_profile.py "build/bench/floor build/bench/lower_bound_at_dispatch.bpf.o"
"""
import bisect, collections, os, re, shlex, shutil, signal, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpf_ab import fio_command, prog_ids, ram_loop, release_loop, sh  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JIT_LINES = os.path.join(REPO, "build", "bench", "jit_lines")
SAMPLE = re.compile(r"bpf_prog_[0-9a-f]+_(\w+)\+0x([0-9a-f]+)")


def program_names(ids):
    """id -> name of the programs `ids`, from bpftool."""
    names = {}
    for line in sh("bpftool prog show").splitlines():
        m = re.match(r"(\d+): \S+\s+name (\S+)", line)
        if m and int(m.group(1)) in ids:
            names[int(m.group(1))] = m.group(2)
    return names


def source_lines(xlated):
    """Translated instruction -> the source line bpftool printed above it."""
    line_of, current = {}, "?"
    for text in xlated.splitlines():
        if text.lstrip().startswith(";"):
            current = re.sub(r"\s*\[file:.*?line_num:(\d+).*\]$", r"  (line \1)", text.strip()[1:].strip())
            continue
        m = re.match(r"\s*(\d+):", text)
        if m:
            line_of[int(m.group(1))] = current
    return line_of


def capture_program(prog_id, workdir):
    """(starts of each source line's machine code, the translated instruction each starts) of `prog_id`."""
    out = subprocess.run([JIT_LINES, str(prog_id), os.path.join(workdir, str(prog_id))], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    starts = sorted((int(a), int(b)) for a, b in (line.split() for line in out[1:]))
    xlated = sh(f"bpftool prog dump xlated id {prog_id} linum")
    return starts, source_lines(xlated)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if os.geteuid() != 0:
        sys.exit("bpf_profile: needs root (BPF, perf, loop devices)")
    for tool in ("fio", "bpftool", "perf", JIT_LINES):
        if not shutil.which(tool):
            sys.exit(f"bpf_profile: {tool} not found (make bench installs and builds what it needs)")
    target = sys.argv[1]
    seconds = int(os.environ.get("AB_SECONDS", "6"))
    work = os.environ.get("AB_WORK", "randread")
    top = int(os.environ.get("PROFILE_TOP", "15"))
    img = "/dev/shm/bpf_profile.img"
    loop = ram_loop(img)
    workdir = tempfile.mkdtemp(prefix="bpf_profile.")
    perf_data = os.path.join(workdir, "perf.data")
    argv = shlex.split(target) if " " in target else [target, "--web.listen-address=127.0.0.1:19790"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    programs = {}
    try:
        time.sleep(2)
        if proc.poll() is not None:
            sys.exit(f"bpf_profile: {target} exited with {proc.returncode}")
        fio = subprocess.Popen(shlex.split(fio_command(work, loop, seconds + 4)), stdout=subprocess.DEVNULL)
        time.sleep(2)
        subprocess.run(["perf", "record", "-a", "-F", "15000", "-o", perf_data, "--", "sleep", str(seconds)],
                       check=True, capture_output=True)
        fio.wait()
        names = program_names(prog_ids(proc.pid))
        for prog_id, name in names.items():
            programs[name] = capture_program(prog_id, workdir)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        release_loop(loop, img)
    samples = collections.defaultdict(collections.Counter)
    script = subprocess.run(["perf", "script", "-i", perf_data, "-F", "ip,sym,symoff"], capture_output=True,
                            text=True).stdout
    for line in script.splitlines():
        m = SAMPLE.search(line)
        if m and m.group(1) in programs:
            samples[m.group(1)][int(m.group(2), 16)] += 1
    print(f"{target} on {work}, {seconds} s of perf record -a")
    for name in sorted(programs, key=lambda n: -sum(samples[n].values())):
        total = sum(samples[name].values())
        if not total:
            continue
        starts, line_of = programs[name]
        offsets = [start for start, _ in starts]
        per_line = collections.Counter()
        for offset, count in samples[name].items():
            i = bisect.bisect_right(offsets, offset) - 1
            insn = starts[i][1] if i >= 0 else -1
            per_line[(insn, line_of.get(insn, "(prologue)"))] += count
        print(f"== {name}: {total} samples")
        for (insn, text), count in per_line.most_common(top):
            print(f"  {100 * count / total:5.1f}%  insn {insn:4d}  {text[:140]}")
    shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
