#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs a libFuzzer binary and turns its exit status into a JUnit report that tests/summary.py reads.

Usage: run_fuzz.py --junit OUT.xml --log FUZZ.log --tmp-base DIR [--name topology_fuzz] -- FUZZER ARGS...

One testcase (--name). It fails when the fuzzer exits non-zero; the failure text is the tail of the
fuzzer's output (the sanitizer report or libFuzzer's crash/timeout/OOM message, and the artifact
path). The fuzzer's temp trees go under a fresh dir in --tmp-base (MERGEWATCH_FUZZ_TMPDIR), removed
afterwards whatever happened. Exits with the fuzzer's status (1 if it could not be started).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

TAIL_LINES = 150


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--junit", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--tmp-base", required=True)
    ap.add_argument("--name", default="topology_fuzz")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no fuzzer command given")

    os.makedirs(args.tmp_base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="run.", dir=args.tmp_base)
    env = dict(os.environ, MERGEWATCH_FUZZ_TMPDIR=tmp)
    # LeakSanitizer works in this environment (ptrace allowed); halt on the first UBSan report.
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    print("run_fuzz:", " ".join(command), flush=True)
    start = time.monotonic()
    try:
        with open(args.log, "wb") as log:
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
            for chunk in iter(lambda: proc.stdout.readline(), b""):
                log.write(chunk)
                # Progress lines to the terminal only every few seconds' worth; everything in the log.
                line = chunk.decode(errors="replace")
                if not re.match(r"#\d+\s+(NEW|REDUCE)", line):
                    sys.stdout.write(line)
            status = proc.wait()
    except OSError as e:
        status, note = 1, f"cannot run {command[0]}: {e}"
        with open(args.log, "a") as log:
            log.write(note + "\n")
    finally:
        leftovers = [os.path.join(d, n) for d, ds, fs in os.walk(tmp) for n in ds + fs]
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            os.rmdir(args.tmp_base)  # only when no other run is using it
        except OSError:
            pass
    elapsed = time.monotonic() - start

    with open(args.log, "rb") as f:
        output = f.read().decode(errors="replace")
    tail = "\n".join(output.splitlines()[-TAIL_LINES:])
    runs = re.findall(r"Done (\d+) runs in (\d+) second", output)
    stats = f"{runs[-1][0]} runs in {runs[-1][1]} s" if runs else "no final stats"

    suite = ET.Element("testsuite", name="fuzz", tests="1", failures="1" if status else "0",
                       errors="0", skipped="0", time=f"{elapsed:.1f}")
    case = ET.SubElement(suite, "testcase", classname="fuzz", name=args.name, time=f"{elapsed:.1f}")
    if status:
        failure = ET.SubElement(case, "failure",
                                message=f"{os.path.basename(command[0])} exited {status} ({stats})")
        failure.text = tail
    out = ET.SubElement(case, "system-out")
    out.text = f"{stats}; full log {args.log}\n" + ("" if status else tail[-4000:])
    os.makedirs(os.path.dirname(os.path.abspath(args.junit)), exist_ok=True)
    ET.ElementTree(suite).write(args.junit, encoding="utf-8", xml_declaration=True)

    # A crash leaves that input's tree behind (the process dies before removing it); the per-input
    # removal is otherwise checked by the harness itself.
    if leftovers and not status:
        print(f"run_fuzz: {len(leftovers)} temp entries left behind by a clean run", file=sys.stderr)
    verdict = "passed" if status == 0 else f"FAILED (exit {status})"
    print(f"run_fuzz: {args.name} {verdict}: {stats}, {elapsed:.0f} s; report {args.junit}, log {args.log}")
    return status


if __name__ == "__main__":
    sys.exit(main())
