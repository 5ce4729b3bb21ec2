# SPDX-License-Identifier: Apache-2.0
"""The VM tests' shared harness: one boot helper, one run-directory reader, one results parser, one
Prometheus text parser, the last two shared with the other suites through tests/mwtest.py (tests/vm/README.md,
"Test harness").

Every test module boots the guest the same way (setup.sh, then run-vm.sh into a fresh run directory)
and re-reads what the guest left in that directory: `key=value` lines in results.txt, /metrics scrapes,
logs. The parsers here are strict: value() raises on a missing series, read() on a missing file.
"""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# The scrape readers every suite shares; `get` reads 0 for a series not there yet (deltas).
from mwtest import baseline as get, find, parse_samples as parse, value  # noqa: E402,F401

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DAEMON = os.environ.get("MERGEWATCHD", os.path.join(REPO, "build/mergewatchd"))
VMDIR = os.path.join(REPO, "build", "vm")
# run-vm.sh's own statuses (bad arguments or setup missing, qemu timed out, no status written by the guest);
# any other status of a driver run (systemd and package modes) is the number of its own checks that failed.
RUN_VM_FAILURES = (2, 124, 125)

_setup_done = set()
_setup_lock = threading.Lock()

# The guest kernels (run-vm.sh --kernel): the whole VM suite runs on 6.1; a scenario boot (incident,
# partition, multipath and, with --loader-cases, the loader cases: KERNEL_CASES) also on Debian 11's 5.10 and
# Debian 13's 6.12, one boot each. MW_VM_KERNELS="6.1" narrows it (a developer's quick run). The guest
# names every disk by its QEMU serial (6.12's NVMe controllers probe asynchronously: in the clean-clone
# make test of 2026-11-25 nvme0n1 was the partition disk, serial mwpart01) and the tests read the names
# from results.txt (disks()).
KERNELS = tuple(os.environ.get("MW_VM_KERNELS", "6.1 5.10 6.12").split())


def setup(kernel="6.1"):
    """tests/vm/setup.sh --kernel K, once per kernel and pytest session (idempotent; 1-5 s when cached)."""
    with _setup_lock:  # two slots may start boots together: one setup.sh at a time
        _setup(kernel)


def _setup(kernel):
    if kernel not in _setup_done:
        subprocess.run([os.path.join(HERE, "setup.sh"), "--kernel", kernel], check=True, timeout=900)
        _setup_done.add(kernel)


def _prepare_every_kernel():
    """setup.sh for every kernel of the session, in KERNELS order, while the first guests run: most of
    it is apt fetching and unpacking a kernel package (about 2 min for 5.10 and 6.12 from a clean clone),
    which would otherwise hold up their boots. A failure here is left to the boot's own setup() call,
    which runs setup.sh again and reports it."""
    for kernel in KERNELS:
        try:
            setup(kernel)
        except Exception:  # noqa: BLE001 - reported by the boot that needs it
            pass


def kernel_of(args):
    """The --kernel a run-vm.sh argument list names (6.1 without one)."""
    args = list(args)
    return args[args.index("--kernel") + 1] if "--kernel" in args else "6.1"


def boot(run, *args, timeout, driver=False):
    """Boots the guest once: `run-vm.sh --out RUN.path ARGS --timeout TIMEOUT` in a fresh run directory.

    A scenario run (driver=False) fails the calling fixture on any non-zero status: the scenario's own
    status. A driver run (systemd or package mode, driver=True) fails it only when run-vm.sh or the
    guest failed (RUN_VM_FAILURES) or no results.txt came back; the driver's own checks are left to
    the tests, which say which one failed. Returns run-vm.sh's stdout."""
    setup(kernel_of(args))
    subprocess.run(["rm", "-rf", run.path], check=True)
    r = subprocess.run([os.path.join(HERE, "run-vm.sh"), "--out", run.path, *args, "--timeout", str(timeout)],
                       capture_output=True, text=True, timeout=timeout + 60)
    print(r.stdout[-6000:])
    if driver:
        if r.returncode in RUN_VM_FAILURES or not run.text("results.txt"):
            pytest.fail(f"VM run in {run.path} failed ({r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
                        f"{run.diag()}", pytrace=False)
    elif r.returncode != 0:
        pytest.fail(f"VM run in {run.path} failed ({r.returncode}):\n{r.stdout[-8000:]}\n{r.stderr[-4000:]}")
    return r.stdout


# The session's boots, run MW_VM_SLOTS at a time (default 2: one guest per host CPU; most of a boot is the guest
# waiting on itself under TCG). A test module registers its boots when pytest imports it (collection, before
# any test runs) with the seconds one took in a clean-clone make test; the first test to await a boot starts
# the slots, and each slot takes the longest boot still waiting (longest first keeps both slots busy to the
# end: grouped in pairs, a slot sat idle beside the longer boot of each pair, 6-7 minutes of 31). A test
# waits for its own boot only. Every registered boot runs, whether or not a test of it was selected:
# MW_VM_KERNELS narrows the kernels of a quick run. run-vm.sh's --timeout is a hang guard, counted from the
# boot's own start, not a speed bound.
SLOTS = max(1, int(os.environ.get("MW_VM_SLOTS", "2")))
_registered = {}  # name: (seconds it took, function that boots and returns run-vm.sh's stdout)
_done = {}  # name: threading.Event, set once _outcome has its entry; a boot taken by a slot is in it
_outcome = {}  # name: (stdout, None) or (None, why the boot failed)
_slots = []  # the slot threads
_pool_lock = threading.Lock()


def register_boot(name, seconds, start):
    _registered[name] = (seconds, start)


def _run_registered(name):
    try:
        _outcome[name] = (_registered[name][1](), None)
    except BaseException as e:  # pytest.fail's Failed too: the first test to await it reports it
        _outcome[name] = (None, f"{type(e).__name__}: {e}")
    _done[name].set()


def _take_next():
    """The longest registered boot no slot has taken yet, now taken; None when there is none."""
    with _pool_lock:
        waiting = [n for n in _registered if n not in _done]
        if not waiting:
            return None
        name = max(waiting, key=lambda n: (_registered[n][0], n))
        _done[name] = threading.Event()
        return name


def _slot():
    while (name := _take_next()) is not None:
        _run_registered(name)


def await_boot(name):
    """The registered boot `name`'s run-vm.sh stdout, once per session; starts the slots first. A failed
    boot fails every test that awaits it, without a second boot."""
    while True:
        with _pool_lock:
            if not _slots:  # the session's first boot: the other kernels' set-up goes on beside the first guests
                threading.Thread(target=_prepare_every_kernel, name="setup-kernels", daemon=True).start()
            if name in _done:
                break
            # At the start, and again for a boot registered after every slot ran out of work (a kernel
            # MW_VM_KERNELS leaves out, asked for by name); a live slot takes it at its next take.
            if not any(t.is_alive() for t in _slots):
                _slots[:] = [threading.Thread(target=_slot, name=f"vm-slot-{i}") for i in range(SLOTS)]
                for t in _slots:
                    t.start()
        time.sleep(1)
    _done[name].wait()
    if _outcome[name][1] is not None:
        pytest.fail(f"this session's {name} boot failed (the first test that used it shows how):\n"
                    f"{_outcome[name][1]}")
    return _outcome[name][0]


def results(text):
    """The guest's `key=value` lines (results.txt): {key: value}; a later line wins, a line without `=` is
    not a result (none of the guest scripts writes one)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


class RunDir:
    """A run directory on the host (what run-vm.sh --out names) and the guest's files in it.

    diag, if given, is a function of this RunDir returning context for a failure (driver log, journal,
    console tail); expect() and json() append it."""

    def __init__(self, path, diag=None):
        self.path = path
        self._diag = diag

    def file(self, name):
        return os.path.join(self.path, name)

    def exists(self, name):
        return os.path.exists(self.file(name))

    def read(self, name):
        """The file's text; a missing file is an error."""
        with open(self.file(name), errors="replace") as f:
            return f.read()

    def text(self, name):
        """The file's text, "" where it does not exist (for diagnostics, and for driver files whose
        absence the tests check through the driver's own result keys)."""
        try:
            return self.read(name)
        except FileNotFoundError:
            return ""

    def tail(self, name, n, drop=None):
        lines = self.text(name).replace("\r", "").splitlines()
        if drop:
            lines = [line for line in lines if drop not in line]
        return "\n".join(lines[-n:])

    def diag(self):
        return self._diag(self) if self._diag else ""

    def expect(self, cond, what):
        if not cond:
            pytest.fail(f"{what}{self.diag()}", pytrace=False)

    def results(self, name="results.txt"):
        return results(self.read(name))

    def samples(self, name):
        return parse(self.read(name))

    def json(self, name, missing=None):
        """A JSON file the driver wrote (bpftool -j). An absent or empty file fails, unless `missing` is
        the JSON text to take instead."""
        text = self.text(name)
        try:
            return json.loads(text or missing or "")
        except ValueError:
            pytest.fail(f"{name} is not JSON: {text[:500]!r}{self.diag()}", pytrace=False)


def disks(run):
    """The disks the guest found by their serials (guest-scenario.sh writes them into results.txt, and
    guest-loader.sh its `disk` into loader-results.txt): {"disk": "nvme1n1", "part_disk": ..., "mp_head": ...,
    "mp_paths": "a,b", "sd_disk": ...}. The tests never assume a name: NVMe controllers probe
    asynchronously (Debian 13's 6.12), so nvme0n1 may be any of the guest's NVMe disks. A run without the
    names fails (KeyError on "disk")."""
    found = {k: v for k, v in run.results().items() if k in ("disk", "part_disk", "mp_head", "mp_paths", "sd_disk")}
    if not found.get("disk"):
        found["disk"] = run.results("loader-results.txt")["disk"] if run.exists("loader-results.txt") else None
    if not found.get("disk"):
        pytest.fail(f"{run.path}: the guest named no disk (no disk= line in results.txt){run.diag()}", pytrace=False)
    return found


def case_verdict(run, name):
    """What a scenario case (guest-scenario.sh) ended with: (detection_info labels, {upper: merge_collapse} of
    the scenario's disk, the daemon's log, the settled scrape, the disk's reads in the case, the disk)."""
    p, disk = f"case-{name}", disks(run)["disk"]
    settled = run.samples(f"{p}.settled.prom") if run.exists(f"{p}.settled.prom") else run.samples(f"{p}.after.prom")
    (source,) = find(settled, "mergewatch_detection_info").keys()
    collapse = {dict(k)["upper"]: v for k, v in find(settled, "mergewatch_merge_collapse", device=disk).items()}
    reads = 0
    for line in run.read(f"{p}.diskstats").splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if fields["dev"] == disk:
            reads = int(fields["reads"])
    return dict(source), collapse, run.read(f"{p}.daemon.log"), settled, reads, disk


# guest-stacking.sh's two daemons (--collapse.require-upper dm and any) both count the late LV's read.
LATE_LV_DAEMON_PORTS = (19871, 19872)


def check_late_lv_read(st, lv, disk, reads=64):
    """guest-stacking.sh's counted read of an LV created after the daemons started (`reads` direct 256 KiB
    reads, one at a time, each one request at the disk): /sys/block/DISK/stat counts them, and each daemon
    counts every bio at the LV and every request at the disk, remapped from the LV. On a short count the
    message carries what tells the causes apart: the kernel's run counts of the block_bio_queue program
    (kernel.bpf_stats_enabled during the read), runs it skipped as nested, events whose key neither a stats map
    nor its spill map took, and the daemon's attach log."""
    before, after = ([int(x) for x in st.read(f"diskstat-{n}-lv-read.txt").split()] for n in ("before", "after"))
    assert after[0] - before[0] == reads and (after[2] - before[2]) * 512 == reads * (256 << 10), (before, after)
    for port in LATE_LV_DAEMON_PORTS:
        s0, s1 = st.samples(f"lvm-before-read-{port}.prom"), st.samples(f"lvm-after-read-{port}.prom")

        def delta(name, **labels):  # lvcreate's own I/O (wipe, label scan) came before the baseline
            return get(s1, name, **labels) - get(s0, name, **labels)

        counted = {
            "bios": delta("mergewatch_bio_size_bytes_count", device=lv, op="read"),
            "bio_bytes": delta("mergewatch_bio_size_bytes_sum", device=lv, op="read"),
            "requests": delta("mergewatch_request_size_bytes_count", device=disk, op="read"),
            "remapped": delta("mergewatch_remapped_requests_total", device=disk, origin=lv, op="read"),
            "remapped_missed": delta("mergewatch_remapped_missed_merges_total", device=disk, origin=lv, op="read"),
        }
        expected = {"bios": reads, "bio_bytes": reads * (256 << 10), "requests": reads, "remapped": reads,
                    "remapped_missed": 0}
        why = {
            "bio_queue_runs": delta("mergewatch_bpf_program_runs_total", tracepoint="block_bio_queue", mode="tp_btf"),
            "program_nested": delta("mergewatch_bpf_events_dropped_total", reason="program_nested"),
            # a key neither the stats map nor its spill map took (bpf/mergewatch.bpf.c, dev_stats_spill)
            "device_map_full": delta("mergewatch_bpf_events_dropped_total", reason="device_map_full"),
            "origin_map_full": delta("mergewatch_bpf_events_dropped_total", reason="origin_map_full"),
            "log": [line for line in st.text(f"daemon-{'dm' if port == 19871 else 'any'}.log").splitlines()
                    if "block_bio_queue" in line],
        }
        assert counted == expected, f"daemon on {port}: counted {counted}, expected {expected}; {why}"


# The scenario boot's run directory per kernel (test_vm.py's scenario_run), read by test_vm.py,
# test_vm_stacking.py, test_vm_findings.py and test_vm_kernels.py. SCENARIO is 6.1's.
SCENARIOS = {k: RunDir(os.path.join(VMDIR, "test-run" if k == "6.1" else f"test-run-{k}")) for k in
             ("6.1", "5.10", "6.12")}
SCENARIO = SCENARIOS["6.1"]

# The cases of the 5.10 and 6.12 boots (the per-kernel list, nothing else: make test's budget): the
# incident on the disk (nomerges=2 pages, nomerges=0 stays quiet), LVM on an NVMe partition (8 KiB chunks),
# LVM on a native-multipath namespace (the head's count against the paths' stat). Then guest-stacking.sh's
# single-disk parts (an LV created after the daemons started: block_bio_queue attached and detached; md RAID0
# paging under require-upper=any; the multi-disk stacks of KERNEL_MULTI_PARTS) and the loader cases: request
# counts against /sys/block/X/stat in both program types, --path.btf (test_vm_kernels.py). No findings,
# random-read, origin, 16 KiB-chunk or requeue cases: those run on 6.1 only.
KERNEL_CASES = "snap-nm2:2:seq:snap snap-nm0:0:seq:snap snap8-nm2:2:seq:snap8 mp-nm2:2:seq:mpsnap"
# 5.10 also plays the incident with the daemon stripped of CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN:
# --source=auto falls back to diskstats there too and pages; nomerges=0 stays quiet. And with the release's
# daemon, default flags, inside the Debian 11 root make release made (guest-release.sh, test_vm_release.py).
KERNEL_CASES_5_10 = KERNEL_CASES + " nocap-snap-nm2:2:seq:snap nocap-snap-nm0:0:seq:snap" \
    " rel-snap-nm2:2:seq:snap rel-snap-nm0:0:seq:snap"
# make release's tarball and the pristine Debian 11 root it was tried in (make test-vm sets both, as make
# test-release does): the 5.10 boot runs them (run-vm.sh --release, --release-root).
RELEASE_TARBALL = os.environ.get("MERGEWATCH_RELEASE_TARBALL", "")
RELEASE_ROOT = os.environ.get("MERGEWATCH_RELEASE_ROOT", "")
# The multi-disk stacks of the 5.10 and 6.12 boots (run-vm.sh --nvme-disks 2 --multi-parts; every
# kernel the suite boots). The ones a kernel's plug and md code decide: a snapshot over md RAID0 with 4 KiB
# chunks (raise, quiet, reads counted against diskstats), where one plug holds requests of both disks (5.10
# looks at every request of the bio's queue in it, 6.1-6.12 at the newest only); writes to a snapshot's
# origin over md RAID1, each piece cloned to both members from md's plug callback. The striped LV with 4 KiB
# stripes (the same plug shape through dm-stripe: passed on both kernels, 46 s of each boot, 2026-11-25),
# 64 KiB chunks and stripes, the backup beside a live origin, RAID10 and fstrim add nothing a kernel decides
# differently and run on 6.1 only: make test's budget (45 min on the 2-core host).
KERNEL_MULTI_PARTS = "md raid1w"
# guest-who.sh's parts (run-vm.sh --who, test_vm_who.py) per kernel, on the boot's two extra NVMe disks at the
# end of the boot: 6.12 all (backup and LUKS backup in their cgroups, writeback with and without the io
# controller, the per-volume series: about 170 s of guest time), in a boot shorter than 5.10's and 6.1's
# (on 6.1, the longest boot, they made make test 2 minutes longer); 6.1 and 6.12
# take every path guest-who.sh goes (dm_submit_bio_remap, cgroup writeback, blkcg on the bio) alike. 5.10 the
# backup and LUKS only, where dm-crypt did not trace its clones as remaps before e5524e128f6f (v5.16): the LUKS
# reads are asserted unattributed there. 6.1 none.
WHO_FULL_KERNEL = "6.12"
WHO_PARTS = {WHO_FULL_KERNEL: "backup luks write perlv", "5.10": "backup luks"}


def scenario_args(kernel):
    """run-vm.sh's arguments for the scenario boot of `kernel` (besides --out, --timeout and the daemon)."""
    if kernel == "6.1":
        # Every case, then guest-stacking.sh (with the several-disk stack) and guest-findings.sh (the rotational
        # disks, the virtio-blk disk) in the same guest.
        return ["--part-disk", "--multipath", "--path-removal", "--rotational-disks", "2", "--virtio-blk-disks", "1",
                "--nvme-disks", "2"]
    if kernel == "5.10":
        if not (os.path.isfile(RELEASE_TARBALL) and os.path.isdir(RELEASE_ROOT)):
            pytest.fail(f"the 5.10 boot runs the release: MERGEWATCH_RELEASE_TARBALL={RELEASE_TARBALL!r} and "
                        f"MERGEWATCH_RELEASE_ROOT={RELEASE_ROOT!r} must name make release's tarball and Debian 11 "
                        "root (make test-vm builds and passes them)", pytrace=False)
        release = ["--release", RELEASE_TARBALL, "--release-root", RELEASE_ROOT]
    else:
        release = []
    # guest-stacking.sh's split part (test_vm_split.py) runs on 6.1 only: the kernel of its measurement.
    return ["--kernel", kernel, "--part-disk", "--multipath", "--cases",
            KERNEL_CASES_5_10 if kernel == "5.10" else KERNEL_CASES, "--loader-cases", "--stack-parts", "late md",
            "--nvme-disks", "2", "--multi-parts", KERNEL_MULTI_PARTS, *release,
            *(["--who", WHO_PARTS[kernel]] if kernel in WHO_PARTS else [])]


def _boot_scenario(kernel):
    return boot(SCENARIOS[kernel], "--daemon", DAEMON, "--daemon-args", "--web.listen-address=127.0.0.1:9863",
                "--metrics-url", "http://127.0.0.1:9863/metrics", *scenario_args(kernel),
                timeout=1800 if kernel == "6.1" else 2400)


# Seconds each took in the clean-clone make test of 2026-11-28 (two guests at a time): 6.1 runs every case,
# the multi-disk stacks and the findings; 5.10 and 6.12 the kernel cases and the who parts.
SCENARIO_SECONDS = {"6.1": 824, "5.10": 745, "6.12": 523}
for _kernel in KERNELS:
    register_boot(f"scenario-{_kernel}", SCENARIO_SECONDS.get(_kernel, 600), lambda k=_kernel: _boot_scenario(k))


def scenario_boot(kernel="6.1"):
    """The scenario boot of `kernel` with the project's mergewatchd in the guest, once per kernel and pytest
    session. On 6.1 (a few minutes under TCG) test_vm.py, test_vm_stacking.py and test_vm_findings.py read
    the same run (guest-scenario.sh's cases, then guest-stacking.sh and guest-findings.sh in the same guest),
    whichever asks first boots it; on 5.10 and 6.12 the boot plays KERNEL_CASES and the loader cases
    (guest-loader.sh: test_vm_kernels.py). Every boot runs in the slots of await_boot. A failed boot fails the other
    files' tests too, without a second boot. (A session fixture in a conftest.py would do the same, but a
    tests/vm/conftest.py shadows tests/integration's, whose test files import from `conftest`, when pytest
    collects both directories in one run.)"""
    if f"scenario-{kernel}" not in _registered:  # a kernel MW_VM_KERNELS leaves out, asked for by name
        register_boot(f"scenario-{kernel}", SCENARIO_SECONDS.get(kernel, 600), lambda: _boot_scenario(kernel))
    return await_boot(f"scenario-{kernel}")
