# SPDX-License-Identifier: Apache-2.0
"""The release tarball on a fleet host's userland: Debian 11's 5.10 kernel with the tarball's binaries inside
the pristine Debian 11 (bullseye, glibc 2.31) minbase root make release made with debootstrap, never the
guest's own userland (the host's Debian 12). Read from the 5.10 scenario boot (vmtest.KERNEL_CASES_5_10: the
rel-* cases; tests/vm/guest-release.sh):

  rel-snap-nm2  the 2019 incident (LVM snapshot on NVMe, nomerges=2), the release's daemon with default flags:
                pages; the release's `mergewatch status` names the disk and exits 1
  rel-snap-nm0  the same read with merging on: quiet; `mergewatch status` exits 0
  then TLS with basic auth from a web config: 200 with the password, 401 without or with a wrong one, and the
  release's `mergewatch status` through a client config (TLS, basic auth)

The binaries' NEEDED libraries and symbol versions are tests/release's (make test-release)."""
import re

import pytest

from vmtest import KERNELS, SCENARIOS, RunDir, case_verdict, find, scenario_boot


@pytest.fixture(scope="module")
def release_run():
    if "5.10" not in KERNELS:
        pytest.fail("MW_VM_KERNELS leaves out 5.10, the kernel the release is tried on")
    scenario_boot("5.10")
    run = SCENARIOS["5.10"]
    rel = RunDir(run.file("release"))
    facts = rel.results("facts.txt")
    print(facts)
    return run, rel, facts


def test_the_binaries_run_in_debian_11_and_load_only_its_libraries(release_run):
    run, rel, facts = release_run
    assert facts["debian_version"].startswith("11."), facts
    assert "2.31" in facts["root_glibc"], facts
    assert facts["root_has_libbpf"] == "0", facts  # the guest's (Debian 12's) libbpf is not reachable
    for binary in ("mergewatchd", "mergewatch"):
        ldd = rel.read(f"ldd-{binary}.txt")
        print(binary, ldd)
        assert "not found" not in ldd, ldd
        resolved = re.findall(r"=> (\S+) \(0x", ldd)
        assert resolved, ldd
        # Inside the chroot every path is the root's: what ldd resolved is bullseye's glibc and the few
        # libraries docs/building.md allows ("Release tarball"), all under the root's /lib and /usr/lib.
        assert all(path.startswith(("/lib/", "/usr/lib/")) for path in resolved), ldd
        assert not re.search(r"lib(bpf|elf|prometheus|yaml-cpp|curl|microhttpd|stdc\+\+|gcc_s)\b", ldd), ldd
        version = facts["top"].removeprefix("mergewatch-").removesuffix(".linux-amd64")
        assert re.search(rf"\b{re.escape(version)}\b", rel.read(f"version-{binary}.txt")), version


def test_the_incident_pages_with_default_flags(release_run):
    run, rel, facts = release_run
    source, collapse, log, settled, reads, disk = case_verdict(run, "rel-snap-nm2")
    print(f"5.10 rel-snap-nm2: source {source}, collapse {collapse}, {disk} reads {reads}")
    assert source["source"] == "bpf", source
    snapshot = next(dict(k)["device"] for k in
                    find(settled, "mergewatch_device_info", dm_name="vg0-snap"))
    # The pair (disk, snapshot) raised; anything else the disk shows (the rest of its requests, upper="") not.
    assert collapse.get(snapshot) == 1.0 and not any(v for u, v in collapse.items() if u != snapshot), collapse
    assert f"merge collapse on {disk} (under {snapshot})" in log, log[-3000:]
    assert f"echo 0 > /sys/block/{disk}/queue/nomerges" in log
    assert re.search(r"listening on \S*:9863\b", log), log[:2000]  # default flags: the default address


def test_status_names_the_disk_and_exits_1_while_it_pages(release_run):
    run, rel, facts = release_run
    disk = case_verdict(run, "rel-snap-nm2")[5]
    text = run.read("case-rel-snap-nm2.status.txt")
    print(text)
    assert run.read("case-rel-snap-nm2.status.exit").strip() == "1", text
    assert disk in text and "nomerges" in text, text


def test_merging_on_stays_quiet(release_run):
    run, rel, facts = release_run
    source, collapse, log, settled, reads, disk = case_verdict(run, "rel-snap-nm0")
    assert source["source"] == "bpf", source
    assert set(collapse.values()) <= {0.0}, collapse
    assert "merge collapse on" not in log
    assert reads > 0  # the quiet is not an idle disk
    # 0, or 3 where only queue findings are active: the boot's earlier cases leave nomerges=2 on the other
    # disks (the partition disk, the multipath paths), which the findings name. Never 1: nothing pages.
    status = run.read("case-rel-snap-nm0.status.txt")
    assert run.read("case-rel-snap-nm0.status.exit").strip() in ("0", "3"), status
    assert "MERGE COLLAPSE" not in status and f"! {disk} " not in status, status


def test_tls_with_basic_auth_from_a_web_config(release_run):
    run, rel, facts = release_run
    log = rel.read("tls-daemon.log")
    assert "(TLS) (basic auth)" in log, log[-2000:]
    assert (facts["tls_right"], facts["tls_wrong"], facts["tls_none"]) == ("200", "401", "401"), facts
    assert facts["tls_plain_http"] != "200", facts  # TLS only: plain HTTP gets no scrape
    # Read through TLS with basic auth: 0, or 3 for the queue findings the boot's earlier cases left (never 2,
    # which would say the daemon was unreachable or refused the client).
    assert facts["tls_status_exit"] in ("0", "3"), rel.text("tls-status.txt")
    assert rel.text("tls-status.txt").startswith("mergewatch status: https://localhost:9863/metrics\nmergewatchd "), \
        rel.text("tls-status.txt")
    assert facts["tls_daemon_exit"] == "0", log[-2000:]
