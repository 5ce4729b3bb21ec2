# SPDX-License-Identifier: Apache-2.0
"""The host's loop device nodes, and removing one a detach left behind: `losetup --find` adds a node when
every node is attached, and a detach leaves that node in /sys/block (a CI host collected dozens, each a device
in every daemon's scrape). Standard library only: mwtest (every suite, the VM suite's host side included) and bench/run.py (make
bench, which installs neither pytest nor prometheus_client) both import it."""
import errno
import fcntl
import os
import time

LOOP_CTL_REMOVE = 0x4C81  # linux/loop.h


def loop_nodes():
    """The loop device nodes in /sys/block, attached or not."""
    if not os.path.isdir("/sys/block"):
        return set()
    return {d for d in os.listdir("/sys/block") if d.startswith("loop")}


def remove_loop_node(name):
    """Removes the unattached loop node `name` (loopN or /dev/loopN). A node already gone is fine. The detach
    before may take a moment to let go of it, so EBUSY is retried for 5 s; a node still busy then (attached
    again by someone else) raises OSError(EBUSY), as does any other refusal, with its own errno."""
    name = os.path.basename(name)
    index = name.removeprefix("loop")
    if not index.isdigit():
        raise ValueError(f"not a loop device: {name!r}")
    for _ in range(50):
        try:
            with open("/dev/loop-control", "wb") as ctl:
                fcntl.ioctl(ctl, LOOP_CTL_REMOVE, int(index))
            return
        except OSError as e:
            if e.errno in (errno.ENODEV, errno.ENXIO, errno.ENOENT):
                return  # gone already
            if e.errno != errno.EBUSY:
                raise
            time.sleep(0.1)
    raise OSError(errno.EBUSY, f"{name} stayed busy after its detach (attached again by someone else?)")
