# SPDX-License-Identifier: Apache-2.0
"""The page where BPF cannot run, on Debian's 6.1 in qemu: one boot with lockdown=confidentiality
on the kernel command line (run-vm.sh --append), the daemon at its defaults (--source=auto), playing the
incident (snapshot on NVMe, nomerges=2), its nomerges=0 twin and the healthy origin read; then the same three
with the daemon stripped of CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (guest-scenario.sh's nocap-* cases, setpriv),
where auto must fall back to diskstats. The same boot records what the dm devices' own diskstats show on 6.1,
which the reduced condition is built on (docs/detector.md, "Without BPF"), and, after the cases, the loader cases
(guest-loader.sh) with --source=bpf: what lockdown refuses and the exit the daemon gives."""
import os
import re

import pytest

from vmtest import DAEMON, VMDIR, RunDir, await_boot, boot, disks, find, get, register_boot

RUN = RunDir(os.path.join(VMDIR, "test-run-diskstats"))
DISK = None  # the scenario's disk, found by its serial in the guest (vmtest.disks): set by lockdown_run
CASES = ["snap-nm2:2:seq:snap", "snap-nm0:0:seq:snap", "origin-nm2:2:seq:origin",
         "nocap-snap-nm2:2:seq:snap", "nocap-snap-nm0:0:seq:snap", "nocap-origin-nm2:2:seq:origin"]


# 253 s in the clean-clone make test of 2026-11-28 (vmtest.register_boot).
register_boot("diskstats", 253, lambda: boot(
    RUN, "--daemon", DAEMON, "--daemon-args", "--web.listen-address=127.0.0.1:9863", "--metrics-url",
    "http://127.0.0.1:9863/metrics", "--append", "lockdown=confidentiality", "--cases", " ".join(CASES),
    "--no-stacking", "--loader-cases", timeout=1500))


@pytest.fixture(scope="module")
def lockdown_run():
    global DISK
    out = await_boot("diskstats")
    DISK = disks(RUN)["disk"]
    return out


class Case:
    def __init__(self, name):
        p = f"case-{name}"
        self.before, self.after = (RUN.samples(f"{p}.{x}.prom") for x in ("before", "after"))
        self.settled = RUN.samples(f"{p}.settled.prom") if RUN.exists(f"{p}.settled.prom") else self.after
        self.log = RUN.read(f"{p}.daemon.log")
        self.stat = {}
        for line in RUN.read(f"{p}.diskstats").splitlines():
            fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
            self.stat[fields["dev"]] = fields

    def collapse(self):
        return {dict(k)["upper"]: v for k, v in find(self.settled, "mergewatch_merge_collapse", device=DISK).items()}

    def source(self):
        (labels,) = find(self.settled, "mergewatch_detection_info").keys()
        return dict(labels)

    def dm_device(self, dm_name):
        for labels in find(self.settled, "mergewatch_device_info", dm_name=dm_name):
            return dict(labels)["device"]
        raise AssertionError(f"no dm device named {dm_name}")

    def delta(self, name, **labels):
        return get(self.after, name, **labels) - get(self.before, name, **labels)


def test_the_guest_booted_with_lockdown_confidentiality(lockdown_run):
    assert "[confidentiality]" in RUN.read("lockdown.txt"), RUN.read("lockdown.txt")


@pytest.mark.parametrize("prefix", ["", "nocap-"])
def test_the_snapshot_incident_pages_without_bpf_or_under_lockdown(lockdown_run, prefix):
    c = Case(prefix + "snap-nm2")
    source = c.source()
    print(f"{prefix}snap-nm2: source {source}")
    if not prefix:
        # Measured on 6.1: under lockdown=confidentiality the verifier refuses the programs in both modes
        # (EINVAL: the kernel-read helpers are withheld), the loader says it is the lockdown (ProbeError::kLockdown,
        # the loader cases), and auto runs on diskstats with that reason.
        assert source["source"] == "diskstats" and source["evidence"] == "reduced", source
        assert source["reason"].startswith("kernel lockdown (confidentiality) refuses BPF reads"), source
        assert "BPF cannot run" in c.log and "not tried again" in c.log
    else:
        # Stripped of the capabilities, auto falls back to diskstats and says why.
        assert source["source"] == "diskstats" and source["evidence"] == "reduced", source
        assert source["reason"].startswith("not privileged to load BPF"), source
        assert "BPF cannot run" in c.log and "not tried again" in c.log
        assert "diskstats: reduced evidence" in c.log
    snapshot = c.dm_device("vg0-snap")
    assert c.collapse() == {snapshot: 1.0}, c.collapse()
    assert f"merge collapse on {DISK} (under {snapshot})" in c.log, c.log
    assert f"echo 0 > /sys/block/{DISK}/queue/nomerges" in c.log


@pytest.mark.parametrize("case", ["snap-nm0", "origin-nm2", "nocap-snap-nm0", "nocap-origin-nm2"])
def test_nomerges_0_and_the_healthy_origin_stay_quiet(lockdown_run, case):
    c = Case(case)
    if case.startswith("nocap-"):
        assert c.source()["source"] == "diskstats", c.source()
    assert set(c.collapse().values()) <= {0.0}, c.collapse()
    assert "merge collapse on" not in c.log
    # The reads reached the disk (the quiet is not an idle disk).
    assert int(c.stat[DISK]["reads"]) > 0, c.stat


def test_diskstats_counts_equal_the_guests_sys_block_stat(lockdown_run):
    c = Case("nocap-snap-nm2")
    reads = c.delta("mergewatch_request_size_bytes_count", device=DISK, op="read")
    sectors = c.delta("mergewatch_request_size_bytes_sum", device=DISK, op="read") / 512
    # The stat delta brackets the read only; the scrapes bracket the daemon's start to its settle: at least it.
    assert reads >= int(c.stat[DISK]["reads"]) > 0, (reads, c.stat[DISK])
    assert sectors >= int(c.stat[DISK]["rd_sectors"]), (sectors, c.stat[DISK])


def test_what_dm_diskstats_show_on_6_1(lockdown_run):
    """The measurement the reduced condition rests on: on 6.1 the snapshot's own stat counts the 4 KiB pieces it
    split its bios into (as many reads as the disk at nomerges=2, 8 sectors each), not the bios it received;
    at nomerges=0 the disk merges them back (few large reads, many merges) while the snapshot still counts pieces."""
    nm2, nm0 = Case("nocap-snap-nm2"), Case("nocap-snap-nm0")
    snapshot = nm2.dm_device("vg0-snap")
    for name, c in (("nomerges=2", nm2), ("nomerges=0", nm0)):
        print(f"{name}: " + "; ".join(f"{d} reads={s['reads']} rd_merges={s['rd_merges']} "
                                      f"avg_rd_sectors={s['avg_rd_sectors']}" for d, s in sorted(c.stat.items())))
    assert float(nm2.stat[snapshot]["avg_rd_sectors"]) == 8.0, nm2.stat[snapshot]
    assert float(nm2.stat[DISK]["avg_rd_sectors"]) == 8.0 and int(nm2.stat[DISK]["rd_merges"]) == 0, nm2.stat[DISK]
    assert float(nm0.stat[snapshot]["avg_rd_sectors"]) == 8.0, nm0.stat[snapshot]
    assert float(nm0.stat[DISK]["avg_rd_sectors"]) >= 256 and int(nm0.stat[DISK]["rd_merges"]) > 0, nm0.stat[DISK]


def test_confidentiality_lockdown_fails_fast_with_its_own_reason(lockdown_run):
    """--source=bpf under lockdown=confidentiality (guest-loader.sh in the same boot): both program sets are
    refused, the kernel withholds bpf_probe_read_kernel (and bpf_probe_read, to which libbpf falls back when
    its own feature probe is refused) from every program. The daemon exits 6 with the reason (auto runs on
    diskstats instead: above)."""
    res = RUN.results("loader-results.txt")
    print(res)
    assert res["lockdown"] == "none integrity [confidentiality]", res
    for case in ("auto", "raw_tp"):
        assert res[f"{case}.exit"] == "6", res
        assert res[f"{case}.error"].startswith("kernel lockdown (confidentiality) refuses BPF reads"), res
    log = RUN.read("loader-auto.log")
    assert re.search(r"unknown func bpf_probe_read(_kernel)?#\d+", log), log[-2000:]
