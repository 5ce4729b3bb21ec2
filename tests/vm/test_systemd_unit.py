# SPDX-License-Identifier: Apache-2.0
"""The shipped hardened unit under a real systemd: Debian's 6.1 kernel in qemu, the host's systemd 252 as PID 1.

One VM run (tests/vm/run-vm.sh --systemd, 60-85 s under TCG) puts the output of
`make install DESTDIR=... DAEMON=$MERGEWATCHD` into the guest's root (daemon in /usr/local/sbin, the unit
from deploy/systemd/mergewatchd.service.in in /usr/local/lib/systemd/system, /etc/default/mergewatchd
with MERGEWATCHD_ARGS added), boots systemd, and tests/vm/systemd/driver.sh drives mergewatchd.service
through enable, start, I/O, watchdog, kill -9 of the main PID, stop and the journal. The assertions
re-read what the driver left in the run directory: results.txt, /metrics scrapes, /proc/PID/status,
`systemctl show` dumps, bpftool JSON and the journal as JSON.
"""
import filecmp
import json
import os
import re
import subprocess

import pytest

from vmtest import DAEMON, REPO, VMDIR, RunDir, await_boot, boot, find, parse, register_boot

UNIT = "mergewatchd.service"
LISTEN = "127.0.0.1:9863"
# Through /etc/default/mergewatchd: the listen address proves the flags reach the daemon, debug
# gives journald a second priority (7) next to info (6).
DAEMON_ARGS = f"--web.listen-address={LISTEN} --log.level=debug"
CAP_BPF_PERFMON = "000000c000000000"  # CAP_PERFMON (38) | CAP_BPF (39)
PRIORITY = {"debug": "7", "info": "6", "warn": "4", "error": "3"}
DISK = "nvme0n1"  # the boot's only NVMe disk (one controller, serial mw0001): no other name is possible


def diag(run):
    """Context for any failure: the driver's log, the guest journal, the guest console."""
    return (f"\n---- driver log ({run.path}/guest.log)\n{run.tail('guest.log', 70)}"
            f"\n---- guest journal, debug lines left out ({run.path}/journal-boot.txt)\n"
            f"{run.tail('journal-boot.txt', 50, drop='level=debug')}"
            f"\n---- tail of guest console ({run.path}/console.log)\n{run.tail('console.log', 30)}")


RUN = RunDir(os.path.join(VMDIR, "systemd-run"), diag)
# The driver's files are read leniently ("" when missing, no samples in a missing scrape): each one's
# absence fails through the result key or check that goes with it, with the diagnostics.
read, expect = RUN.text, RUN.expect


def samples(name):
    return parse(read(name))


def attached(name):
    """{tracepoint: value} of mergewatch_bpf_program_attached in scrape `name`."""
    return {dict(k)["tracepoint"]: v for k, v in find(samples(name), "mergewatch_bpf_program_attached").items()}


def show(name):
    """A `systemctl show` dump as a dict."""
    return dict(line.split("=", 1) for line in read(name).splitlines() if "=" in line)


def bpf(kind, tag):
    return RUN.json(f"bpftool-{kind}-{tag}.json")


def journal():
    entries = []
    for line in read("journal-mergewatchd.json").splitlines():
        if line.startswith("{"):
            e = json.loads(line)
            if isinstance(e.get("MESSAGE"), list):  # journalctl's form for non-UTF-8 bytes
                e["MESSAGE"] = bytes(e["MESSAGE"]).decode(errors="replace")
            entries.append(e)
    return entries


# 218 s in the clean-clone make test of 2026-11-28 beside another guest (vmtest.register_boot); the
# timeout is a hang guard (126 s alone here).
register_boot("systemd", 218, lambda: boot(RUN, "--systemd", "--daemon", DAEMON, "--daemon-args", DAEMON_ARGS,
                                                 timeout=600, driver=True))


@pytest.fixture(scope="module")
def res():
    # Any status but run-vm.sh's own failures is the number of driver-side checks that failed: the
    # tests below say which.
    await_boot("systemd")
    return RUN.results()


def daemon_progs(tag, uid):
    """The daemon's BPF programs in a bpftool snapshot: those loaded by its (dynamic) user."""
    return [p for p in bpf("prog", tag) if p.get("uid") == uid]


def main_uid():
    uid = read("status-main.txt").split("Uid:", 1)[-1].split()
    return int(uid[0]) if uid and uid[0].isdigit() else -1


def test_guest_runs_systemd_as_pid1_in_a_vm(res):
    expect(res.get("kernel", "").startswith("6.1."), f"guest kernel {res.get('kernel')}")
    # Not "docker": guest-init.sh hides the host's /.dockerenv, so systemd acts as on a machine.
    expect(res.get("virtualization") == "qemu", f"systemd-detect-virt: {res.get('virtualization')}")
    expect("systemd 252" in read("guest.log"), "driver did not see systemd 252")


def test_installed_by_make_install_and_enabled(res):
    with open(os.path.join(REPO, "deploy/systemd/mergewatchd.service.in")) as f:
        want = f.read().replace("@SBINDIR@", "/usr/local/sbin").replace("@DOCDIR@", "/usr/local/share/doc/mergewatch")
    got = read("rootfs/usr/local/lib/systemd/system/mergewatchd.service")
    assert got == want, "installed unit is not the template with @SBINDIR@=/usr/local/sbin"
    assert filecmp.cmp(RUN.file("rootfs/usr/local/sbin/mergewatchd"), DAEMON, shallow=False)
    with open(os.path.join(REPO, "deploy/default/mergewatchd")) as f:
        default = f.read()
    assert read("rootfs/etc/default/mergewatchd") == f"{default}MERGEWATCHD_ARGS={DAEMON_ARGS}\n"
    # What systemd loaded is that file, with no drop-ins, and [Install] works.
    expect(res.get("fragment_path") == "/usr/local/lib/systemd/system/mergewatchd.service",
           f"FragmentPath {res.get('fragment_path')}")
    expect(res.get("dropin_paths") == "", f"DropInPaths {res.get('dropin_paths')}")
    loaded = read("unit-as-loaded.txt")
    expect(want in loaded and "\n# /" not in loaded, f"systemctl cat:\n{loaded[:600]}")
    expect(res.get("enable_rc") == "0" and res.get("is_enabled") == "enabled"
           and res.get("wants_link") == "/usr/local/lib/systemd/system/mergewatchd.service",
           f"enable rc {res.get('enable_rc')}, is-enabled {res.get('is_enabled')}, "
           f"multi-user.target.wants link -> {res.get('wants_link')!r}")


def test_start_returns_only_when_active_listening_and_attached(res):
    at_ready = attached("metrics-at-ready.prom")
    print(f"systemctl start took {res.get('start_seconds')} s; attached at return: {at_ready}")
    expect(res.get("start_rc") == "0" and res.get("active_at_ready") == "active",
           f"systemctl start rc {res.get('start_rc')}, is-active {res.get('active_at_ready')}")
    # The scrape right after `systemctl start` returned (curl, no retry) answered ...
    expect(res.get("metrics_at_ready_rc") == "0", f"/metrics did not answer at once: curl rc {res.get('metrics_at_ready_rc')}")
    # ... with both request tracepoints attached.
    expect(at_ready.get("block_rq_issue") == 1.0 and at_ready.get("block_rq_complete") == 1.0,
           f"mergewatch_bpf_program_attached at return of systemctl start: {at_ready}")
    s = show("show-running-1.txt")
    expect(s.get("Type") == "notify" and "programs attached" in s.get("StatusText", ""),
           f"Type={s.get('Type')} StatusText={s.get('StatusText')!r} (READY=1 carries STATUS=)")
    # The flags in /etc/default/mergewatchd reached the daemon (EnvironmentFile= + $MERGEWATCHD_ARGS).
    expect(f"listening on {LISTEN}" in read("journal-mergewatchd.txt"), f"no 'listening on {LISTEN}' in the journal")
    # RestrictAddressFamilies= lets the DynamicUser open and bind the kernel's uevent socket.
    expect("watching block device uevents" in read("journal-mergewatchd.txt"),
           "no 'watching block device uevents' in the journal: device events refused under the unit")


def test_main_process_is_a_dynamic_user_with_only_bpf_and_perfmon(res):
    status = {k: v.strip() for k, v in
              (line.split(":", 1) for line in read("status-main.txt").splitlines() if ":" in line)}
    print(f"user {res.get('main_user')} Uid {status.get('Uid')} CapEff {status.get('CapEff')} "
          f"NoNewPrivs {status.get('NoNewPrivs')} Seccomp {status.get('Seccomp')}")
    uids = [int(u) for u in status.get("Uid", "0").split()]
    # systemd allocates DynamicUser= UIDs from 61184-65519.
    expect(len(set(uids)) == 1 and 61184 <= uids[0] <= 65519, f"Uid {status.get('Uid')} (real, effective, saved, fs)")
    expect(res.get("main_user") == "mergewatchd", f"user name {res.get('main_user')!r} (DynamicUser names it after the unit)")
    for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        expect(status.get(cap) == CAP_BPF_PERFMON, f"{cap} {status.get(cap)}, want {CAP_BPF_PERFMON}")
    expect(status.get("NoNewPrivs") == "1", f"NoNewPrivs {status.get('NoNewPrivs')}")
    expect(status.get("Seccomp") == "2", f"Seccomp {status.get('Seccomp')} (SystemCallFilter= not applied?)")
    # The programs in the kernel were loaded by that user, not by root.
    mine = [p["name"] for p in daemon_progs("running-1", uids[0])]
    expect({"btf_rq_issue", "btf_rq_complete"} <= set(mine) or {"raw_rq_issue", "raw_rq_complete"} <= set(mine),
           f"programs of uid {uids[0]}: {mine}\n{read('bpftool-running-1.txt')[-2500:]}")


def test_direct_reads_from_the_nvme_disk_are_counted(res):
    before, after = samples("metrics-at-ready.prom"), samples("metrics-after-dd.prom")
    key = dict(device=DISK, op="read")
    count = sum(find(after, "mergewatch_request_size_bytes_count", **key).values()) - \
        sum(find(before, "mergewatch_request_size_bytes_count", **key).values())
    size = sum(find(after, "mergewatch_request_size_bytes_sum", **key).values()) - \
        sum(find(before, "mergewatch_request_size_bytes_sum", **key).values())
    # The disk's own diskstats, read next to each scrape, are the oracle: double counting or a
    # lost request shows, where '>= 256' let both pass.
    stat_before, stat_after = ([int(x) for x in read(f"diskstat-{n}.txt").split()] for n in ("at-ready", "after-dd"))
    stat_reads, stat_bytes = stat_after[0] - stat_before[0], (stat_after[2] - stat_before[2]) * 512
    print(f"{DISK} reads during dd (256 x 4 KiB, iflag=direct): {count:.0f} requests, {size:.0f} bytes; "
          f"diskstats {stat_reads} reads, {stat_bytes} bytes")
    expect(count == stat_reads >= 256 and size == stat_bytes >= 256 * 4096,
           f"{DISK} read requests +{count}, bytes +{size}; diskstats +{stat_reads} reads, +{stat_bytes} bytes; "
           f"after dd: {find(after, 'mergewatch_request_size_bytes_count', device=DISK)}")


def test_watchdog_is_fed_past_watchdogsec(res):
    ts = [int(res.get(f"watchdog_ts_{i}") or 0) for i in (1, 2, 3)]
    print(f"WatchdogUSec {res.get('watchdog_usec')}, WatchdogTimestampMonotonic {ts}, "
          f"active for {res.get('active_for_seconds')} s with MainPID {res.get('main_pid_after_watchdog')}")
    expect(res.get("watchdog_usec") == "30s", f"WatchdogUSec {res.get('watchdog_usec')}")
    expect(ts[2] > ts[1] > ts[0] > 0, f"WatchdogTimestampMonotonic did not advance (no WATCHDOG=1): {ts}")
    # Without pings systemd aborts the service WatchdogSec after start: it outlived that, untouched.
    expect(float(res.get("active_for_seconds") or 0) > 30, f"active for only {res.get('active_for_seconds')} s")
    expect(res.get("active_after_watchdog") == "active" and res.get("nrestarts_after_watchdog") == "0"
           and res.get("main_pid_after_watchdog") == res.get("main_pid_1"),
           f"after the wait: {res.get('active_after_watchdog')}, NRestarts {res.get('nrestarts_after_watchdog')}, "
           f"MainPID {res.get('main_pid_1')} -> {res.get('main_pid_after_watchdog')}")


def test_kill_9_of_the_main_pid_restarts_it(res):
    pid1, pid2 = res.get("main_pid_1"), res.get("main_pid_2")
    print(f"back after {res.get('restart_seconds')} s: MainPID {pid1} -> {pid2}, NRestarts {res.get('nrestarts')}")
    expect(res.get("nrestarts") == "1", f"NRestarts {res.get('nrestarts')}")
    expect(res.get("active_after_kill") == "active", f"ActiveState {res.get('active_after_kill')}")
    expect(pid2 not in ("", "0", pid1), f"MainPID {pid1} -> {pid2}")
    # RestartSec=5s is a lower bound systemd keeps (a fact, not a speed).
    expect(float(res.get("restart_seconds") or 0) >= 5, f"restarted after {res.get('restart_seconds')} s < RestartSec=5s")
    log = read("journal-mergewatchd.txt")
    expect("Main process exited, code=killed, status=9/KILL" in log and "restart counter is at 1" in log,
           "journal lacks the SIGKILL exit or the scheduled restart")
    expect(res.get("metrics_after_restart_rc") == "0", f"/metrics after restart: curl rc {res.get('metrics_after_restart_rc')}")
    again = attached("metrics-after-restart.prom")
    expect(again.get("block_rq_issue") == 1.0 and again.get("block_rq_complete") == 1.0, f"after restart: {again}")
    # The killed process's programs went with its file descriptors: the new one has the same set, fresh ids.
    uid = main_uid()
    first, second = daemon_progs("running-1", uid), daemon_progs("running-2", uid)
    expect(sorted(p["name"] for p in first) == sorted(p["name"] for p in second)
           and not {p["id"] for p in first} & {p["id"] for p in second},
           f"programs before kill {[(p['id'], p['name']) for p in first]}, "
           f"after restart {[(p['id'], p['name']) for p in second]}")


def test_stop_exits_cleanly_and_leaves_no_bpf_programs_or_links(res):
    s = show("show-after-stop.txt")
    print(f"stop: Result={s.get('Result')} ExecMainPID={s.get('ExecMainPID')} ExecMainCode={s.get('ExecMainCode')} "
          f"ExecMainStatus={s.get('ExecMainStatus')}")
    expect(res.get("stop_rc") == "0" and res.get("active_after_stop") == "inactive",
           f"systemctl stop rc {res.get('stop_rc')}, is-active {res.get('active_after_stop')}")
    # These properties are of the process that ran (not the defaults of a reloaded unit) ...
    expect(s.get("ExecMainPID") == res.get("main_pid_2") and s.get("NRestarts") == "1",
           f"ExecMainPID {s.get('ExecMainPID')} (want {res.get('main_pid_2')}), NRestarts {s.get('NRestarts')}")
    # ... and it exited (CLD_EXITED = 1) with status 0 on SIGTERM.
    expect(s.get("Result") == "success" and s.get("ExecMainCode") == "1" and s.get("ExecMainStatus") == "0",
           f"Result={s.get('Result')} ExecMainCode={s.get('ExecMainCode')} ExecMainStatus={s.get('ExecMainStatus')}")
    log = read("journal-mergewatchd.txt")
    expect(f"mergewatchd[{res.get('main_pid_2')}]: level=info msg=\"BPF programs detached, exiting\"" in log
           and "Deactivated successfully" in log, "journal lacks the daemon's clean exit")
    uid = main_uid()
    running = daemon_progs("running-2", uid)
    ids = {p["id"] for p in running}
    links = [link for link in bpf("link", "running-2") if link.get("prog_id") in ids]
    # Positive control: while it ran, bpftool saw its programs and their links.
    expect(len(running) >= 2 and {"block_rq_issue", "block_rq_complete"} <= {link.get("tp_name") for link in links},
           f"running: programs {[(p['id'], p['name']) for p in running]}, links {links}")
    names = {p["name"] for p in running}
    left = [p for p in bpf("prog", "after-stop") if p["id"] in ids or p["name"] in names or p.get("uid") == uid]
    left_links = [link for link in bpf("link", "after-stop") if link.get("prog_id") in ids
                  or link.get("type") in ("raw_tracepoint", "tracing")]
    expect(not left and not left_links, f"after stop: programs {left}, links {left_links}\n{read('bpftool-after-stop.txt')}")


def test_journal_has_the_daemons_logfmt_lines_with_their_priorities(res):
    entries = [e for e in journal() if e.get("SYSLOG_IDENTIFIER") == "mergewatchd"]
    bad, seen = [], {}
    for e in entries:
        m = re.fullmatch(r'level=(debug|info|warn|error) msg="(?:[^"\\]|\\.)*"', e.get("MESSAGE", ""))
        if not m or e.get("PRIORITY") != PRIORITY[m.group(1)]:
            bad.append((e.get("PRIORITY"), e.get("MESSAGE")))
        else:
            seen[m.group(1)] = seen.get(m.group(1), 0) + 1
    print(f"{len(entries)} daemon journal entries by level: {seen}")
    expect(not bad, f"{len(bad)} daemon lines not logfmt or with the wrong PRIORITY, e.g. {bad[:5]}")
    # Both instances logged; both info (6) and debug (7) were seen, so the mapping was exercised.
    pids = {e.get("_PID") for e in entries}
    expect({res.get("main_pid_1"), res.get("main_pid_2")} <= pids, f"daemon lines from PIDs {pids}")
    expect(seen.get("info", 0) >= 8 and seen.get("debug", 0) > 0, f"levels seen: {seen}")


def test_driver_checks_all_passed(res):
    failed = [k for k, v in res.items() if k.endswith("_ok") and v != "1"]
    expect(read("exit-status").strip() == "0" and not failed,
           f"exit-status {read('exit-status').strip()!r}, driver checks failed: {failed}")


# --- socket activation and a dm name that is not UTF-8 (driver step 8) ---------------------------

def test_socket_activation_starts_the_service_on_the_first_connection(res):
    """The shipped mergewatchd.socket (installed by make install) holds [::]:9863; with --web.systemd-socket in
    the flags file, the first connection starts mergewatchd.service, which serves on that socket, IPv4 and IPv6."""
    expect(res.get("sock_start_rc") == "0", f"systemctl start mergewatchd.socket: {res.get('sock_start_rc')}")
    expect(res.get("sock_listen", "").startswith("[::]:9863"), f"socket listens on {res.get('sock_listen')!r}")
    expect(res.get("sock_service_before_first_connection") == "inactive",
           f"service before the first connection: {res.get('sock_service_before_first_connection')}")
    expect(res.get("sock_first_scrape_rc") == "0" and res.get("sock_service_active") == "active",
           f"first scrape rc {res.get('sock_first_scrape_rc')}, service {res.get('sock_service_active')}")
    expect("mergewatchd.socket" in res.get("sock_triggered_by", ""), f"TriggeredBy={res.get('sock_triggered_by')}")
    for name in ("metrics-socket.prom", "metrics-socket-ipv6.prom"):
        expect(attached(name).get("block_rq_issue") == 1, f"{name}: block_rq_issue not attached")
    expect(res.get("sock_ipv6_scrape_rc") == "0", "scrape through [::1]:9863 failed")
    log = read("journal-mergewatchd-socket.txt")
    expect("listening on [::]:9863" in log, "the daemon did not report serving on the systemd socket")
    expect(res.get("sock_stop_rc") == "0" and res.get("bpftool_after_socket_stop_programs") == "0",
           f"stop rc {res.get('sock_stop_rc')}, programs left {res.get('bpftool_after_socket_stop_programs')}")
    # The daemon must leave systemd's listening socket alone when it stops: a shutdown() on it fails the
    # .socket unit ("Got POLLHUP on a listening socket", result 'resources').
    expect(res.get("sock_socket_after_service_stop") == "active" and res.get("sock_active_after_stop") == "inactive",
           f"mergewatchd.socket after stopping the service: {res.get('sock_socket_after_service_stop')}, "
           f"after stopping itself: {res.get('sock_active_after_stop')}")
    print(f"socket activation: first scrape answered {res.get('sock_first_scrape_seconds')} s after connect")


def test_non_utf8_dm_name_scrape_passes_promtool(res):
    """`dmsetup --manglename none create $'latin\\xff'` on the NVMe disk: the scrape is valid UTF-8, shows the
    name as latin\\xff, and `promtool check metrics` accepts it (before: 'invalid label value')."""
    expect(res.get("odd_dm_create_rc") == "0" and res.get("odd_dm_device", "").startswith("dm-"),
           f"dmsetup create rc {res.get('odd_dm_create_rc')}, device {res.get('odd_dm_device')!r}")
    with open(RUN.file("metrics-odd-dm.prom"), "rb") as f:
        body = f.read()
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        pytest.fail(f"scrape is not UTF-8: {e}{diag()}", pytrace=False)
    dm = res["odd_dm_device"]
    expect(f'mergewatch_device_info{{device="{dm}",kind="dm",disk="{dm}",dm_name="latin\\\\xff",'.encode() in body,
           "the dm name is not shown as latin\\xff")
    r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60)
    expect(r.returncode == 0, f"promtool check metrics: rc {r.returncode}\n{r.stdout.decode()}{r.stderr.decode()}")
