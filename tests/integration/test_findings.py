# SPDX-License-Identifier: Apache-2.0
"""Queue findings on real loop devices: the series appears within a topology refresh of the
setting that makes it hold, and goes away when the setting is undone; rotational_without_scheduler never
names a loop device (its rotational flag is its backing disk's). Judged only on the loop devices
this test made: other engineers' loop devices on the same host may carry any setting."""
import time

import pytest

from mwtest import absent, parse_samples, value

FINDING = "mergewatch_queue_config_finding"
REFRESH = "--topology.refresh-interval=300ms"


def wait_for(daemon, check, what, timeout=30):
    """Scrapes until check(samples) is true; fails with the device's series when it never is."""
    deadline = time.monotonic() + timeout
    while True:
        samples = parse_samples(daemon.scrape_text())
        if check(samples):
            return samples
        if time.monotonic() > deadline:
            ours = sorted(str((k[0], dict(k[1]))) for k in samples if k[0] == FINDING)
            raise AssertionError(f"not within {timeout} s: {what}; {FINDING} series: {ours}\n{daemon.log_text()}")
        time.sleep(0.2)


def findings_of(samples, device):
    return {dict(k[1])["finding"]: v for k, v in samples.items() if k[0] == FINDING and dict(k[1])["device"] == device}


@pytest.mark.privileged
def test_default_loop_device_has_no_finding(daemon_factory, loop_device):
    dev = loop_device()
    d = daemon_factory(REFRESH)
    samples = wait_for(d, lambda s: not absent(s, "mergewatch_device_info", device=dev.name), "the loop device listed")
    assert findings_of(samples, dev.name) == {}
    # The class kernel cohorts compare it in, and its elevators (queue/scheduler lists mq-deadline on 6.18).
    assert value(samples, "mergewatch_device_class_info", device=dev.name, **{"class": "non_rotational"}) == 1
    assert value(samples, "mergewatch_queue_schedulers_available", device=dev.name) >= 1


@pytest.mark.privileged
def test_rotational_loop_device_on_none_is_no_finding(daemon_factory, loop_device):
    """A loop device's rotational flag is a copy of its backing disk's (loop_update_rotational), and its
    scheduler never orders what reaches a spindle: the backing disk's queue does. So rotational=1 on none
    is no finding on a loop device (topology/transport.h); the rule's positive side runs on sd disks in
    the VM (tests/vm/test_vm_findings.py) and on fixtures (queue_findings_test.cpp)."""
    dev = loop_device()
    d = daemon_factory(REFRESH)
    dev.set_queue(scheduler="none")
    dev.set_queue_attr("rotational", 1)
    # Judged once a refresh has read the new flag (the class gauge follows queue/rotational, and a scan
    # publishes its findings before its gauges); three refreshes more must not name it either.
    samples = wait_for(d, lambda s: not absent(s, "mergewatch_device_class_info", device=dev.name,
                                               **{"class": "rotational"}), f"{dev.name} classed rotational")
    assert findings_of(samples, dev.name) == {}
    time.sleep(1)
    assert findings_of(parse_samples(d.scrape_text()), dev.name) == {}
    # The setting that would make it a finding elsewhere is what the daemon saw.
    with open(f"/sys/block/{dev.name}/queue/scheduler") as f:
        assert "[none]" in f.read()
    assert f"rotational_without_scheduler on {dev.name}" not in d.log_text()


@pytest.mark.privileged
def test_max_sectors_cut_is_max_sectors_capped(daemon_factory, loop_device):
    dev = loop_device()
    d = daemon_factory(REFRESH)
    with open(f"/sys/block/{dev.name}/queue/max_hw_sectors_kb") as f:
        hw = int(f.read())
    # A quarter of min(max_hw_sectors_kb, the kernel's default cap) or less; loop's hardware limit is the lower.
    cut = min(hw, 1280) // 4
    dev.set_queue_attr("max_sectors_kb", cut + 4)
    # Just above the threshold stays quiet: judged once a refresh has read the new value (a scan
    # publishes its findings before the queue gauges, and each scan judges sysfs afresh).
    samples = wait_for(d, lambda s: value(s, "mergewatch_queue_max_sectors_bytes", device=dev.name) == (cut + 4) * 1024,
                       f"max_sectors_kb {cut + 4} on {dev.name} in /metrics")
    assert findings_of(samples, dev.name) == {}
    dev.set_queue_attr("max_sectors_kb", cut)
    wait_for(d, lambda s: findings_of(s, dev.name) == {"max_sectors_capped": 1}, "max_sectors_capped")
    dev.set_queue_attr("max_sectors_kb", hw)
    wait_for(d, lambda s: findings_of(s, dev.name) == {}, "max_sectors_capped cleared")
