"""The merge-collapse detector on real loop devices with real I/O: raised only where a merge was lost."""
import subprocess
import time

import pytest

from conftest import value

pytestmark = pytest.mark.privileged

# Loop devices stand in for NVMe: the policy flags point the detector at them.
RAISE_AFTER, CLEAR_AFTER, WINDOW = 2, 4, 5
POLICY = ["--collapse.lower-devices=^loop", "--collapse.require-upper=none", f"--collapse.raise-after={RAISE_AFTER}s",
          f"--collapse.clear-after={CLEAR_AFTER}s", f"--collapse.window={WINDOW}s"]


def start_fio(dev, rw="read", bs="4k", iodepth=64, batch=64, runtime=60):
    return subprocess.Popen(
        ["fio", "--name=mergewatch-collapse", f"--filename={dev.path}", f"--rw={rw}", f"--bs={bs}", "--direct=1",
         "--ioengine=libaio", f"--iodepth={iodepth}", f"--iodepth_batch_submit={batch}",
         f"--iodepth_batch_complete_min={batch}", "--time_based", f"--runtime={runtime}", "--output=/dev/null"])


def stop_fio(proc):
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def collapse(daemon, dev):
    s = daemon.scrape()
    return value(s, "mergewatch_merge_collapse", device=dev.name, upper="")


def wait_for(daemon, dev, expected, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if collapse(daemon, dev) == expected:
            return time.monotonic()
        time.sleep(0.25)
    raise AssertionError(f"mergewatch_merge_collapse{{device={dev.name}}} not {expected} within {timeout} s:\n"
                         + "\n".join(l for l in daemon.scrape_text().splitlines() if "collapse" in l and dev.name in l))


@pytest.fixture
def detector(daemon_factory):
    return daemon_factory(*POLICY)


@pytest.mark.parametrize("scheduler", ["none", "mq-deadline"])
def test_batched_4k_reads_with_nomerges_2_raise_and_clear_when_merging_returns(detector, loop_device, scheduler):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler=scheduler, nomerges=2)
    fio = start_fio(dev)
    try:
        started = time.monotonic()
        raised_at = wait_for(detector, dev, 1, timeout=15)
        print(f"raised after {raised_at - started:.1f} s")
        log = detector.log_text()
        assert f"merge collapse on {dev.name}" in log
        assert f"nomerges=2 on {dev.name}" in log and f"echo 0 > /sys/block/{dev.name}/queue/nomerges" in log
        s = detector.scrape()
        assert value(s, "mergewatch_collapse_small_request_ratio", device=dev.name) > 0.95
        assert value(s, "mergewatch_collapse_missed_merge_ratio", device=dev.name) > 0.5
        assert value(s, "mergewatch_queue_nomerges", device=dev.name) == 2

        dev.set_queue(nomerges=0)
        fixed = time.monotonic()
        # The window has to drain the collapsed seconds first, then the clear time runs.
        cleared_at = wait_for(detector, dev, 0, timeout=WINDOW + CLEAR_AFTER + 3)
        print(f"cleared {cleared_at - fixed:.1f} s after nomerges=0")
        assert f"merge collapse cleared on {dev.name}" in detector.log_text()
    finally:
        stop_fio(fio)


def assert_never_raised(detector, dev, fio_args, seconds=RAISE_AFTER + WINDOW + 2):
    fio = start_fio(dev, **fio_args) if fio_args is not None else None
    try:
        deadline = time.monotonic() + seconds
        seen_requests = False
        while time.monotonic() < deadline:
            s = detector.scrape()
            assert value(s, "mergewatch_merge_collapse", device=dev.name, upper="") == 0, \
                "\n".join(l for l in detector.scrape_text().splitlines() if "collapse" in l and dev.name in l)
            seen_requests |= value(s, "mergewatch_collapse_requests_per_second", device=dev.name) > 0
            time.sleep(0.5)
        if fio is not None:
            assert seen_requests, "the workload never reached the device"
        assert f"merge collapse on {dev.name}" not in detector.log_text()
    finally:
        if fio is not None:
            stop_fio(fio)


@pytest.mark.parametrize("scheduler", ["none", "mq-deadline"])
def test_batched_4k_reads_with_merging_allowed_never_raise(detector, loop_device, scheduler):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler=scheduler, nomerges=0)
    assert_never_raised(detector, dev, {})


def test_sequential_4k_submitted_one_at_a_time_never_raises(detector, loop_device):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=2)
    assert_never_raised(detector, dev, dict(iodepth=32, batch=1))


def test_random_4k_reads_never_raise(detector, loop_device):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=2)
    assert_never_raised(detector, dev, dict(rw="randread", iodepth=32, batch=32))


def test_sequential_4k_at_queue_depth_1_never_raises(detector, loop_device):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=2)
    assert_never_raised(detector, dev, dict(iodepth=1, batch=1))


def test_large_sequential_reads_never_raise(detector, loop_device):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=2)
    assert_never_raised(detector, dev, dict(bs="1m", iodepth=16, batch=16))


def test_idle_device_never_raises(detector, loop_device):
    dev = loop_device(size_mb=64)
    dev.set_queue(scheduler="none", nomerges=2)
    subprocess.run(["dd", f"if={dev.path}", "of=/dev/null", "bs=4k", "count=16", "iflag=direct"], check=True,
                   capture_output=True)
    assert_never_raised(detector, dev, None)
