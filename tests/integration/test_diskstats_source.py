# SPDX-License-Identifier: Apache-2.0
"""The diskstats source (no BPF) on real loop devices with real I/O: forced with --source=diskstats, and chosen
by --source=auto when the daemon is stripped of CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (setpriv).

Loop devices have no stacking, so as in test_collapse.py the detector is pointed at them with
--collapse.require-upper=none (upper=""): on this source the collapse is then decided from the disk's
mean request size, its merge share and the queue's nomerges=2 (docs/detector.md, "Without BPF")."""
import os
import signal
import subprocess
import time

import pytest

from conftest import absent, value, wait_until
from test_collapse import HANG, POLICY, start_fio, stop_fio, wait_for

pytestmark = pytest.mark.privileged

STRIP = ["setpriv", "--inh-caps=-bpf,-perfmon,-sys_admin", "--bounding-set=-bpf,-perfmon,-sys_admin"]
QUIET_SECONDS = 2 + 5 + 2  # raise-after + window + slack, as test_collapse.py's assert_never_raised


@pytest.fixture(params=["forced", "stripped"])
def reduced(request, daemon_factory):
    if request.param == "forced":
        d = daemon_factory("--source=diskstats", *POLICY)
    else:
        d = daemon_factory(*POLICY, wrapper=STRIP)  # --source=auto by default
        assert "BPF cannot run: not privileged to load BPF" in d.log_text(), d.log_text()
        assert "BPF is not tried again" in d.log_text()  # EPERM never passes by itself
    info = [k for k in d.scrape() if k[0] == "mergewatch_detection_info"]
    assert len(info) == 1, info
    labels = dict(info[0][1])
    assert labels["source"] == "diskstats" and labels["evidence"] == "reduced", labels
    assert "missed_merges" in labels["missing"] and "latency" in labels["missing"], labels
    assert labels["reason"] == ("--source=diskstats" if request.param == "forced" else
                                "not privileged to load BPF: run as root, or grant CAP_BPF, CAP_PERFMON (kernel 5.8+) "
                                "and CAP_SYS_RESOURCE; before 5.8 CAP_SYS_ADMIN is needed"), labels
    return d


@pytest.fixture
def forced(daemon_factory):
    return daemon_factory("--source=diskstats", *POLICY)


def test_batched_4k_reads_with_nomerges_2_page(reduced, loop_device):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=2)
    fio = start_fio(dev)
    try:
        wait_for(reduced, dev, 1)
        log = reduced.log_text()
        assert f"merge collapse on {dev.name}" in log and "diskstats: reduced evidence" in log, log
        assert f"echo 0 > /sys/block/{dev.name}/queue/nomerges" in log
        s = reduced.scrape()
        assert value(s, "mergewatch_collapse_condition", device=dev.name, upper="") == 1
        # A mean of two kernel counters read apart (sectors at each bio's completion, I/Os at the request's
        # end: blk_account_io_completion, blk_account_io_done), so not exactly 4096 when a read of diskstats
        # falls between them (CI: 4096.006); the BPF source's is exact (test_collapse.py).
        assert value(s, "mergewatch_collapse_lower_request_bytes", device=dev.name, upper="") == \
            pytest.approx(4096, rel=1e-3)
        # The counters are the kernel's since the minor's first use: no merge while collapsed, over a
        # span of 64 more batches of 64 (each would be one request with merging on). A count, not a
        # time: a loaded host takes longer to get there.
        merges = value(s, "mergewatch_bio_merges_total", device=dev.name, op="read", kind="all")
        requests = value(s, "mergewatch_request_size_bytes_count", device=dev.name, op="read")

        def more_requests():
            s = reduced.scrape()
            more = value(s, "mergewatch_request_size_bytes_count", device=dev.name, op="read") - requests
            return s if more >= 64 * 64 else None
        s = wait_until(more_requests, HANG, f"4096 more requests counted on {dev.name}", interval=0.2)
        assert value(s, "mergewatch_bio_merges_total", device=dev.name, op="read", kind="all") == merges
        # No BPF program runs: MergewatchBpfNotAttached's series say so.
        assert value(s, "mergewatch_bpf_program_attached", tracepoint="block_rq_issue", mode="none") == 0
        assert absent(s, "mergewatch_missed_merges_total", device=dev.name, op="read")
        assert absent(s, "mergewatch_request_latency_seconds_count", device=dev.name, op="read")
        # Clears when merging returns: the same requests now merge (merge share, mean size up).
        dev.set_queue(nomerges=0)
        wait_for(reduced, dev, 0)
        assert f"merge collapse cleared on {dev.name}" in reduced.log_text()
    finally:
        stop_fio(fio)


def assert_quiet(daemon, dev, fio_args):
    fio = start_fio(dev, **fio_args)
    try:
        hang = time.monotonic() + HANG
        while absent(daemon.scrape(), "mergewatch_collapse_condition", device=dev.name, upper=""):
            assert time.monotonic() < hang, f"no detector verdict for {dev.name} within {HANG} s"
            time.sleep(0.25)
        # A fixed span on purpose: nothing may page while it passes (see test_collapse.assert_never_raised).
        deadline = time.monotonic() + QUIET_SECONDS
        seen_requests = False
        while time.monotonic() < deadline:
            s = daemon.scrape()
            state = "\n".join(l for l in daemon.scrape_text().splitlines() if "collapse" in l and dev.name in l)
            assert value(s, "mergewatch_merge_collapse", device=dev.name, upper="") == 0, state
            assert value(s, "mergewatch_collapse_condition", device=dev.name, upper="") == 0, state
            seen_requests |= value(s, "mergewatch_collapse_requests_per_second", device=dev.name, upper="") > 0
            time.sleep(0.5)
        assert seen_requests, "the workload never reached the device"
        assert f"merge collapse on {dev.name}" not in daemon.log_text()
    finally:
        stop_fio(fio)


def test_batched_4k_reads_with_merging_allowed_never_page(reduced, loop_device):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=0)
    assert_quiet(reduced, dev, {})


def test_random_4k_reads_never_page(forced, loop_device):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=0)
    assert_quiet(forced, dev, dict(rw="randread", iodepth=32, batch=32, extra=("--norandommap",)))


def test_large_sequential_reads_never_page(forced, loop_device):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=2)
    max_kb = dev.cap_requests_at_one_bio()
    assert_quiet(forced, dev, dict(bs=f"{max_kb}k", iodepth=16, batch=16))


def test_random_4k_reads_with_nomerges_2_page_a_limit_of_the_source(forced, loop_device):
    """The stated limit (docs/detector.md, "Without BPF"): without BPF and without an upper device whose I/O is larger,
    small unmerged requests under nomerges=2 look the same whether they were contiguous or not.
    The BPF source stays quiet here (test_collapse.py::test_random_4k_reads_never_raise)."""
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=2)
    fio = start_fio(dev, rw="randread", iodepth=32, batch=32, extra=("--norandommap",))
    try:
        wait_for(forced, dev, 1)
    finally:
        stop_fio(fio)


def read_stat(dev):
    with open(f"/sys/block/{dev.name}/stat") as f:
        return [int(x) for x in f.read().split()]


def test_exported_counts_equal_sys_block_stat(forced, loop_device):
    dev = loop_device(size_mb=64)
    dev.set_queue(scheduler="none", nomerges=0)
    # Reads that merge and writes, then nothing: the counters stand still while they are compared.
    subprocess.run(["fio", "--name=counts", f"--filename={dev.path}", "--rw=readwrite", "--bs=4k", "--direct=1",
                    "--ioengine=libaio", "--iodepth=32", "--iodepth_batch_submit=32", "--size=8M",
                    "--output=/dev/null"], check=True, timeout=120)
    subprocess.run(["sync"], check=True)
    stat = read_stat(dev)
    s = forced.scrape()
    assert stat == read_stat(dev), "the device was not idle"
    assert stat[0] > 0 and stat[4] > 0 and stat[1] > 0, stat
    for op, (ios, merged, sectors) in {"read": stat[0:3], "write": stat[4:7]}.items():
        assert value(s, "mergewatch_request_size_bytes_count", device=dev.name, op=op) == ios
        assert value(s, "mergewatch_request_size_bytes_bucket", device=dev.name, op=op, le="+Inf") == ios
        assert value(s, "mergewatch_request_size_bytes_sum", device=dev.name, op=op) == sectors * 512
        assert value(s, "mergewatch_bio_merges_total", device=dev.name, op=op, kind="all") == merged
        # Only +Inf: diskstats has no per-request sizes, so no other bucket can be honest.
        assert absent(s, "mergewatch_request_size_bytes_bucket", device=dev.name, op=op, le="4096")
    print(f"{dev.name}: /sys/block stat {stat[:8]} equals the exported counts")


def test_source_bpf_still_exits_without_the_capabilities(loop_device):
    from conftest import DAEMON
    r = subprocess.run([*STRIP, DAEMON, "--source=bpf", "--web.listen-address=127.0.0.1:0"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 4, (r.returncode, r.stderr)
    assert "not privileged to load BPF" in r.stderr and "diskstats" not in r.stderr, r.stderr


class MemoryCgroup:
    """A memory cgroup of our own (v2 where the unified hierarchy has the memory controller, else v1) that
    the daemon is started in: a limit below the in-flight map's size makes the BPF load fail with ENOMEM
    (map memory is charged to the cgroup since 5.11), and raising it lets the load pass."""

    def __init__(self, limit_bytes):
        unified = "/sys/fs/cgroup/cgroup.controllers"
        name = f"mergewatch-test-{os.getpid()}"
        if os.path.exists(unified) and "memory" in open(unified).read().split():
            with open("/sys/fs/cgroup/cgroup.subtree_control", "w") as f:
                f.write("+memory")
            self.path, self.limit_file, self.unlimited = f"/sys/fs/cgroup/{name}", "memory.max", "max"
        elif os.path.isdir("/sys/fs/cgroup/memory"):
            self.path, self.limit_file, self.unlimited = (f"/sys/fs/cgroup/memory/{name}", "memory.limit_in_bytes",
                                                          "-1")
        else:
            pytest.fail("no memory cgroup controller (neither cgroup v2's memory nor a v1 memory hierarchy)")
        os.mkdir(self.path)
        self.set_limit(str(limit_bytes))

    def set_limit(self, value):
        with open(os.path.join(self.path, self.limit_file), "w") as f:
            f.write(value)

    def wrapper(self):
        """Puts the shell in the cgroup, then execs the daemon in its place (same PID)."""
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "mergewatchd"]

    def remove(self):
        os.rmdir(self.path)


def detection_info(daemon):
    info = [dict(k[1]) for k in daemon.scrape() if k[0] == "mergewatch_detection_info"]
    assert len(info) == 1, info
    return info[0]


def test_bpf_out_of_memory_runs_on_diskstats_and_attaches_when_memory_is_back(daemon_factory, loop_device):
    """ENOMEM is a cause that can pass: under a memory cgroup limit below the in-flight map (4M slots), the BPF
    load fails (or the OOM killer kills the loader), detection runs on diskstats and BPF is tried again at each
    topology refresh; once the limit is raised the BPF programs attach and count (histogram buckets below +Inf,
    which the diskstats source never has)."""
    cgroup = MemoryCgroup(48 << 20)
    d = None
    try:
        d = daemon_factory("--bpf.inflight-entries=4194304", "--topology.refresh-interval=1s", *POLICY,
                           wrapper=cgroup.wrapper())
        info = detection_info(d)
        assert info["source"] == "diskstats" and info["evidence"] == "reduced", info
        assert "Cannot allocate memory" in info["reason"], info
        assert "BPF is tried again in 1 s" in d.log_text(), d.log_text()  # the refresh interval
        deadline = time.monotonic() + HANG
        while d.log_text().count("BPF still cannot run") < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        log = d.log_text()
        assert log.count("BPF still cannot run") >= 2, log
        assert "not tried again" not in log, log  # an OOM-killed loader is the same cause

        cgroup.set_limit(cgroup.unlimited)
        deadline = time.monotonic() + HANG
        while detection_info(d)["source"] != "bpf" and time.monotonic() < deadline:
            time.sleep(0.5)
        info = detection_info(d)
        assert info["source"] == "bpf" and info["evidence"] == "full", (info, d.log_text())
        assert "detection runs on BPF again (full evidence)" in d.log_text()

        dev = loop_device()
        dev.set_queue(scheduler="mq-deadline", nomerges=0)
        subprocess.run(["dd", f"if={dev.path}", "of=/dev/null", "bs=4k", "count=256", "iflag=direct"], check=True,
                       capture_output=True, timeout=60)
        deadline = time.monotonic() + HANG
        small = 0
        while small < 256 and time.monotonic() < deadline:
            samples = d.scrape()
            if not absent(samples, "mergewatch_request_size_bytes_bucket", device=dev.name, op="read", le="4096"):
                small = value(samples, "mergewatch_request_size_bytes_bucket", device=dev.name, op="read", le="4096")
            time.sleep(0.5)
        # 256 direct 4 KiB reads, one at a time (nothing to merge); udev's probe of the new device may add some.
        assert small >= 256, (small, d.scrape_text())
    finally:
        if d is not None:
            d.stop()
        cgroup.remove()


def wait_for_log(d, text, seconds=30):
    wait_until(lambda: text in d.log_text(), seconds, repr(text), interval=0.2, on_timeout=lambda: d.log_text()[-2000:])


def test_a_disk_with_iostats_off_is_named_as_unseen_and_again_when_seen(forced, loop_device):
    """queue/iostats=0: the kernel keeps no statistics for the disk, so the diskstats source sees none of its
    I/O (its counters stand still under reads). Never a silent blind spot: the log names the disk and the
    remedy at the next rescan (SIGHUP here; the periodic refresh or a device event on a host), and says when
    it is seen again."""
    dev = loop_device(size_mb=64)
    dev.set_queue_attr("iostats", 0)
    forced.proc.send_signal(signal.SIGHUP)
    warning = f"iostats=0 on {dev.name}: the kernel keeps no I/O statistics for it"
    wait_for_log(forced, warning)
    assert f"echo 1 > /sys/block/{dev.name}/queue/iostats" in forced.log_text()
    before = read_stat(dev)
    subprocess.run(["dd", f"if={dev.path}", "of=/dev/null", "bs=4k", "count=256", "iflag=direct", "status=none"],
                   check=True, timeout=60)
    assert read_stat(dev) == before  # what the source would have read: nothing
    dev.set_queue_attr("iostats", 1)
    forced.proc.send_signal(signal.SIGHUP)
    wait_for_log(forced, f"iostats on {dev.name} is back, or the disk is gone: the diskstats source sees it again")
    assert forced.log_text().count(warning) == 1  # said once while it held


def test_a_runtime_nomerges_change_shows_within_seconds_and_pages(forced, loop_device):
    """Writes to queue/ send no uevent: a `nomerges=2` set while the daemon runs (a udev rule, a tuned profile,
    an operator's echo) showed only at the next --topology.refresh-interval (1 minute, the default here). Each
    device's queue settings are now read again every tick (topology/queue_watch.*): the gauge follows within 5 s,
    and on the source without BPF batched 4 KiB reads that were running on a healthy queue page within 40 s of
    the change (raise-after and window included)."""
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=0)
    def nomerges():
        samples = forced.scrape()
        return None if absent(samples, "mergewatch_queue_nomerges", device=dev.name) else \
            value(samples, "mergewatch_queue_nomerges", device=dev.name)

    wait_until(lambda: nomerges() == 0, 30, f"{dev.name} in mergewatch_queue_nomerges with 0")
    fio = start_fio(dev)
    try:
        # Merging on: the same load runs healthy first (a collapse it raised would not be the change's doing).
        wait_until(lambda: value(forced.scrape(), "mergewatch_request_size_bytes_count", device=dev.name,
                                 op="read") > 0, 30, f"reads on {dev.name} counted")
        healthy = forced.scrape()
        assert absent(healthy, "mergewatch_merge_collapse", device=dev.name) or \
            value(healthy, "mergewatch_merge_collapse", device=dev.name, upper="") == 0
        changed = time.monotonic()
        dev.set_queue(nomerges=2)
        wait_until(lambda: nomerges() == 2, 30, f"mergewatch_queue_nomerges of {dev.name} at 2")
        seen_after = time.monotonic() - changed
        wait_for(forced, dev, 1)
        paged_after = time.monotonic() - changed
    finally:
        stop_fio(fio)
    log = forced.log_text()
    print(f"nomerges=2 in the gauge after {seen_after:.1f} s, paged after {paged_after:.1f} s")
    # The log says "queue setting changed: <disk> queue/nomerges 0 -> 2" unless another rescan came first (a
    # uevent, or another disk's collapse: a rescan each second), which shows the change as well.
    assert seen_after <= 5, seen_after
    assert paged_after <= 40, paged_after
    assert f"echo 0 > /sys/block/{dev.name}/queue/nomerges" in log
