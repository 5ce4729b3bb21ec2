# SPDX-License-Identifier: Apache-2.0
"""The Debian package in the Debian 6.1 VM under its real systemd (tests/vm/run-vm.sh --package, driver
tests/vm/package/driver.sh): `apt-get install ./mergewatch_*.deb` enables and starts the service (Type=notify,
/metrics answers with the programs attached, run as a dynamic user); `apt-get purge` leaves no unit, no process,
no BPF program or link, no file of the package and no flags file.

The .deb is `make deb`'s output ($MERGEWATCH_DEB, set by `make test-vm`, which builds it first). One VM boot,
about 40-60 s of wall time."""
import io
import os
import subprocess
import tarfile

import pytest

from vmtest import REPO, VMDIR, RunDir, await_boot, boot, register_boot

CAP_BPF_PERFMON = "000000c000000000"


def deb_path():
    path = os.environ.get("MERGEWATCH_DEB")
    if not path:
        version = subprocess.run(["dpkg-parsechangelog", "-l", os.path.join(REPO, "debian/changelog"), "-S",
                                  "Version"], capture_output=True, text=True).stdout.strip()
        arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
        path = os.path.join(REPO, "build", "deb", f"mergewatch_{version}_{arch}.deb")
    if not os.path.isfile(path):
        pytest.fail(f"{path} missing: run `make deb` (make test-vm builds it)")
    return path


def diag(run):
    return (f"\n---- driver log ({run.path}/guest.log)\n{run.text('guest.log')[-5000:]}"
            f"\n---- apt-get install\n{run.text('apt-install.log')[-2000:]}"
            f"\n---- apt-get remove\n{run.text('apt-remove.log')[-2000:]}"
            f"\n---- apt-get purge\n{run.text('apt-purge.log')[-2000:]}"
            f"\n---- mergewatchd journal\n{run.text('journal-mergewatchd.txt')[-2500:]}"
            f"\n---- tail of guest console\n{run.text('console.log')[-2000:]}")


RUN = RunDir(os.path.join(VMDIR, "package-run"), diag)
# The driver's files are read leniently ("" when missing): each one's absence fails through the result
# key or check that goes with it, with the diagnostics.
read, expect = RUN.text, RUN.expect


# Install, remove, purge: 3 apt runs; 265 s in the clean-clone make test of 2026-11-28 (vmtest.register_boot).
register_boot("package", 265, lambda: boot(RUN, "--package", deb_path(), timeout=900, driver=True))


@pytest.fixture(scope="module")
def res():
    await_boot("package")
    return RUN.results()


def bpf(name):
    return RUN.json(name, missing="[]")


def test_the_package_ships_the_generated_rules_and_dashboard():
    """The rule file and dashboard in the .deb are the committed ones, which test_mixin.py checks are the mixin's
    output."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb_path()], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for shipped, committed in (("./usr/share/mergewatch/prometheus/mergewatch.rules.yml",
                                    "deploy/prometheus/mergewatch.rules.yml"),
                                   ("./usr/share/mergewatch/grafana/mergewatch.json", "deploy/grafana/mergewatch.json")):
            with open(os.path.join(REPO, committed), "rb") as f:
                assert tar.extractfile(shipped).read() == f.read(), f"{shipped} in the .deb is not {committed}"


BUILDING = os.path.join("docs", "building.md")


def documented_run_time_libraries():
    """The run-time libraries docs/building.md lists ("Dependencies"), as a set of Debian package names."""
    with open(os.path.join(REPO, BUILDING)) as f:
        text = f.read()
    marker = "the package's dependencies are the run-time libraries"
    assert marker in text, f"{BUILDING} no longer says '{marker} (...)'"
    listed = text.split(marker, 1)[1].split(")", 1)[0]
    return {p.strip() for p in listed.strip().lstrip("(").replace("\n", " ").split(",")}


def test_docs_list_every_run_time_library_the_package_depends_on():
    """The list of run-time libraries in docs/building.md is the package's Depends (dh_shlibdeps), no more, no less."""
    depends = subprocess.run(["dpkg-deb", "-f", deb_path(), "Depends"], capture_output=True, text=True,
                             check=True).stdout
    packages = {d.strip().split()[0] for d in depends.split(",")}
    listed = documented_run_time_libraries()
    assert listed == packages, f"{BUILDING} lists {sorted(listed)}, the package depends on {sorted(packages)}"


def test_apt_get_install_enables_and_starts_the_service(res):
    print(f"apt-get install took {res.get('install_seconds')} s: {res.get('package_status')}")
    expect(res.get("kernel", "").startswith("6.1.") and res.get("virtualization") == "qemu",
           f"guest kernel {res.get('kernel')}, virtualization {res.get('virtualization')}")
    expect(res.get("clean_before_ok") == "1", "the guest had mergewatch before the install")
    expect(res.get("install_rc") == "0" and res.get("package_status", "").startswith("install ok installed"),
           f"apt-get install rc {res.get('install_rc')}, status {res.get('package_status')!r}")
    expect(res.get("conffiles", "").split() == ["/etc/default/mergewatchd"], f"conffiles {res.get('conffiles')!r}")
    # dh_installsystemd's postinst did it: the driver never ran systemctl enable or start.
    expect(res.get("is_enabled") == "enabled"
           and res.get("wants_link") == "/lib/systemd/system/mergewatchd.service"
           and res.get("fragment_path") == "/lib/systemd/system/mergewatchd.service",
           f"is-enabled {res.get('is_enabled')}, wants link {res.get('wants_link')!r}, "
           f"FragmentPath {res.get('fragment_path')}")
    expect(res.get("active") == "active" and res.get("type") == "notify"
           and "programs attached" in res.get("status_text", ""),
           f"is-active {res.get('active')}, Type={res.get('type')}, StatusText={res.get('status_text')!r}")
    # (systemctl show quotes an entry holding parentheses)
    expect(res.get("documentation") == '"man:mergewatchd(8)" file:/usr/share/doc/mergewatch/runbook.md',
           f"Documentation={res.get('documentation')!r}")
    # The unit's dynamic user, not root.
    uid = int(res.get("uid") or 0)
    expect(61184 <= uid <= 65519 and res.get("main_user") == "mergewatchd",
           f"main process uid {uid}, user {res.get('main_user')!r}")


def test_metrics_answer_with_the_programs_attached(res):
    expect(res.get("metrics_ok") == "1", f"curl /metrics rc {res.get('metrics_rc')}")
    text = read("metrics-installed.prom")
    for tp in ("block_rq_issue", "block_rq_complete"):
        expect(any(line.startswith("mergewatch_bpf_program_attached{") and f'tracepoint="{tp}"' in line
                   and line.endswith(" 1") for line in text.splitlines()), f"{tp} not attached:\n{text[:1500]}")
    version = res.get("package_status", "").split()[-1]
    expect(f'mergewatch_build_info{{version="{version}"' in text, f"build_info is not version {version}")


def test_version_report_is_the_package_build(res):
    """--version of the packaged daemon: the changelog's version, no branch or revision (no git in a package
    build), the build date from SOURCE_DATE_EPOCH, which dpkg-buildpackage takes from the changelog's date."""
    changelog = os.path.join(REPO, "debian/changelog")
    version = subprocess.run(["dpkg-parsechangelog", "-l", changelog, "-S", "Version"], capture_output=True,
                             text=True).stdout.strip()
    epoch = int(subprocess.run(["dpkg-parsechangelog", "-l", changelog, "-S", "Timestamp"], capture_output=True,
                               text=True).stdout.strip())
    import time
    date = time.strftime("%Y%m%d-%H:%M:%S", time.gmtime(epoch))
    report = res.get("version_report", "")
    expect(report.startswith(f"mergewatchd, version {version} (branch: unknown, revision: unknown);")
           and f"build date:       {date};" in report and "toolchain:" in report and "platform:" in report,
           f"--version: {report!r} (expected version {version}, build date {date})")


def test_installed_example_prometheus_config_passes_promtool(res):
    """/usr/share/mergewatch/prometheus/prometheus.example.yml as the package installs it names the rule file the
    package installs: `promtool check config` in the guest accepts it."""
    expect(res.get("example_config_rc") == "0" and "SUCCESS" in read("promtool-example.txt"),
           f"promtool check config: rc {res.get('example_config_rc')}\n{read('promtool-example.txt')}")


def test_apt_get_remove_stops_and_disables_the_socket(res):
    """An admin enabled and started mergewatchd.socket (opt-in); `apt-get remove` stops and disables it with the
    service: nothing listens for a binary that is gone."""
    expect(res.get("socket_enabled_before") == "enabled" and res.get("socket_active_before") == "active"
           and res.get("service_active_with_socket") == "active",
           f"before remove: socket {res.get('socket_enabled_before')}/{res.get('socket_active_before')}, "
           f"service {res.get('service_active_with_socket')}")
    expect(res.get("remove_rc") == "0" and res.get("socket_active_after_remove") != "active"
           and not res.get("socket_link_after_remove") and res.get("socket_listening_after_remove") == "0"
           and res.get("service_active_after_remove") != "active" and res.get("socket_removed_ok") == "1",
           f"after remove: rc {res.get('remove_rc')}, socket {res.get('socket_active_after_remove')}, "
           f"link {res.get('socket_link_after_remove')!r}, listening {res.get('socket_listening_after_remove')}, "
           f"service {res.get('service_active_after_remove')}")


def test_apt_get_purge_leaves_nothing_behind(res):
    print(f"apt-get purge took {res.get('purge_seconds')} s; left: {read('left-after-purge.txt')!r}")
    expect(res.get("purge_rc") == "0", f"apt-get purge rc {res.get('purge_rc')}")
    expect(res.get("package_status_after", "") in ("", "unknown ok not-installed")
           or "no packages found" in res.get("package_status_after", ""),
           f"dpkg status after purge {res.get('package_status_after')!r}")
    # No unit: systemd has no file for it (LoadState not-found), none enabled.
    expect(res.get("load_state_after") == "not-found" and res.get("unit_files_after") == "0"
           and res.get("active_after") != "active",
           f"LoadState {res.get('load_state_after')}, unit files {res.get('unit_files_after')}, "
           f"is-active {res.get('active_after')}")
    # No process.
    expect(res.get("main_pid_alive_after") == "no" and not res.get("processes_after", "").strip(),
           f"main PID alive {res.get('main_pid_alive_after')}, mergewatchd processes {res.get('processes_after')!r}")
    # No BPF program or link of the service's user (positive control: they were there while it ran).
    uid = int(res.get("uid") or -1)
    running = [p for p in bpf("bpftool-prog-installed.json") if p.get("uid") == uid]
    ids = {p["id"] for p in running}
    expect({"block_rq_issue", "block_rq_complete"} <= {link.get("tp_name") for link in
                                                        bpf("bpftool-link-installed.json")
                                                        if link.get("prog_id") in ids},
           f"while installed: programs {[(p['id'], p['name']) for p in running]}")
    left = [p for p in bpf("bpftool-prog-purged.json") if p["id"] in ids or p.get("uid") == uid]
    left_links = [link for link in bpf("bpftool-link-purged.json") if link.get("prog_id") in ids]
    expect(not left and not left_links, f"after purge: programs {left}, links {left_links}")
    # No file: every path dpkg listed, /etc/default/mergewatchd, systemd's enablement state.
    files = read("dpkg-files.txt").split()
    expect("/etc/default/mergewatchd" in files and "/usr/sbin/mergewatchd" in files
           and "/usr/share/man/man8/mergewatchd.8.gz" in files, f"dpkg -L before purge: {files}")
    expect(res.get("left_after") == "0" and not read("left-after-purge.txt").strip(),
           f"left after purge:\n{read('left-after-purge.txt')}")
    expect(read("exit-status").strip() == "0", f"driver checks failed: exit-status {read('exit-status')!r}: "
           + ", ".join(k for k, v in res.items() if k.endswith("_ok") and v != "1"))
