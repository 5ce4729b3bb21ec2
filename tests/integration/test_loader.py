# SPDX-License-Identifier: Apache-2.0
"""The BPF programs are loaded in a short-lived child (daemon/source/bpf_loader.cpp): the kernel's BTF,
parsed by us and by libbpf at load, never enters the daemon, so its peak RSS stays near its
steady RSS. Asserted on the mechanism, not on a machine-dependent number of MiB."""
import os
import re

import pytest

from conftest import attached_bpf_link_ids, bpf_link_ids_of

BTF = "/sys/kernel/btf/vmlinux"


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def children_of(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The name is in parentheses and may hold spaces: the fields after the last ")" are fixed.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry))
    return kids


@pytest.mark.privileged
def test_the_daemon_never_holds_the_kernel_btf(daemon):
    pid = daemon.proc.pid
    btf_bytes = os.path.getsize(BTF)
    # The loader child is gone and reaped (no zombie), and what it attached stayed attached.
    assert children_of(pid) == [], "the loader child is still there"
    attached = int(re.search(r'msg="attached (\d+) BPF programs', daemon.log_text()).group(1))
    links = bpf_link_ids_of(pid)
    assert len(links) == attached >= 7, daemon.log_text()
    assert links <= attached_bpf_link_ids()
    # One parse peaks at about twice the file above where it started (BENCHMARKS.md, "Peak RSS"):
    # a peak within one file's size of the steady RSS means no parse ever ran in this process.
    for moment in ("ready", "after a scrape"):
        if moment == "after a scrape":
            assert 'mergewatch_bpf_program_attached{tracepoint="block_rq_issue"' in daemon.scrape_text()
        hwm, rss = status_kib(pid, "VmHWM"), status_kib(pid, "VmRSS")
        assert (hwm - rss) * 1024 < btf_bytes, f"{moment}: VmHWM {hwm} KiB, VmRSS {rss} KiB, BTF {btf_bytes} B"
