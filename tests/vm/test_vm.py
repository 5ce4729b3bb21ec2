"""The 2019 incident for real: Debian's 6.1 kernel in qemu, an LVM snapshot on an emulated NVMe disk.

One VM run (tests/vm/run-vm.sh, about two minutes under TCG) plays the four cases with the
project's own mergewatchd in the guest, one daemon per case, default policy (no loop flags);
the assertions read the /metrics scrapes and daemon logs it leaves in the run directory.
"""
import os
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DAEMON = os.environ.get("MERGEWATCHD", os.path.join(REPO, "build/mergewatchd"))
OUT = os.path.join(REPO, "build/vm/test-run")
DISK = "nvme0n1"


def samples(path):
    with open(path) as f:
        text = f.read()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def get(s, name, **labels):
    return s.get((name, frozenset(labels.items())), 0.0)


def find(s, name, **labels):
    """Samples of `name` whose labels include `labels`: {frozenset(labels): value}."""
    return {k[1]: v for k, v in s.items() if k[0] == name and set(labels.items()) <= set(k[1])}


class Case:
    def __init__(self, name):
        p = os.path.join(OUT, f"case-{name}")
        self.before, self.after, self.settled = (samples(f"{p}.{x}.prom") for x in ("before", "after", "settled"))
        with open(f"{p}.daemon.log") as f:
            self.log = f.read()

    def delta(self, name, **labels):
        return get(self.after, name, **labels) - get(self.before, name, **labels)

    def collapse(self):
        """The merge_collapse series of the NVMe disk at the settled scrape: {upper: value}."""
        return {dict(k)["upper"]: v for k, v in find(self.settled, "mergewatch_merge_collapse", device=DISK).items()}

    def dm_device(self, dm_name):
        for labels in find(self.settled, "mergewatch_device_info", dm_name=dm_name):
            return dict(labels)["device"]
        raise AssertionError(f"no dm device named {dm_name}")

    def read_sizes(self):
        count = self.delta("mergewatch_request_size_bytes_count", device=DISK, op="read")
        small = self.delta("mergewatch_request_size_bytes_bucket", device=DISK, op="read", le="4096")
        total = self.delta("mergewatch_request_size_bytes_sum", device=DISK, op="read")
        return count, small, total


@pytest.fixture(scope="module")
def vm_run():
    subprocess.run([os.path.join(HERE, "setup.sh")], check=True, timeout=900)
    subprocess.run(["rm", "-rf", OUT], check=True)
    r = subprocess.run([os.path.join(HERE, "run-vm.sh"), "--out", OUT, "--daemon", DAEMON,
                        "--daemon-args", "--web.listen-address=127.0.0.1:9863",
                        "--metrics-url", "http://127.0.0.1:9863/metrics"],
                       capture_output=True, text=True, timeout=330)
    print(r.stdout[-6000:])
    if r.returncode != 0:
        pytest.fail(f"VM run failed ({r.returncode}):\n{r.stdout[-8000:]}\n{r.stderr[-4000:]}")
    return r.stdout


def test_same_bpf_object_loads_on_both_kernels(vm_run):
    with open(os.path.join(OUT, "attach-mode.txt")) as f:
        guest = f.read()
    assert 'tracepoint="block_rq_issue"' in guest and "} 1" in guest, guest
    guest_mode = "tp_btf" if 'mode="tp_btf"' in guest else "raw_tp"
    print(f"ATTACH guest kernel 6.1 (Debian): {guest_mode}")
    # The same binary, with the same embedded object, attached on this host's kernel.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([DAEMON, f"--web.listen-address=127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "attached" in line:
                print(f"ATTACH host {os.uname().release}: {line.strip()}")
                assert "tp_btf" in line or "raw_tp" in line
                break
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_nomerges_2_snapshot_read_raises_collapse_naming_the_snapshot(vm_run):
    c = Case("snap-nm2")
    snapshot = c.dm_device("vg0-snap")
    assert c.collapse() == {snapshot: 1.0}, c.collapse()
    count, small, total = c.read_sizes()
    assert count >= 16384 and small >= 0.99 * count, (count, small)
    # The snapshot received the reader's large bios; the disk got 4 KiB requests.
    bios = c.delta("mergewatch_bio_size_bytes_count", device=snapshot, op="read")
    bio_bytes = c.delta("mergewatch_bio_size_bytes_sum", device=snapshot, op="read")
    assert bios > 0 and bio_bytes / bios >= 128 * 1024, (bios, bio_bytes)
    assert c.delta("mergewatch_bio_merges_total", device=DISK, op="read", kind="back") == 0
    assert c.delta("mergewatch_missed_merges_total", device=DISK, op="read") >= 0.9 * count
    assert f"merge collapse on {DISK} (under {snapshot})" in c.log
    # The block_bio_remap chain (snapshot -> its -real layer -> the disk) attributes the
    # disk's requests to the snapshot itself, not to the layer they passed through.
    remapped = c.delta("mergewatch_remapped_requests_total", device=DISK, origin=snapshot, op="read")
    assert remapped >= 0.9 * count, (remapped, count, find(c.after, "mergewatch_remapped_requests_total"))
    real = c.dm_device("vg0-origin-real")
    assert c.delta("mergewatch_remapped_requests_total", device=DISK, origin=real, op="read") == 0
    assert c.delta("mergewatch_remapped_missed_merges_total", device=DISK, origin=snapshot, op="read") >= 0.9 * count
    assert f"% of them remapped from {snapshot}" in c.log
    assert f"nomerges=2 on {DISK}" in c.log and f"echo 0 > /sys/block/{DISK}/queue/nomerges" in c.log


def test_nomerges_0_snapshot_read_merges_and_never_raises(vm_run):
    c = Case("snap-nm0")
    assert set(c.collapse().values()) == {0.0}, c.collapse()
    count, small, total = c.read_sizes()
    assert 0 < count <= 16384 / 16 and total / count >= 128 * 1024, (count, total)
    assert c.delta("mergewatch_bio_merges_total", device=DISK, op="read", kind="back") >= 16000
    assert "merge collapse on" not in c.log


def test_random_4k_reads_on_the_snapshot_never_raise(vm_run):
    c = Case("snap-rand-nm2")
    assert set(c.collapse().values()) == {0.0}, c.collapse()
    count, small, total = c.read_sizes()
    assert count >= 4096 and small == count  # small requests, healthy: nothing to merge
    assert "merge collapse on" not in c.log


def test_origin_read_is_recorded(vm_run):
    """Reading the origin LV: a linear layer passes the reader's large bios through, so
    the disk sees large requests and there is nothing to detect (README: VM test)."""
    c = Case("origin-nm2")
    count, small, total = c.read_sizes()
    print(f"origin-nm2: {count:.0f} requests, mean {total / max(count, 1):.0f} bytes, "
          f"collapse={c.collapse()}")
    assert count > 0 and total / count >= 128 * 1024
    assert set(c.collapse().values()) == {0.0}
    origin = c.dm_device("vg0-origin")
    remapped = c.delta("mergewatch_remapped_requests_total", device=DISK, origin=origin, op="read")
    assert remapped >= 0.9 * count, (remapped, count, find(c.after, "mergewatch_remapped_requests_total"))
