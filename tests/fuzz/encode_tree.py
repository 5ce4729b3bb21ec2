#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Encodes sysfs fixture trees into topology_fuzz inputs (the format is described at the top of
tests/fuzz/topology_fuzz.cpp).

Usage: encode_tree.py --out-dir DIR TREE...
Writes per TREE:  seed-<name>          the tree as it is
                  seed-<name>-hostile  the tree plus dangling, absolute, looping and escaping links
                                       and ResolveDevice/parser queries
and one seed-queries file with parser edge cases. Also: encode_tree.py --decode FILE prints an
input back one entry per line (for reading crash artifacts).
"""
import argparse
import os
import sys

CANARY = "mwfuzz-canary"  # the harness's device dir next to the root
CANARY_DEV = "4094:1048574"


def escape(data: bytes) -> str:
    out = []
    for b in data:
        c = chr(b)
        if c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append("\\x%02x" % b)
    return "".join(out)


def encode_tree(root):
    """Entries in a stable order: parents before children, names sorted."""
    lines = []
    devs = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        # os.walk lists symlinks to dirs among dirnames; they are links here, not dirs.
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = rel_dir + name
            if os.path.islink(full):
                lines.append(f"l {rel}\t{os.readlink(full)}")
            elif os.path.isdir(full):
                lines.append(f"d {rel}")
            elif os.path.isfile(full):
                with open(full, "rb") as f:
                    content = f.read()
                lines.append(f"f {rel}\t{escape(content)}")
                if name == "dev":
                    devs.append(content.decode(errors="replace").strip())
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return lines, devs


def hostile_entries(devs):
    lines = [
        "l block/fz-dangling\t../devices/virtual/block/not-there",
        "l block/fz-loop-a\tfz-loop-b",
        "l block/fz-loop-b\tfz-loop-a",
        "l block/fz-self\t.",
        "l block/fz-abs\t/sys/block/sda",
        "a block/fz-abs-canary",
        "l block/fz-escape\t../../" + CANARY,
        "l block/fz-escape-deep\t../../../../../../../../../../..",
        f"l dev/block/{CANARY_DEV}\t../../../{CANARY}",
        "l dev/block/4095:1048575\t../../..",
        "d devices/virtual/block/fz0",
        "f devices/virtual/block/fz0/dev\t 7:1048575 \\n",
        "l devices/virtual/block/fz0/queue\t../../../../devices/virtual/block/fz0",
        "f devices/virtual/block/fz0/diskseq\t18446744073709551616",
        "d devices/virtual/block/fz0/dm",
        "f devices/virtual/block/fz0/dm/name\tvg--a-lv--b-real",
        "f devices/virtual/block/fz0/dm/uuid\tLVM-" + "a" * 64 + "-cow",
        "l devices/virtual/block/fz0/slaves/fz0\t../../fz0",
        "l devices/virtual/block/fz0/holders/fz0\t../../fz0",
        "d devices/virtual/block/fz0/fz0p1",
        "f devices/virtual/block/fz0/fz0p1/partition\t1",
        "f devices/virtual/block/fz0/fz0p1/dev\t7:1048575",
        "l block/fz0\t../devices/virtual/block/fz0",
        f"r {CANARY_DEV}",
        "r 4095:1048575",
        "r 0:0",
    ]
    lines += [f"r {d}" for d in devs[:4]]
    return lines


QUERIES = [
    "n vg-lv\tLVM-" + "0" * 64,
    "n vg--x-lv--y-real\tLVM-" + "0" * 64 + "-real",
    "n -\tLVM-",
    "n a-b-c-d\tLVM-" + "0" * 64 + "-",
    "n vg-lv--\tLVM-" + "0" * 63,
    "s [none] mq-deadline kyber",
    "s none",
    "s [",
    "s []",
    "s ]mq-deadline[",
    "s \\x00[x\\x00]",
    "r 4095:1048575",
    "r 4096:0",
]


def decode(path):
    with open(path, "rb") as f:
        for line in f.read().split(b"\n"):
            print(line.decode(errors="backslashreplace"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir")
    ap.add_argument("--decode", metavar="FILE")
    ap.add_argument("trees", nargs="*")
    args = ap.parse_args()
    if args.decode:
        decode(args.decode)
        return 0
    if not args.out_dir or not args.trees:
        ap.error("--out-dir and at least one TREE are needed")
    os.makedirs(args.out_dir, exist_ok=True)

    def write(name, lines):
        with open(os.path.join(args.out_dir, name), "w") as f:
            f.write("\n".join(lines) + "\n")

    for tree in args.trees:
        tree = tree.rstrip("/")
        if not os.path.isdir(tree):
            print(f"encode_tree: {tree} is not a directory", file=sys.stderr)
            return 1
        name = os.path.basename(tree)
        lines, devs = encode_tree(tree)
        write(f"seed-{name}", lines)
        write(f"seed-{name}-hostile", lines + hostile_entries(devs))
    write("seed-queries", QUERIES)
    print(f"encode_tree: {2 * len(args.trees) + 1} seeds in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
