# SPDX-License-Identifier: Apache-2.0
"""Who: which service a collapsed pair's requests come from, and the per-volume series, on Debian's 6.12 (and
5.10) kernels. tests/vm/guest-who.sh runs late in the scenario boot (run-vm.sh --who PARTS, after guest-stacking.sh's
parts; vmtest.scenario_args, vmtest.WHO_PARTS), on the two extra NVMe disks (serials mwnvme1, mwnvme2),
one daemon with 3 s windows for every part. Its files are in the boot's who/ directory. 6.1 takes the same
paths as 6.12 (the measurements quoted below were 6.1's until the parts moved to the 6.12 boot, for make
test's time).

- backup: a backup (batched direct 64 KiB reads of a 4 KiB-chunk LVM snapshot) in /backup.slice beside random
  8 KiB reads of the snapshot's origin in /db.slice, nomerges=2: the (disk, snapshot) pair pages, and its
  requests are the backup's (mergewatch_collapse_service_request_ratio, /status "services", the onset line).
- luks: the same on LVM on LUKS2. Since v5.16 dm-crypt submits its read clones in the reader's task and traces them
  as remaps (dm_submit_bio_remap, e5524e128f6f, v5.16): attributed as without the crypt hop. On 5.10 it
  submitted its clones itself, untraced: the chain stops at the crypt device, the disk's requests come down no
  remap chain, no pair names the snapshot and no service is named.
- write: buffered writes from /writer.slice to ext4 on a 4 KiB-chunk snapshot's origin, written back by the
  flusher, nomerges=2: with no controller enabled below the root the flusher's bios carry the root blkcg
  ("writeback"); with +io +memory (cgroup writeback) they carry /writer.slice's.
- perlv: two LVs of one disk read at once, 4 KiB random and 256 KiB sequential: per volume, requests, bytes and
  device time at dispatch, and their sums equal to the disk's own counts.
"""
import json

import pytest

from vmtest import KERNELS, SCENARIOS, WHO_FULL_KERNEL, RunDir, find, get, scenario_boot, value
from mwtest import absent  # noqa: E402,I100  (vmtest puts tests/ on the path: imported first)

WHO = {k: RunDir(SCENARIOS[k].file("who")) for k in SCENARIOS}
RATIO = "mergewatch_collapse_service_request_ratio"
COLLAPSE = "mergewatch_merge_collapse"


def who_results(kernel):
    scenario_boot(kernel)
    run = WHO[kernel]
    log = "\n".join(line for line in SCENARIOS[kernel].text("guest.log").splitlines() if "who:" in line)
    if not run.exists("results.txt"):
        pytest.fail(f"the {kernel} boot ran no guest-who.sh (run-vm.sh --who):\n{log[-3000:]}", pytrace=False)
    res = run.results()
    print(res)
    assert "failed" not in res, f"guest-who.sh failed on {kernel}: {res['failed']}\n{log[-3000:]}"
    assert res.get("done") == "1" and res.get("daemon_exit") == "0", res
    return res


@pytest.fixture(scope="module")
def res_full():
    """guest-who.sh's results on the kernel that runs every part."""
    if WHO_FULL_KERNEL not in KERNELS:
        pytest.skip(f"MW_VM_KERNELS leaves out {WHO_FULL_KERNEL}")
    return who_results(WHO_FULL_KERNEL)


@pytest.fixture(scope="module")
def res510():
    if "5.10" not in KERNELS:
        pytest.skip("MW_VM_KERNELS leaves out 5.10")
    return who_results("5.10")


def shares(s, disk, upper):
    """{cgroup: share} of the pair's mergewatch_collapse_service_request_ratio series."""
    return {dict(k)["cgroup"]: v for k, v in find(s, RATIO, device=disk, upper=upper).items()}


def verdict(run, name, disk, upper):
    doc = json.loads(run.read(f"{name}-status.json"))
    found = [v for v in doc["verdicts"]
             if v.get("kind") == "merge_collapse" and (v["device"], v["upper"]) == (disk, upper)]
    assert len(found) == 1, doc["verdicts"]
    return found[0]


def check_service_shape(s, disk, upper):
    """The interface's bounds on one collapsed pair: at most four series, the top three and "other" (always
    there), each 0..1, summing to 1."""
    got = shares(s, disk, upper)
    assert "other" in got and len(got) <= 4, got
    assert all(0 <= v <= 1 for v in got.values()), got
    assert sum(got.values()) == pytest.approx(1, abs=0.01), got
    return got


def check_backup_attributed(run, res, name):
    """The (disk, snapshot) pair is raised and at least 90% of its requests in the last window are the backup's,
    in the scrape, in /status (first of its services) and in the onset line; the service beside it (its reads
    are the origin's pair) is not above 10% of the snapshot's pair."""
    disk, snap, origin = res[f"{name}_disk"], res[f"{name}_snapshot"], res[f"{name}_origin"]
    assert res[f"{name}_backup_cgroup"] == "/backup.slice" and res[f"{name}_db_cgroup"] == "/db.slice", res
    s = run.samples(f"{name}.prom")
    assert value(s, COLLAPSE, device=disk, upper=snap) == 1
    got = check_service_shape(s, disk, snap)
    assert got.get("/backup.slice", 0) > 0.9, got
    assert got.get("/db.slice", 0) < 0.1, got
    # Bounded: series only for a pair whose condition holds. The origin's random reads have no missed merges.
    if value(s, "mergewatch_collapse_condition", device=disk, upper=origin) == 0:
        assert absent(s, RATIO, device=disk, upper=origin), shares(s, disk, origin)
    v = verdict(run, name, disk, snap)
    assert v["state"] == "collapsed", v
    services = v["services"]
    assert services[0]["cgroup"] == "/backup.slice" and services[0]["share"] > 0.9, services
    assert services[0]["requests"] > 0 and services[-1]["cgroup"] == "other", services
    assert len(services) <= 4, services
    check_onset_names(run, name, disk, snap, "/backup.slice")


def check_onset_names(run, name, disk, upper, cgroup, first=True):
    """The pair's onset line (the last in the log copied with the part's scrape: dm-N names are reused by later
    parts) names `cgroup` after "requests from:", first unless `first` is false; `cgroup` may be a tuple of
    names, one of which is named."""
    log = run.read(f"{name}-daemon.log")
    onsets = [line for line in log.splitlines()
              if f"merge collapse on {disk} (under {upper})" in line and "cleared" not in line]
    assert onsets, log[-3000:]
    assert "; requests from: " in onsets[-1], onsets[-1]
    named = [n.strip().rstrip('"') for n in onsets[-1].split("; requests from: ", 1)[1].split(",")]
    cgroups = cgroup if isinstance(cgroup, tuple) else (cgroup,)
    if first:
        assert any(named[0].endswith(f"% {c}") for c in cgroups), onsets[-1]
    else:
        assert any(n.endswith(f"% {c}") for n in named for c in cgroups), onsets[-1]


def test_backup_in_its_cgroup_is_named_first(res_full):
    check_backup_attributed(WHO[WHO_FULL_KERNEL], res_full, "backup")


def test_backup_through_lvm_on_luks_is_named_first(res_full):
    """Since v5.16 dm-crypt's read clones are remapped in the reader's task (dm_submit_bio_remap, e5524e128f6f, v5.16):
    the chain snapshot -> origin-real -> crypt -> disk reaches the disk, and the backup is named as without it."""
    assert res_full["luks_crypt_table"] == "crypt aes-xts-plain64", res_full
    assert res_full["luks_waited"] == "1", res_full
    assert res_full["luks_crypt"] in res_full["luks_stack"].split(">")[1].split(","), res_full  # the crypt device holds the disk
    check_backup_attributed(WHO[WHO_FULL_KERNEL], res_full, "luks")


def check_writeback(name, expected):
    res, run = WHO[WHO_FULL_KERNEL].results(), WHO[WHO_FULL_KERNEL]
    disk, origin = res["write_disk"], res["write_origin"]
    assert res[f"{name}_writer_cgroup"] == "/writer.slice", res
    s = run.samples(f"{name}.prom")
    assert value(s, COLLAPSE, device=disk, upper=origin) == 1
    got = check_service_shape(s, disk, origin)
    top = max((c for c in got if c != "other"), key=got.get)
    assert top == expected, got
    services = verdict(run, name, disk, origin)["services"]
    assert services[0]["cgroup"] == expected, services
    # With cgroup writeback the onset window may still hold writes the flusher sent through the root's wb: the
    # inode's writeback moves to the writer's wb as the kernel sees its pages dirtied from that cgroup
    # (inode_switch_wbs()). Measured: 59% and 67% /writer.slice at onset on 6.1, 100% "writeback" at onset on
    # 6.12; 100% /writer.slice a window later on both (the scrape and /status above). So the onset line names
    # either.
    if expected == "/writer.slice":
        check_onset_names(run, name, disk, origin, (expected, "writeback"), first=False)
    else:
        check_onset_names(run, name, disk, origin, expected)
    return got


def test_writeback_without_the_io_controller_is_writeback(res_full):
    """No controller enabled below the root: the pages are charged to the root memory cgroup, the inode's wb is
    the root's, and the flusher's bios carry the root blkcg: no cgroup is known, the label is "writeback"."""
    assert res_full["write_off_subtree_control"] == "", res_full
    check_writeback("write-off", "writeback")


def test_writeback_with_the_io_controller_is_the_writers_cgroup(res_full):
    """+io +memory below the root: cgroup writeback (inode_cgwb_enabled()) gives /writer.slice its own wb, and
    wbc_init_bio() gives the flusher's bios its blkcg."""
    assert set(res_full["write_on_writer_controllers"].split()) >= {"io", "memory"}, res_full
    check_writeback("write-on", "/writer.slice")


def perlv_deltas(run):
    s0, s1 = run.samples("perlv-before.prom"), run.samples("perlv-after.prom")

    def delta(name, **labels):
        return value(s1, name, **labels) - get(s0, name, **labels)
    return delta


def fio_completion_seconds(run, lv):
    """The mean completion latency fio saw for its reads of the LV (submission to completion, the device's time
    and the block layer's around it)."""
    return json.loads(run.read(f"perlv-{lv}-fio.txt"))["jobs"][0]["read"]["clat_ns"]["mean"] / 1e9


def test_per_volume_sizes_and_device_time(res_full):
    """4 KiB random reads of one LV and 256 KiB sequential reads of the other, at once: per origin the dispatched
    bytes per request are the readers' sizes, and each volume's device time per request is its own reader's: at
    most the completion latency fio measured for that reader, and a good part of it (measured 45-49% under TCG,
    where dm, the block layer and the emulated interrupt take the rest: 0.89 ms of 1.84 and 0.91 of 2.04). TCG's
    emulated NVMe serves both readers from one queue, so their device times differ by a few percent only (1.08
    and 1.13 ms in another boot): an order between them is asserted only where fio saw one."""
    run, disk = WHO[WHO_FULL_KERNEL], res_full["perlv_disk"]
    delta = perlv_deltas(run)
    size, latency = {}, {}
    for lv in ("small", "large"):
        o = res_full[f"perlv_{lv}"]
        n = delta("mergewatch_remapped_dispatched_requests_total", device=disk, origin=o, op="read")
        assert n > 100, (lv, n)
        size[lv] = delta("mergewatch_remapped_dispatched_bytes_total", device=disk, origin=o, op="read") / n
        count = delta("mergewatch_remapped_request_latency_seconds_count", device=disk, origin=o, op="read")
        assert count == n, (lv, count, n)
        latency[lv] = delta("mergewatch_remapped_request_latency_seconds_sum", device=disk, origin=o, op="read") / count
    assert size["small"] == pytest.approx(4096, rel=0.01), size
    assert size["large"] >= 64 << 10, size
    fio = {lv: fio_completion_seconds(run, lv) for lv in ("small", "large")}
    for lv in ("small", "large"):
        assert 0.2 * fio[lv] <= latency[lv] <= 1.05 * fio[lv], (lv, latency, fio)
    if fio["large"] > 1.3 * fio["small"]:
        assert latency["large"] > latency["small"], (latency, fio)
    elif fio["small"] > 1.3 * fio["large"]:
        assert latency["small"] > latency["large"], (latency, fio)


def test_per_volume_series_sum_to_the_disk(res_full):
    """Every request of the disk came through one of the two LVs (nothing else touches mwnvme1, both scrapes idle):
    summed over origins, requests, bytes and latency samples equal the disk's own, and /sys/block/X/stat's."""
    run, disk = WHO[WHO_FULL_KERNEL], res_full["perlv_disk"]
    delta = perlv_deltas(run)
    origins = [res_full["perlv_small"], res_full["perlv_large"]]

    def total(name):
        return sum(delta(name, device=disk, origin=o, op="read") for o in origins)
    requests = delta("mergewatch_request_size_bytes_count", device=disk, op="read")
    before, after = ([int(x) for x in run.read(f"perlv-stat-{w}.txt").split()] for w in ("before", "after"))
    assert requests == after[0] - before[0] > 0, (requests, before, after)
    assert total("mergewatch_remapped_dispatched_requests_total") == requests
    assert total("mergewatch_remapped_dispatched_bytes_total") == \
        delta("mergewatch_request_size_bytes_sum", device=disk, op="read") == (after[2] - before[2]) * 512
    assert total("mergewatch_remapped_request_latency_seconds_count") == \
        delta("mergewatch_request_latency_seconds_count", device=disk, op="read")
    # The completion adds each request's device time to the disk's histogram and to its volume's: bucket by
    # bucket and in the sum, the volumes add up to the disk.
    buckets = find(run.samples("perlv-after.prom"), "mergewatch_request_latency_seconds_bucket", device=disk,
                   op="read")
    assert len(buckets) == 28, buckets  # 2^10 .. 2^36 ns and +Inf
    for labels in buckets:
        le = dict(labels)["le"]
        assert sum(delta("mergewatch_remapped_request_latency_seconds_bucket", device=disk, origin=o, op="read",
                         le=le) for o in origins) == \
            delta("mergewatch_request_latency_seconds_bucket", device=disk, op="read", le=le), le
    assert total("mergewatch_remapped_request_latency_seconds_sum") == \
        pytest.approx(delta("mergewatch_request_latency_seconds_sum", device=disk, op="read"), rel=1e-9)
    # The counter that was there before: requests created per origin (the same requests, at block_getrq).
    assert total("mergewatch_remapped_requests_total") == requests


def test_backup_in_its_cgroup_is_named_first_on_5_10(res510):
    check_backup_attributed(WHO["5.10"], res510, "backup")


def test_lvm_on_luks_is_not_attributed_on_5_10(res510):
    """5.10's dm-crypt submits its read clones itself (submit_bio_noacct, no block_bio_remap: it calls
    dm_submit_bio_remap only since e5524e128f6f, v5.16), so the remap chain stops at the crypt device: no request
    of the disk is counted under an origin, created or dispatched, and no service is named in any of four scrapes
    taken while the backup and the service read, nor in /status. The detector still pages the disk, as without
    remap data: with no remapped request in its window it takes the stacked device with the largest bios as the
    upper device (docs/detector.md), here the snapshot, whose share of the disk's requests reads 0 (measured:
    1,094-3,343 requests/s of 5.4 KiB, 65-68% missed merges)."""
    run, res = WHO["5.10"], res510
    disk = res["luks_disk"]
    assert res["luks_waited"] == "0" and res["luks_crypt_table"] == "crypt aes-xts-plain64", res
    for i in range(1, 5):
        s = run.samples(f"luks-poll-{i}.prom")
        assert not find(s, "mergewatch_remapped_requests_total", device=disk)
        assert not find(s, "mergewatch_remapped_dispatched_requests_total", device=disk)
        named = {dict(k)["cgroup"]: v for k, v in find(s, RATIO, device=disk).items() if dict(k)["cgroup"] != "other"}
        assert not named, named
        guessed = find(s, "mergewatch_collapse_upper_request_ratio", device=disk)
        assert all(v == 0 for k, v in guessed.items() if dict(k)["upper"]), guessed
    verdicts = [v for v in json.loads(run.read("luks-status.json"))["verdicts"] if v.get("device") == disk]
    assert all(s_["cgroup"] == "other" for v in verdicts for s_ in v.get("services", [])), verdicts
