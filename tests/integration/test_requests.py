"""Request sizes, latencies and merges on real tracepoints, against a loop device's own stats.

Every test runs twice: with the tp_btf programs (what the daemon picks) and with the raw_tp
fallback (a different compilation of the same handlers, reading fields with
bpf_probe_read_kernel), pinned with --bpf.program-type.
"""
import pytest

from conftest import fio, value

pytestmark = pytest.mark.privileged

SIZE = "mergewatch_request_size_bytes"
LATENCY = "mergewatch_request_latency_seconds"
QUEUE = "mergewatch_request_queue_latency_seconds"
MERGES = "mergewatch_bio_merges_total"
MISSED = "mergewatch_missed_merges_total"
ATTACHED = "mergewatch_bpf_program_attached"


@pytest.fixture(params=["tp_btf", "raw_tp"])
def daemon(daemon_factory, request):
    d = daemon_factory(f"--bpf.program-type={request.param}")
    s = d.scrape()
    for tracepoint in ("block_rq_issue", "block_rq_complete", "block_getrq", "block_bio_backmerge"):
        assert value(s, ATTACHED, tracepoint=tracepoint, mode=request.param) == 1, tracepoint
    return d


def read_shape(samples, dev):
    """What /metrics says about a device's reads."""
    labels = dict(device=dev.name, op="read")
    return {
        "requests": value(samples, SIZE + "_count", **labels),
        "le4096": value(samples, SIZE + "_bucket", le="4096", **labels),
        "bytes": value(samples, SIZE + "_sum", **labels),
        "latency_count": value(samples, LATENCY + "_count", **labels),
        "queue_count": value(samples, QUEUE + "_count", **labels),
        "back_merges": value(samples, MERGES, kind="back", **labels),
        "missed_merges": value(samples, MISSED, **labels),
    }


def measure(daemon, dev, **fio_args):
    """Deltas of /metrics and of /sys/block/X/stat across one fio run."""
    before, stat_before = read_shape(daemon.scrape(), dev), dev.stat()
    fio(dev, **fio_args)
    after, stat_after = read_shape(daemon.scrape(), dev), dev.stat()
    delta = {k: after[k] - before[k] for k in after}
    delta["stat_reads"] = stat_after[0] - stat_before[0]
    delta["stat_merges"] = stat_after[1] - stat_before[1]
    return delta


def assert_counts_agree_with_diskstats(d):
    assert d["stat_reads"] > 0
    assert abs(d["requests"] - d["stat_reads"]) <= 0.01 * d["stat_reads"], d
    # Every dispatched request also completed, so device latency is complete too.
    assert abs(d["latency_count"] - d["requests"]) <= 0.01 * d["requests"], d


@pytest.mark.parametrize("scheduler", ["mq-deadline", "none"])
def test_merging_allowed_gives_large_requests_and_back_merges(daemon, loop_device, scheduler):
    dev = loop_device()
    dev.set_queue(scheduler=scheduler, nomerges=0)
    d = measure(daemon, dev)
    assert_counts_agree_with_diskstats(d)
    # 8192 reads of 4 KiB in batches of 64: merged into a few dozen large requests.
    assert d["requests"] <= 8192 / 8, d
    assert d["bytes"] / d["requests"] >= 64 * 1024, d
    assert d["le4096"] <= 0.05 * d["requests"], d
    assert d["back_merges"] >= 8192 - 2 * d["requests"], d
    assert d["back_merges"] == d["stat_merges"], d
    assert d["missed_merges"] == 0, d


@pytest.mark.parametrize("scheduler", ["mq-deadline", "none"])
def test_nomerges_2_keeps_every_request_at_4k_and_back_merges_flat(daemon, loop_device, scheduler):
    dev = loop_device()
    dev.set_queue(scheduler=scheduler, nomerges=2)
    d = measure(daemon, dev)
    assert_counts_agree_with_diskstats(d)
    assert d["requests"] == 8192, d
    assert d["le4096"] == d["requests"], d
    assert d["back_merges"] == 0, d
    # Each batch of 64 contiguous reads is one plug flush: all but its first request (or
    # two, where a batch straddles flushes) were missed merges.
    assert d["missed_merges"] >= 0.9 * d["requests"], d


def test_queue_latency_only_where_insert_fires(daemon, loop_device):
    dev = loop_device()
    dev.set_queue(scheduler="mq-deadline", nomerges=2)
    d = measure(daemon, dev)
    assert d["queue_count"] == d["requests"], d   # every request went through the scheduler
    dev.set_queue(scheduler="none")
    d = measure(daemon, dev)
    # With none, plugged requests are issued directly: no insert, yet sizes and device
    # latency stay complete (block_rq_issue, not insert, is the source).
    assert d["queue_count"] < d["requests"], d
    assert_counts_agree_with_diskstats(d)
    assert d["requests"] == 8192, d


def test_latency_histogram_is_consistent(daemon, loop_device):
    dev = loop_device()
    dev.set_queue(scheduler="none", nomerges=0)
    fio(dev, rw="randread", iodepth=8, batch=1, size_mb=8)
    s = daemon.scrape()
    labels = dict(device=dev.name, op="read")
    count = value(s, LATENCY + "_count", **labels)
    assert count >= 2048
    assert value(s, LATENCY + "_bucket", le="+Inf", **labels) == count
    total = value(s, LATENCY + "_sum", **labels)
    assert 0 < total / count < 1.0   # a RAM-backed loop read is well under a second
    buckets = sorted((float(dict(k[1])["le"]), v) for k, v in s.items()
                     if k[0] == LATENCY + "_bucket" and dict(k[1]).get("device") == dev.name
                     and dict(k[1]).get("op") == "read")
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "cumulative buckets must not decrease"
