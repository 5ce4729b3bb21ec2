# SPDX-License-Identifier: Apache-2.0
"""The loader on every kernel of the fleet: Debian 11's 5.10 and Debian 13's 6.12 in their
scenario boots (run-vm.sh --kernel K --cases vmtest.KERNEL_CASES --no-stacking --loader-cases: test_vm.py
reads the same boot). Under lockdown=confidentiality on 6.1 the loader cases run in test_vm_diskstats.py's
boot. On 5.10 the boot also plays the incident with the daemon stripped of its BPF capabilities.

tests/vm/guest-loader.sh writes loader-results.txt: per case (auto, raw_tp, hidden, pathbtf) the
daemon's exit or READY, the program type and the programs it holds (by id from its fdinfo), the task
helper their translated code calls, and its read count of 256 O_DIRECT 4 KiB reads against
the disk's /sys/block/X/stat (the NVMe disk with serial mw0001, named in loader-results.txt: disk=).
"""
import re

import pytest

from multidisk import (check_mirror_writes_raised, check_stack_counts, check_stack_quiet, check_stack_raised,
                       multi_disks)
from vmtest import (KERNEL_MULTI_PARTS, KERNELS, SCENARIOS, RunDir, case_verdict, check_late_lv_read, disks, find,
                    scenario_boot, value)

NEW_KERNELS = [k for k in KERNELS if k != "6.1"]
TRACEPOINTS = {"rq_insert": "block_rq_insert", "rq_issue": "block_rq_issue", "rq_requeue": "block_rq_requeue",
               "rq_complete": "block_rq_complete", "bio_backmerge": "block_bio_backmerge",
               "bio_frontmerge": "block_bio_frontmerge", "bio_queue": "block_bio_queue", "getrq": "block_getrq",
               "bio_remap": "block_bio_remap"}


@pytest.fixture(scope="module", params=NEW_KERNELS)
def loader(request):
    scenario_boot(request.param)
    run = SCENARIOS[request.param]
    res = run.results("loader-results.txt")
    print(res)
    return request.param, run, res


def old_layout_tracepoints(log):
    m = re.search(r'the layout before v5.11\): ([a-z_, ]+)"', log)
    return set(m.group(1).split(", ")) if m else set()


def program_variant(name):
    """(tracepoint, variant suffix: "", "_q" or "_store") of a tp_btf program as the kernel names it,
    truncated to 15 characters."""
    base = name[len("btf_"):]
    truncated = len(name) == 15
    short = max((s for s in TRACEPOINTS if base.startswith(s) or (truncated and s.startswith(base))), key=len)
    suffix = base[len(short):]
    full = next(v for v in ("", "_q", "_store") if v == suffix or (truncated and suffix and v.startswith(suffix)))
    return TRACEPOINTS[short], full


def test_the_loader_picks_per_tracepoint_the_variant_of_its_prototype(loader):
    """Per tracepoint the argument layout of its prototype; for the two that claim in-flight slots, the
    compare-and-exchange program where the verifier takes one (v5.12+) and the plain-store one (_store) on 5.10."""
    kernel, run, res = loader
    assert res["auto.exit"] == "running" and res["auto.mode"] == "tp_btf", res
    programs = res["auto.programs"].split(",")
    log = run.read("loader-auto.log")
    old = old_layout_tracepoints(log)
    chosen = dict(program_variant(name) for name in programs)
    assert set(chosen) == set(TRACEPOINTS.values()) and len(programs) == len(chosen), programs
    assert {tp for tp, v in chosen.items() if v == "_q"} == old, (programs, old)
    store = {tp for tp, v in chosen.items() if v == "_store"}
    no_compare_exchange = "has no compare-and-exchange" in log
    assert no_compare_exchange == (kernel == "5.10"), kernel
    if kernel == "5.10":
        # Measured on 5.10.262: Debian backported the request tracepoints' new layout, not the bio ones.
        assert old == {"block_bio_backmerge", "block_bio_frontmerge", "block_bio_queue", "block_getrq",
                       "block_bio_remap"}, old
        assert store == {"block_rq_insert", "block_rq_issue"}, programs
    else:
        assert old == set(), old
        assert store == set(), programs


def test_the_task_helper_follows_the_kernel(loader):
    """5.10 has no bpf_get_current_task_btf (v5.11): the programs call bpf_get_current_task; 6.12 the
    typed one. Both tp_btf."""
    kernel, run, res = loader
    fallback = "kernel BTF has no bpf_get_current_task_btf" in run.read("loader-auto.log")
    assert fallback == (kernel == "5.10")
    if fallback:
        assert int(res["auto.calls_task"]) > 0 and res["auto.calls_task_btf"] == "0", res
    else:
        assert int(res["auto.calls_task_btf"]) > 0 and res["auto.calls_task"] == "0", res


@pytest.mark.parametrize("case", ["auto", "raw_tp"])
def test_request_counts_equal_the_disk_stat_in_both_program_types(loader, case):
    kernel, run, res = loader
    assert res[f"{case}.exit"] == "running", res
    assert res[f"{case}.mode"] == ("tp_btf" if case == "auto" else "raw_tp"), res
    assert int(res[f"{case}.stat_reads"]) >= 256, res
    assert res[f"{case}.metric_reads"] == res[f"{case}.stat_reads"], res
    assert res[f"{case}.stop_exit"] == "0", res


@pytest.mark.parametrize("case", ["auto", "raw_tp"])
def test_reads_under_none_are_timed_by_the_request_clock(loader, case):
    """256 direct 4 KiB reads with the disk under none (guest-loader.sh sets it around them): timed by the request
    clock (bpf/request_clock.bpf.h), never the in-flight table. Before v6.9 the block layer caches no clock in the
    plug, so every stamp is exact and the kernel's stamp times nearly all (the queue keeps QUEUE_FLAG_STATS: wbt,
    and blk-throttle at registration on 5.10); 5.10's BTF has no enumerator for the bits, so the loader says it
    takes the #defines' values. The share per kernel is printed for docs/kernels.md."""
    kernel, run, res = loader
    clocks = {c: int(res[f"{case}.timed_{c}"]) for c in ("kernel_stamp", "dispatch_clock", "inflight_table")}
    reads = int(res[f"{case}.metric_reads"])
    print(f"{kernel} {case} (disk under {res[f'{case}.scheduler']} otherwise): {reads} reads timed by {clocks}")
    assert clocks["inflight_table"] == 0, (clocks, res)
    assert 0.99 * reads <= sum(clocks.values()) <= reads, (clocks, reads)
    if kernel == "5.10":
        assert clocks["kernel_stamp"] >= 0.9 * reads, (clocks, reads)
        assert res[f"{case}.request_clock_log"] == "1", res
    else:
        assert res[f"{case}.request_clock_log"] == "0", res


def test_path_btf_with_the_kernels_file_hidden(loader):
    """/sys/kernel/btf/vmlinux hidden by an empty bind mount: the default fails (exit 3); --path.btf naming a
    copy loads and counts. The copy has BPF_FUNC_get_current_task_btf renamed where the kernel has it
    (6.12): the loader's log says the helper is missing, which only the file can have told it. libbpf
    cannot find the running kernel's BTF for the tp_btf attach targets then, so the programs are raw_tp,
    whose CO-RE relocations read the file (no other BTF file is there for libbpf to find)."""
    kernel, run, res = loader
    assert res["hidden_size"] == "0", res
    assert res["hidden.exit"] == "3" and "cannot read kernel BTF" in res["hidden.error"], res
    assert res["pathbtf.exit"] == "running", res
    assert res["pathbtf.mode"] == "raw_tp", res
    assert res["pathbtf.other_btf_files"] == "0", res
    assert res["pathbtf.metric_reads"] == res["pathbtf.stat_reads"], res
    assert int(res["pathbtf.stat_reads"]) >= 256, res
    if kernel != "5.10":
        assert res["pathbtf.read_from_file"] == "1", res


@pytest.fixture(scope="module")
def run_5_10():
    if "5.10" not in KERNELS:
        pytest.fail("MW_VM_KERNELS leaves out 5.10")
    scenario_boot("5.10")
    return SCENARIOS["5.10"]


def test_without_bpf_capabilities_5_10_falls_back_to_diskstats_and_pages(run_5_10):
    """The diskstats fallback on Debian 11's 5.10: --source=auto, bpf() refused for want of the capabilities: the daemon runs
    on diskstats, says why, and pages the snapshot incident (nomerges=2)."""
    source, collapse, log, settled, reads, disk = case_verdict(run_5_10, "nocap-snap-nm2")
    print(f"5.10 nocap-snap-nm2: source {source}, collapse {collapse}, {disk} reads {reads}")
    assert source["source"] == "diskstats" and source["evidence"] == "reduced", source
    assert source["reason"].startswith("not privileged to load BPF"), source
    assert "BPF cannot run" in log and "not tried again" in log, log[-3000:]
    snapshot = next(dict(k)["device"] for k in find(settled, "mergewatch_device_info", dm_name="vg0-snap"))
    assert collapse == {snapshot: 1.0}, collapse
    assert f"merge collapse on {disk} (under {snapshot})" in log, log[-3000:]
    assert f"echo 0 > /sys/block/{disk}/queue/nomerges" in log


def test_without_bpf_capabilities_5_10_stays_quiet_at_nomerges_0(run_5_10):
    source, collapse, log, settled, reads, disk = case_verdict(run_5_10, "nocap-snap-nm0")
    assert source["source"] == "diskstats", source
    assert set(collapse.values()) <= {0.0}, collapse
    assert "merge collapse on" not in log
    assert reads > 0  # the quiet is not an idle disk


@pytest.fixture(scope="module", params=NEW_KERNELS)
def stacking(request):
    """guest-stacking.sh in the kernel's scenario boot: its single-disk parts and the multi-disk stacks of
    vmtest.KERNEL_MULTI_PARTS (every stack runs on 6.1, test_vm_stacking.py)."""
    scenario_boot(request.param)
    run = SCENARIOS[request.param]
    st = RunDir(run.file("stacking"))
    res = st.results()
    print(request.param, res)
    assert "failed" not in res, f"guest-stacking.sh failed on {request.param}: {res['failed']}"
    assert res.get("done") == "1", res
    return request.param, run, st, res


def test_block_bio_queue_follows_an_lv_created_and_removed_after_start(stacking):
    """Stacking decided at run time on this kernel: no dm device at start, block_bio_queue not attached; an LV
    created after the daemons started attaches it at a rescan, its removal detaches it; its 64 direct 256 KiB
    reads counted at the LV (bios) and at the disk (requests, remapped from the LV) as /sys/block/X/stat counts."""
    kernel, run, st, res = stacking
    assert (res["bio_queue_before_lvm"], res["bio_queue_after_lvcreate"], res["bio_queue_after_lvremove"]) == \
        ("0", "1", "0"), res
    check_late_lv_read(st, res["late_device"], disks(run)["disk"])


def test_md_raid0_pages_under_require_upper_any_and_not_under_the_default(stacking):
    """md RAID0 (4 KiB chunks) on the disk, nomerges=2, buffered reads: the daemon with
    --collapse.require-upper=any raises collapse{upper=md0}; the one with the default (dm) does not."""
    kernel, run, st, res = stacking
    disk = disks(run)["disk"]
    assert res["md_level"] == "raid0" and res["md_chunk_bytes"] == "4096", res
    anyp, dmp = st.samples("md-any.prom"), st.samples("md-dm.prom")
    print(f"{kernel}: collapse{{upper=md0}} raised after {res['md_any_raised_seconds']} s")
    assert value(anyp, "mergewatch_merge_collapse", device=disk, upper="md0") == 1
    assert value(anyp, "mergewatch_collapse_small_request_ratio", device=disk, upper="md0") >= 0.99
    raised = {dict(k).get("upper"): v for k, v in find(dmp, "mergewatch_merge_collapse", device=disk).items()}
    assert raised and not any(raised.values()), raised
    assert res["daemon_exit_0"] == "0" and res["daemon_exit_1"] == "0", res


# --- Several disks under one upper device on this kernel (vmtest.KERNEL_MULTI_PARTS, multidisk.py) ---------------

def test_multi_disk_stacks_are_what_the_cases_claim(stacking):
    """md RAID0 with 4 KiB chunks and md RAID1, each over both NVMe disks."""
    kernel, run, st, res = stacking
    assert KERNEL_MULTI_PARTS.split() == ["md", "raid1w"], KERNEL_MULTI_PARTS
    disks_ = multi_disks(res)
    assert res["md1_level"] == "raid0" and res["md1_chunk_bytes"] == "4096", res
    assert res["md4_level"] == "raid1", res
    for md in ("md1", "md4"):
        assert sorted(res[f"{md}_members"].split(",")) == sorted(disks_), (md, res)
    for stack in ("md", "raid1w"):
        assert res[f"{stack}_upper"].startswith("dm-"), (stack, res)
    print(kernel, {k: v for k, v in res.items() if k.startswith("multi_") and k.endswith("_seconds")})
    assert res["daemon_exit_multi"] == "0", res


def test_multi_disk_snapshot_pages_for_each_disk_under_the_snapshot(stacking):
    """nomerges=2 on both disks under the snapshot over md RAID0: each disk's (disk, snapshot) pair raised,
    with the evidence and the remedy (multidisk.check_stack_raised)."""
    kernel, run, st, res = stacking
    check_stack_raised(st, res, "md")


@pytest.mark.parametrize("stack", ["md", "raid1w"])
def test_multi_disk_stacks_with_merging_on_stay_quiet(stacking, stack):
    """nomerges=0, the same load: nothing raised, the pieces merged (multidisk.check_stack_quiet)."""
    kernel, run, st, res = stacking
    check_stack_quiet(st, res, stack)


@pytest.mark.parametrize("nomerges", [0, 2])
def test_multi_disk_counts_equal_diskstats(stacking, nomerges):
    """A bounded read of the md RAID0 snapshot counted on each disk as /sys/block/X/stat counts it
    (multidisk.check_stack_counts)."""
    kernel, run, st, res = stacking
    check_stack_counts(st, res, "md", nomerges)


def test_multi_disk_origin_writes_over_raid1_page_on_both_members(stacking):
    """Writes to a snapshot's origin over md RAID1, nomerges=2: each member's (disk, origin) pair raised
    (multidisk.check_mirror_writes_raised)."""
    kernel, run, st, res = stacking
    check_mirror_writes_raised(st, res, "raid1w")
