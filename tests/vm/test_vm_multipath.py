# SPDX-License-Identifier: Apache-2.0
"""A native NVMe multipath head's counters never go backwards while the head lives.

tests/vm/guest-multipath.sh runs at the end of guest-stacking.sh in the 6.1 scenario boot (run-vm.sh
--multipath: one subsystem, two controllers, one shared namespace): the head reads round robin over both
path disks, a scrape, one path's controller goes away (delete_controller on fabrics; on this PCIe emulation
the controller's PCI function is removed, as a hot-unplug), scrapes every half second while the daemon
forgets the path's keys, more reads through the remaining path, a scrape. Without the daemon keeping what
the departed path counted under the head (source/departed_paths.h), the head's sums dropped by that path's
share: Prometheus saw a counter reset.
"""
import os
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vmtest import SCENARIO, RunDir, scenario_boot

MPDELETE = RunDir(SCENARIO.file("mpdelete"))


@pytest.fixture(scope="module")
def run():
    """This session's 6.1 scenario boot (vmtest.scenario_boot, shared with test_vm.py and the others)."""
    scenario_boot()
    return MPDELETE


@pytest.fixture(scope="module")
def res(run):
    return results_of(run)


def results_of(run):
    results = run.results()
    print(results)
    assert "failed" not in results, f"guest-multipath.sh failed: {results['failed']}\n" + \
        "\n".join(l for l in SCENARIO.text("guest.log").splitlines() if "mpdelete" in l)[-3000:]
    assert results.get("done") == "1", results
    return results


def scrapes(run, res):
    """[(file name, {(sample name, labels): value} of every counter and histogram sample)] in scrape order."""
    out = []
    for i in range(1, int(res["scrapes"]) + 1):
        names = [n for n in os.listdir(run.path) if n.startswith(f"scrape-{i:02d}-")]
        assert len(names) == 1, (i, names)
        counters = {}
        for family in text_string_to_metric_families(run.read(names[0])):
            if family.type not in ("counter", "histogram"):
                continue
            for s in family.samples:
                if not s.name.endswith("_created"):
                    counters[(s.name, frozenset(s.labels.items()))] = s.value
        out.append((names[0], counters))
    return out


def head_reads(counters, head):
    return counters[("mergewatch_request_size_bytes_count", frozenset({"device": head, "op": "read"}.items()))]


def stat_reads(run, name):
    return int(run.read(name).split()[0])


def test_a_path_went_away_and_the_daemon_forgot_its_keys(run, res):
    """The case is what it claims: two paths, one gone with its controller, the head alive, and the daemon
    dropped the path's keys (debug log) and kept what they counted under the head (info log)."""
    assert res["iopolicy"] == "round-robin", res
    subsystem, namespace = re.fullmatch(r"nvme(\d+)n(\d+)", res["head"]).groups()
    for path in (res["victim"], res["survivor"]):  # nvme<S>c<C>n<N> of head nvme<S>n<N>
        assert re.fullmatch(rf"nvme{subsystem}c\d+n{namespace}", path), res
    assert res["victim"] != res["survivor"], res
    assert res["method"].split()[0] in ("delete_controller", "pci_remove"), res
    assert int(res["dropped"]) >= 1 and int(res["carried"]) >= 1, res
    log = run.read("daemon.log")
    assert "a multipath path disk went away" in log, log[-3000:]
    assert res["daemon_exit"] == "0", res
    # Both paths did I/O before the deletion (round robin), so the departed one's share is not nothing.
    before = {p: stat_reads(run, f"stat-{p}-before-delete.txt") for p in (res["victim"], res["survivor"])}
    assert all(v > 0 for v in before.values()), before


def test_every_counter_is_monotonic_across_a_path_deletion(run, res):
    """Every counter and histogram series of every device, in every scrape from before the deletion to
    after the reads that followed: never lower than in the scrape before, and never gone while the device
    lives (the head's series stay)."""
    seq = scrapes(run, res)
    assert len(seq) >= 8, [n for n, _ in seq]
    head = res["head"]
    compared = 0
    for (was_name, was), (now_name, now) in zip(seq, seq[1:]):
        for key, v in was.items():
            if key not in now:
                assert dict(key[1]).get("device") != head, f"{key} of the head gone in {now_name}"
                continue
            assert now[key] >= v, f"{key[0]}{dict(key[1])}: {v} in {was_name}, {now[key]} in {now_name}"
            compared += 1
    head_series = [k for k in seq[0][1] if dict(k[1]).get("device") == head]
    assert len(head_series) > 20 and compared > 100, (len(head_series), compared)


def test_the_head_counts_the_remaining_paths_requests_after_the_deletion(run, res):
    """The head's read requests: nothing lost at the deletion (the scrape after the forget shows at least
    what the one before did), and the reads after it are counted exactly: the head's count grew by the
    reads the remaining path's /sys/block stat added."""
    seq = scrapes(run, res)
    head = res["head"]
    before_delete = float(res["head_reads_before_delete"])
    after_forget = float(res["head_reads_after_forget"])
    after_read = float(res["head_reads_after_read"])
    assert head_reads(seq[0][1], head) == before_delete > 0
    assert after_forget >= before_delete, (before_delete, after_forget)
    added = stat_reads(run, "stat-survivor-after-read.txt") - stat_reads(run, "stat-survivor-before-read.txt")
    assert added == 64, added  # 64 direct 64 KiB reads, each one request (max_sectors_kb >= 64)
    assert after_read - after_forget == added, (after_forget, after_read, added)
