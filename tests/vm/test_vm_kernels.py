# SPDX-License-Identifier: Apache-2.0
"""The loader on every kernel of the fleet (issue 21): Debian 11's 5.10 and Debian 13's 6.12 in their
scenario boots (run-vm.sh --kernel K --loader-cases: test_vm.py and test_vm_stacking.py read the same
boot), and Debian 12's 6.1 booted once with lockdown=confidentiality.

tests/vm/guest-loader.sh writes loader-results.txt: per case (auto, raw_tp, hidden, pathbtf) the
daemon's exit or READY, the program type and the programs it holds (by id from its fdinfo), the task
helper their translated code calls, and its read count of 256 O_DIRECT 4 KiB reads against
/sys/block/nvme0n1/stat.
"""
import os
import re

import pytest

from vmtest import DAEMON, KERNELS, SCENARIOS, RunDir, VMDIR, boot, scenario_boot

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


def test_the_loader_picks_per_tracepoint_the_variant_of_its_prototype(loader):
    kernel, run, res = loader
    assert res["auto.exit"] == "running" and res["auto.mode"] == "tp_btf", res
    programs = res["auto.programs"].split(",")
    # The kernel truncates names to 15 characters: match each program to its tracepoint by prefix.
    old = old_layout_tracepoints(run.read("loader-auto.log"))
    chosen = {}
    for name in programs:
        base = name[len("btf_"):]
        q = base.endswith("_q")
        tp = next(t for short, t in TRACEPOINTS.items() if base.removesuffix("_q") == short or
                  (len(name) == 15 and short.startswith(base.removesuffix("_q"))))
        chosen[tp] = q
    assert set(chosen) == set(TRACEPOINTS.values()), programs
    assert {tp for tp, q in chosen.items() if q} == old, (programs, old)
    if kernel == "5.10":
        # Measured on 5.10.262: Debian backported the request tracepoints' new layout, not the bio ones.
        assert old == {"block_bio_backmerge", "block_bio_frontmerge", "block_bio_queue", "block_getrq",
                       "block_bio_remap"}, old
    else:
        assert old == set(), old


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


LOCKDOWN = RunDir(os.path.join(VMDIR, "test-run-lockdown"))


@pytest.fixture(scope="module")
def lockdown():
    """Debian 12's 6.1 booted with lockdown=confidentiality, the loader cases only (about 3 min)."""
    boot(LOCKDOWN, "--append", "lockdown=confidentiality", "--script",
         os.path.join(os.path.dirname(os.path.abspath(__file__)), "guest-loader.sh"), "--daemon", DAEMON,
         "--metrics-url", "http://127.0.0.1:9863/metrics", timeout=1200)
    res = LOCKDOWN.results("loader-results.txt")
    print(res)
    return res


def test_confidentiality_lockdown_fails_fast_with_its_own_reason(lockdown):
    """Both program sets are refused: the kernel withholds bpf_probe_read_kernel (and bpf_probe_read, to
    which libbpf falls back when its own feature probe is refused) from every program. The daemon exits
    6 with the reason, which the source without BPF (issue 23) maps to its fallback."""
    res = lockdown
    assert res["lockdown"] == "none integrity [confidentiality]", res
    for case in ("auto", "raw_tp"):
        assert res[f"{case}.exit"] == "6", res
        assert res[f"{case}.error"].startswith("kernel lockdown (confidentiality) refuses BPF reads"), res
    log = LOCKDOWN.read("loader-auto.log")
    assert re.search(r"unknown func bpf_probe_read(_kernel)?#\d+", log), log[-2000:]
