# SPDX-License-Identifier: Apache-2.0
"""Reliability under churn, pressure, load and bad input: nothing crashes, nothing leaks, every
failure says what to do. Real daemon, real loop devices, real I/O."""
import http.client
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import absent, baseline, fio, parse_samples, rss_kib, undone_dispatches, value, wait_until

pytestmark = pytest.mark.privileged

SIZE = "mergewatch_request_size_bytes"
LATENCY = "mergewatch_request_latency_seconds"
LOST = "mergewatch_request_latency_lost_total"


def direct_reads(path, count):
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4k", f"count={count}", "iflag=direct"],
                   check=True, capture_output=True, timeout=30)


def reads_completed(name):
    with open(f"/sys/block/{name}/stat") as f:
        return int(f.read().split()[0])


def test_device_churn_reuses_minors_without_carrying_old_data(daemon_factory, tmp_path):
    """200 attach/read/detach cycles of loop devices (the kernel hands the same minors out again)
    while /metrics is scraped: the daemon survives, each new incarnation of a minor starts from
    zero and agrees with diskstats, a detached device's request series disappear, memory is flat."""
    d = daemon_factory("--topology.refresh-interval=1s")
    stop = threading.Event()
    scrape_failures = []

    def scraper():
        while not stop.is_set():
            try:
                parse_samples(d.scrape_text())
            except Exception as e:  # a parse error or a dead daemon
                scrape_failures.append(repr(e))
            time.sleep(0.05)  # pacing the background scraper, not a wait for anything

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    names_seen = {}
    rss_warm = None
    try:
        for cycle in range(200):
            backing = tmp_path / f"churn-{cycle}.img"
            with open(backing, "wb") as f:
                f.truncate(4 << 20)
            path = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True,
                                  check=True).stdout.strip()
            name = os.path.basename(path)
            names_seen[name] = names_seen.get(name, 0) + 1
            try:
                before = reads_completed(name)
                reads = 8 + cycle % 8
                direct_reads(path, reads)
                s = d.scrape()
                counted = value(s, SIZE + "_count", device=name, op="read")
                # This incarnation's own reads only, never its predecessor's at the same minor
                # (the disk's diskstats do carry them: they survive detach).
                assert counted == reads_completed(name) - before == reads, (cycle, name, counted, reads)
            finally:
                subprocess.run(["losetup", "-d", path], check=True)
                os.unlink(backing)
            s = d.scrape()
            assert absent(s, SIZE + "_count", device=name), (cycle, name, "series of a detached device")
            assert d.proc.poll() is None, d.log_text()
            if cycle == 30:
                rss_warm = rss_kib(d.proc.pid)
        rss_end = rss_kib(d.proc.pid)
    finally:
        stop.set()
        thread.join(timeout=10)
    reused = max(names_seen.values())
    assert reused >= 10, f"minors were not reused: {names_seen}"
    assert not scrape_failures, scrape_failures[:5]
    # Per-device state is dropped with the device: 170 more cycles must not add to the heap.
    # 2 MiB is far below what 170 leaked device entries (topology, names, map snapshot) would cost
    # with any per-cycle leak of 12 KiB or more, and above allocator noise.
    assert rss_end - rss_warm < 2048, f"RSS grew from {rss_warm} KiB to {rss_end} KiB over 170 cycles"
    s = d.scrape()
    assert value(s, "mergewatch_unresolved_devices") <= 1, "stale map keys were not dropped"
    assert d.stop() == 0


def test_inflight_overflow_is_counted_and_the_rest_stays_right(daemon_factory, loop_device):
    """A 64-slot in-flight table under 2 x 128 requests in flight: the overflow is exported, sizes
    still match diskstats, and once the pressure is gone every request is timed again. The in-flight
    table's own overflow: pinned to it (the default times a queue without a scheduler without it)."""
    d = daemon_factory("--bpf.inflight-entries=64", "--bpf.request-clock=table")
    dev = loop_device(size_mb=128)
    dev.set_queue(scheduler="none", nomerges=0)
    reads_before = dev.stat()[0]  # a loop disk's diskstats survive detach: compare deltas
    fio(dev, rw="randread", iodepth=128, batch=32, size_mb=64, extra=("--numjobs=2",))
    s = d.scrape()
    labels = dict(device=dev.name, op="read")
    requests = value(s, SIZE + "_count", **labels)
    assert requests == dev.stat()[0] - reads_before        # sizes are not touched by the overflow
    timed = value(s, LATENCY + "_count", **labels)
    untimed = requests - timed
    # This device's own lost samples (a fresh device: no baseline): no slot at dispatch, a dispatch
    # whose completion was not seen (complete_not_seen), and such a dispatch still held
    # in the table, to be counted when its request comes back.
    full = value(s, LOST, reason="inflight_map_full", **labels)
    not_seen = value(s, LOST, reason="complete_not_seen", **labels)
    undone = undone_dispatches(d.proc.pid, dev.path)
    print(f"in-flight overflow: {requests} requests, {untimed} untimed, {full} inflight_map_full, {not_seen} "
          f"complete_not_seen, {undone} undone")
    assert untimed > 0, "64 slots under 256 requests in flight must leave some requests untimed"
    assert full > 0, "64 slots under 256 requests in flight must overflow"
    # Exact: a claim of a slot is a compare-and-exchange (mergewatch.bpf.c, enum mw_slot_access), so two
    # CPUs never both take one; before, that race left the gap open by one now and then.
    assert untimed == full + not_seen + undone, (untimed, full, not_seen, undone)
    # Under none there is no insert: a request finding both ways busy at issue is counted there;
    # what is not inflight_map_full is a completion the kernel skipped, rare: 10% is far above it.
    assert full >= 0.9 * untimed, (requests, timed, full)
    assert 0 < value(s, LATENCY + "_sum", **labels) / timed < 1.0
    assert value(s, "mergewatch_bpf_inflight_capacity") == 64

    # Pressure gone from this device: one request at a time. The 64 slots still serve the whole
    # host's I/O, so a few of ours may find both ways busy (measured: 25 of 1024 once at load
    # average ~10, 0 otherwise); each of those is counted.
    fio(dev, rw="randread", iodepth=1, batch=1, size_mb=4)
    s2 = d.scrape()
    new_requests = value(s2, SIZE + "_count", **labels) - requests
    new_untimed = new_requests - (value(s2, LATENCY + "_count", **labels) - timed)
    new_lost = (value(s2, LOST, reason="inflight_map_full", **labels) - full
                + value(s2, LOST, reason="complete_not_seen", **labels) - not_seen
                + undone_dispatches(d.proc.pid, dev.path) - undone)
    assert new_requests == 1024, new_requests
    assert new_untimed == new_lost, (new_requests, new_untimed, new_lost)
    assert new_untimed <= 0.5 * new_requests, (new_requests, new_untimed)  # the overflow is over
    assert d.stop() == 0


REQUEST_TIMEOUT_S = 3  # the daemon's HttpLimits::request_timeout: accept to a complete request


def scrape_until(port, source, deadline, results):
    """One scraping client: GET /metrics on a new connection, over and over until `deadline`. Counts the
    complete, parsing responses in results["ok"]; a failure goes to results["errors"], or to results["late"]
    when this client itself took longer than the daemon's request timeout to send its request (counted from
    before connect(), which the daemon's accept follows): the daemon is right to cut those."""
    while time.monotonic() < deadline:
        began = time.monotonic()
        sent = None
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
            try:
                conn.request("GET", "/metrics")
                sent = time.monotonic() - began
                r = conn.getresponse()
                status, body = r.status, r.read().decode()
            finally:
                conn.close()
            assert status == 200 and body.endswith("\n"), (status, body[-200:])
            samples = parse_samples(body)
            assert samples[("mergewatch_scrape_errors_total", frozenset())] == 0
            results["ok"] += 1
            results["sample"] = body
        except Exception as e:
            if sent is not None and sent >= REQUEST_TIMEOUT_S and isinstance(e, http.client.RemoteDisconnected):
                results["late"].append(f"request sent {sent:.1f} s after connect began")
            else:
                results["errors"].append(f"{e!r} (request sent {sent} s after connect began)")


def scraping_process(port, sources, deadline, queue):
    """A process of scraping clients, one thread each. Processes, not 100 threads of one: a thread of a
    process with 100 waits for its interpreter lock, seconds on a loaded host, between its connect and its
    send (measured: CI cut 2 such clients), and the test would measure Python's scheduling, not the daemon."""
    results = {"ok": 0, "errors": [], "late": [], "sample": None}
    per_thread = [{"ok": 0, "errors": [], "late": [], "sample": None} for _ in sources]
    threads = [threading.Thread(target=scrape_until, args=(port, source, deadline, mine))
               for source, mine in zip(sources, per_thread)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for mine in per_thread:
        for key in ("ok", "errors", "late"):
            results[key] += mine[key]
        results["sample"] = results["sample"] or mine["sample"]
    queue.put(results)


def test_hundred_concurrent_scrapers_during_io(daemon_factory, loop_device, tmp_path):
    """100 clients (10 processes of 10) scrape /metrics as fast as they can for 30 s while fio runs: every
    response is complete and parses, one passes promtool check metrics, the BPF counts still match diskstats,
    memory stays bounded. A client that was itself too slow to send its request may be cut, and each such cut
    is one the daemon counted."""
    d = daemon_factory()
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=0)
    reads_before = dev.stat()[0]
    rss_start = rss_kib(d.proc.pid)
    # Each client from one of 10 loopback addresses, 10 per address: the daemon allows 32 connections per
    # address (docs/operations.md, "Securing the endpoint"), a cap this test is not about. A client's closed connection
    # counts until the server's event loop sees it close: on a loaded host 20 clients of one address could
    # hold more than 32 for a moment.
    context = multiprocessing.get_context("fork")  # forked before any thread of this process starts
    queue = context.Queue()
    deadline = time.monotonic() + 30
    processes = [context.Process(target=scraping_process,
                                 args=(d.port, [f"127.0.0.{2 + i}"] * 10, deadline, queue)) for i in range(10)]
    for p in processes:
        p.start()
    io = subprocess.Popen(["fio", "--name=load", f"--filename={dev.path}", "--rw=randread", "--bs=4k", "--direct=1",
                           "--ioengine=libaio", "--iodepth=8", "--time_based", "--runtime=32", "--rate_iops=2000",
                           "--output=/dev/null"])
    peak_rss = rss_start
    while time.monotonic() < deadline:  # the 30 s of load under test, RSS sampled through it
        peak_rss = max(peak_rss, rss_kib(d.proc.pid))
        time.sleep(0.2)
    results = {"ok": 0, "errors": [], "late": [], "sample": None}
    for _ in processes:
        mine = queue.get(timeout=90)
        for key in ("ok", "errors", "late"):
            results[key] += mine[key]
        results["sample"] = results["sample"] or mine["sample"]
    for p in processes:
        p.join(timeout=30)
    io.wait(timeout=60)
    s = d.scrape()
    defences = {k: v for k, v in s.items() if k[0].startswith("mergewatch_http_")}
    if results["errors"]:
        raise AssertionError(f"{len(results['errors'])} failed scrapes, e.g. {results['errors'][:3]}; "
                             f"the daemon's defences: {defences}")
    timed_out = value(s, "mergewatch_http_connections_timed_out_total", reason="request")
    assert len(results["late"]) <= timed_out, (results["late"], defences)
    assert len(results["late"]) <= 0.01 * results["ok"], (results["late"], results["ok"])
    assert results["ok"] >= 100, results["ok"]
    sample = tmp_path / "scrape.prom"
    sample.write_text(results["sample"])
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing (Debian package prometheus)"
    with open(sample) as f:
        r = subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # The server holds at most its 4 worker threads' responses at once; 32 MiB over the start is
    # far beyond that (a response is ~50 KiB here) and far below 100 buffered or leaked ones per second.
    assert peak_rss - rss_start < 32 * 1024, (rss_start, peak_rss)
    s = d.scrape()
    assert value(s, SIZE + "_count", device=dev.name, op="read") == dev.stat()[0] - reads_before
    assert d.stop() == 0


def test_empty_sysfs_tree_runs_and_says_what_it_cannot_resolve(daemon_factory, loop_device, tmp_path):
    empty = tmp_path / "sys"
    empty.mkdir()
    d = daemon_factory(f"--path.sysfs={empty}")
    assert f"no block devices found under {empty}/block: check --path.sysfs" in d.log_text()
    dev = loop_device()
    direct_reads(dev.path, 16)

    def unresolved():  # once a tick has seen the device's requests (a tick later on a quiet host)
        s = d.scrape()
        return s if value(s, "mergewatch_unresolved_devices") >= 1 else None
    s = wait_until(unresolved, 30, "mergewatch_unresolved_devices >= 1", interval=0.2, on_timeout=d.log_text)
    assert not any(k[0] == SIZE + "_count" for k in s), "no device can be named, so no device series"
    assert d.stop() == 0


def test_malformed_sysfs_tree_warns_per_entry_and_keeps_the_good_ones(daemon_factory, tmp_path):
    root = tmp_path / "sys"
    good = root / "devices/virtual/block/loop9"
    (good / "queue").mkdir(parents=True)
    (good / "loop").mkdir()
    (good / "dev").write_text("7:9\n")
    for attr, v in (("nomerges", "0"), ("scheduler", "[none] mq-deadline"), ("max_sectors_kb", "1280"),
                    ("max_segments", "128"), ("rotational", "0")):
        (good / "queue" / attr).write_text(v + "\n")
    bad = root / "devices/virtual/block/loop8"
    bad.mkdir(parents=True)
    (bad / "dev").write_text("seven:eight\n")
    (root / "block").mkdir()
    os.symlink("../devices/virtual/block/loop9", root / "block/loop9")
    os.symlink("../devices/virtual/block/loop8", root / "block/loop8")
    os.symlink("../devices/virtual/block/nowhere", root / "block/ghost")
    os.symlink("loopy", root / "block/loopy")  # a link to itself
    d = daemon_factory(f"--path.sysfs={root}")
    log = d.log_text()
    assert "loop8/dev" in log and "malformed" in log, log
    assert "ghost" in log and "loopy" in log, log
    s = d.scrape()
    assert value(s, "mergewatch_queue_nomerges", device="loop9") == 0
    assert absent(s, "mergewatch_device_info", device="loop8"), "the malformed entry must be dropped"
    assert not absent(s, "mergewatch_device_info", device="loop9"), "the good entry must be kept"
    assert value(s, "mergewatch_device_info", device="loop9", kind="loop", disk="loop9", dm_name="", lvm_vg="",
                 lvm_lv="", lvm_layer="") == 1
    assert d.stop() == 0


def test_sighup_rescans_the_topology(daemon_factory, loop_device):
    dev = loop_device()
    dev.set_queue(nomerges=0)
    d = daemon_factory("--topology.refresh-interval=1h", "--log.level=debug")
    assert value(d.scrape(), "mergewatch_queue_nomerges", device=dev.name) == 0
    mark = len(d.log_text())
    dev.set_queue(nomerges=2)  # a queue/ write sends no uevent
    time.sleep(1.5)  # stays: a span in which nothing but SIGHUP should rescan; only printed, never asserted
    # No periodic rescan yet (1 h). The daemon also rescans, at most once a second, while BPF shows
    # a device sysfs does not (another run's loop device attached or detached on this shared host),
    # so an early 2 is possible here; the SIGHUP log line below is what proves the signal's rescan.
    if value(d.scrape(), "mergewatch_queue_nomerges", device=dev.name) != 0:
        print("a rescan for a device unknown to sysfs came before SIGHUP")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: value(d.scrape(), "mergewatch_queue_nomerges", device=dev.name) == 2, 30,
               "SIGHUP to rescan (nomerges 2 in /metrics)", interval=0.2, on_timeout=d.log_text)
    assert "SIGHUP: rescanning block devices" in d.log_text()
    assert d.proc.poll() is None
    assert d.stop() == 0
