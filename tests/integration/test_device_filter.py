# SPDX-License-Identifier: Apache-2.0
"""--devices.exclude / --devices.include: an excluded device has no series in any family, the
others keep theirs; the two flags are mutually exclusive. Real loop devices with real I/O (fio)."""
import subprocess

from conftest import DAEMON, fio


def families_by_device(samples):
    """{device label value: set of metric names that carry it}."""
    out = {}
    for (name, labels), _ in samples.items():
        labels = dict(labels)
        if "device" in labels:
            out.setdefault(labels["device"], set()).add(name)
    return out


def scrape_after_io(daemon, devices):
    for dev in devices:
        fio(dev, size_mb=8)
    return families_by_device(daemon.scrape())


def test_excluded_device_has_no_series(daemon_factory, loop_device):
    kept, dropped = loop_device(size_mb=16), loop_device(size_mb=16)
    daemon = daemon_factory(f"--devices.exclude=^{dropped.name}$")
    seen = scrape_after_io(daemon, [kept, dropped])
    assert dropped.name not in seen, f"{dropped.name} excluded but has series: {sorted(seen[dropped.name])}"
    # The kept one has its I/O and topology families: the filter takes series, not whole families.
    assert {"mergewatch_request_size_bytes_count", "mergewatch_device_info"} <= seen.get(kept.name, set()), seen
    assert f'msg="series for devices matching --devices.exclude=^{dropped.name}$ left out"' in daemon.log_text()


def test_include_keeps_only_the_matching_devices(daemon_factory, loop_device):
    kept, other = loop_device(size_mb=16), loop_device(size_mb=16)
    daemon = daemon_factory(f"--devices.include=^{kept.name}$")
    seen = scrape_after_io(daemon, [kept, other])
    assert set(seen) == {kept.name}, sorted(seen)


def test_default_keeps_loop_devices_and_flags_are_exclusive(daemon_factory, loop_device):
    dev = loop_device(size_mb=16)
    daemon = daemon_factory()
    seen = scrape_after_io(daemon, [dev])
    assert "mergewatch_request_size_bytes_count" in seen.get(dev.name, set()), "loop devices carry real I/O"
    assert not any(name.startswith(("ram", "zram", "fd")) and name[-1].isdigit() for name in seen), sorted(seen)
    r = subprocess.run([DAEMON, "--devices.include=^sd", "--devices.exclude=^loop"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "mutually exclusive" in r.stderr, r.stderr
