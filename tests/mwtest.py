"""Helpers shared by the privileged suites (tests/integration, tests/deploy): free ports, RAM-backed
loop devices, the BPF links a process holds. Each suite's conftest imports them from here."""
import json
import os
import socket
import subprocess
import tempfile

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopDevice:
    """A loop device over a file in /dev/shm (RAM); detached and its file removed by detach()."""

    def __init__(self, size_mb=64):
        fd, self.backing = tempfile.mkstemp(prefix="mergewatch-", suffix=".img", dir="/dev/shm")
        try:
            os.ftruncate(fd, size_mb << 20)
        finally:
            os.close(fd)
        try:
            self.path = subprocess.run(["losetup", "--find", "--show", self.backing], capture_output=True,
                                       text=True, check=True, timeout=30).stdout.strip()
        except Exception:
            os.unlink(self.backing)
            raise
        self.name = os.path.basename(self.path)
        self.size_mb = size_mb
        self.saved_queue = {}

    def set_queue_attr(self, attr, value):
        """Writes queue/<attr>; the first value seen is written back at detach: a loop minor keeps its
        queue settings across detach, and the next user of the minor (another test, another
        engineer's run on the same host) must not inherit them."""
        path = f"/sys/block/{self.name}/queue/{attr}"
        if attr not in self.saved_queue:
            with open(path) as f:
                current = f.read().strip()
            if attr == "scheduler":  # "[none] mq-deadline": the active one is bracketed
                current = current.split("[", 1)[1].split("]", 1)[0]
            self.saved_queue[attr] = current
        with open(path, "w") as f:
            f.write(str(value))

    def set_queue(self, scheduler=None, nomerges=None):
        if scheduler is not None:
            self.set_queue_attr("scheduler", scheduler)
        if nomerges is not None:
            self.set_queue_attr("nomerges", nomerges)

    def stat(self):
        """(reads completed, reads merged) from /sys/block/X/stat."""
        with open(f"/sys/block/{self.name}/stat") as f:
            fields = [int(x) for x in f.read().split()]
        return fields[0], fields[1]

    def detach(self):
        for attr, value in self.saved_queue.items():
            try:
                with open(f"/sys/block/{self.name}/queue/{attr}", "w") as f:
                    f.write(value)
            except OSError:
                pass  # restoring is best effort; detaching must still happen
        subprocess.run(["losetup", "-d", self.path], check=False, timeout=30)
        if os.path.exists(self.backing):
            os.unlink(self.backing)


@pytest.fixture
def loop_device():
    """loop_device(size_mb=...) makes a LoopDevice; all are detached at teardown."""
    made = []

    def make(**kw):
        dev = LoopDevice(**kw)
        made.append(dev)
        return dev

    yield make
    for dev in made:
        dev.detach()


def bpf_link_ids_of(pid):
    """IDs of the BPF links a process holds, from the fdinfo of its file descriptors."""
    ids = set()
    fd_dir = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fd_dir):
        try:
            with open(os.path.join(fd_dir, fd)) as f:
                for line in f:
                    if line.startswith("link_id:"):
                        ids.add(int(line.split()[1]))
        except OSError:  # the fd was closed meanwhile
            continue
    return ids


def attached_bpf_link_ids():
    """IDs of every BPF link attached on the machine (bpftool)."""
    out = subprocess.run(["bpftool", "-j", "link", "show"], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    return {link["id"] for link in json.loads(out or "[]")}
