# SPDX-License-Identifier: Apache-2.0
"""The systemd unit, offline (PID 1 need not be systemd): verify, exposure score, and the daemon run under
the unit's identity, capabilities, system-call filter and notify/watchdog contract without a service manager."""
import os
import re
import shutil
import signal
import socket
import time

import pytest

from conftest import DEPLOY, REPO, UNIT_TEMPLATE, daemon_binary, free_port, http_get, run, tool, wait_until

MAX_EXPOSURE = 2.0
DEFAULT_FILE = os.path.join(DEPLOY, "default", "mergewatchd")
PRE_58_DROPIN = os.path.join(DEPLOY, "systemd", "examples", "pre-5.8-kernel.conf")


def unit_settings():
    """{key: [values]} of the [Service] section of the unit template."""
    settings, section = {}, None
    for line in open(UNIT_TEMPLATE):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, val = line.partition("=")
        settings.setdefault((section, key), []).append(val)
    return settings


def staged_unit(workdir, dropins=()):
    """The unit with @SBINDIR@ pointing at the built daemon (verify checks that ExecStart is executable)."""
    sbin = os.path.join(workdir, "sbin")
    os.makedirs(sbin, exist_ok=True)
    link = os.path.join(sbin, "mergewatchd")
    if not os.path.lexists(link):
        os.symlink(daemon_binary(), link)
    unit = os.path.join(workdir, "mergewatchd.service")
    with open(unit, "w") as f:
        f.write(open(UNIT_TEMPLATE).read().replace("@SBINDIR@", sbin).replace("@DOCDIR@", "/usr/share/doc/mergewatch"))
    # Documentation=man:mergewatchd(8): verify runs `man` on it, so the page must be found (verify_env).
    man8 = os.path.join(workdir, "man", "man8")
    os.makedirs(man8, exist_ok=True)
    shutil.copy(os.path.join(REPO, "docs", "mergewatchd.8"), man8)
    if dropins:
        d = os.path.join(workdir, "mergewatchd.service.d")
        os.makedirs(d, exist_ok=True)
        for path in dropins:
            shutil.copy(path, d)
    return unit


def verify_env(workdir):
    """systemd-analyze verify checks each man: Documentation= with `man`: the staged man page only."""
    return dict(os.environ, MANPATH=os.path.join(workdir, "man"))


def exposure(unit, cwd):
    r = run([tool("systemd-analyze"), "security", "--offline=yes", "--no-pager", unit], cwd=cwd)
    m = re.search(r"Overall exposure level for mergewatchd\.service: (\d+\.\d+)", r.stdout)
    assert m, f"no overall exposure in:\n{r.stdout}{r.stderr}"
    return float(m.group(1)), r.stdout


def test_unit_template_has_the_required_settings():
    s = unit_settings()
    svc = lambda k: s.get(("[Service]", k), [])  # noqa: E731
    assert svc("Type") == ["notify"]
    assert svc("Restart") == ["on-failure"]
    assert svc("WatchdogSec") and svc("WatchdogSec")[0].endswith("s")
    assert svc("EnvironmentFile") == ["-/etc/default/mergewatchd"]
    assert svc("ExecStart") == ["@SBINDIR@/mergewatchd $MERGEWATCHD_ARGS"]
    assert svc("AmbientCapabilities") == svc("CapabilityBoundingSet") == ["CAP_BPF CAP_PERFMON"]
    assert svc("ProtectSystem") == ["strict"] and svc("NoNewPrivileges") == ["yes"]
    assert svc("RestrictAddressFamilies") == ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"]  # sd_notify, listeners, uevents
    allowed = svc("SystemCallFilter")[0].split()
    assert "bpf" in allowed and "perf_event_open" in allowed
    for denied in svc("SystemCallFilter")[1:]:
        assert denied.startswith("~") and "@privileged" not in denied and "@debug" not in denied
    assert ("[Install]", "WantedBy") in s


def test_default_file_only_sets_mergewatchd_args():
    assignments = [line for line in open(DEFAULT_FILE) if line.strip() and not line.lstrip().startswith("#")]
    assert assignments == ["MERGEWATCHD_ARGS=\n"]


def test_systemd_analyze_verify_is_clean(workdir):
    """verify exits 0 even for unknown keys, so its output must be empty too."""
    unit = staged_unit(workdir)
    r = run([tool("systemd-analyze"), "verify", unit], cwd=workdir, env=verify_env(workdir))
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


def test_systemd_analyze_verify_is_clean_with_the_pre_5_8_dropin(workdir):
    unit = staged_unit(workdir, dropins=[PRE_58_DROPIN])
    r = run([tool("systemd-analyze"), "verify", unit], cwd=workdir, env=verify_env(workdir))
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    score, report = exposure(unit, workdir)
    assert "CAP_SYS_ADMIN" in report and "Service has administrator privileges" in report, report
    print(f"exposure with the pre-5.8 drop-in: {score}")


def test_security_exposure_is_at_most_2(workdir):
    unit = staged_unit(workdir)
    score, report = exposure(unit, workdir)
    print(f"systemd-analyze security --offline=yes: overall exposure {score}")
    assert score <= MAX_EXPOSURE, report


# --- the daemon as the unit runs it, without systemd -------------------------------------------------

def unit_capabilities():
    caps = unit_settings()[("[Service]", "AmbientCapabilities")][0].split()
    return ",".join("+" + c.lower().removeprefix("cap_") for c in caps)


def watchdog_usec():
    value = unit_settings()[("[Service]", "WatchdogSec")][0]
    m = re.fullmatch(r"(\d+)s", value)
    assert m, f"WatchdogSec={value}: this test reads plain seconds"
    return int(m.group(1)) * 1_000_000


def as_unit_user(cmd):
    """setpriv: a non-root uid (DynamicUser) with only the unit's capabilities, NoNewPrivileges=yes."""
    caps = unit_capabilities()
    return [tool("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", f"--inh-caps=-all,{caps}",
            f"--ambient-caps=-all,{caps}", f"--bounding-set=-all,{caps}", "--no-new-privs", *cmd]


def public_copy_of_daemon(workdir):
    """The unit's user must reach the binary: a copy in a world-traversable directory."""
    os.chmod(workdir, 0o755)
    path = os.path.join(workdir, "mergewatchd")
    shutil.copy(daemon_binary(), path)
    os.chmod(path, 0o755)
    return path


@pytest.mark.privileged
def test_daemon_runs_with_only_the_units_capabilities_and_speaks_notify_and_watchdog(workdir, processes):
    """Non-root, CAP_BPF+CAP_PERFMON only, no_new_privs, NOTIFY_SOCKET and WATCHDOG_USEC as the unit sets them:
    READY after attach, WATCHDOG=1 well within WatchdogSec/2, STOPPING=1 and exit 0 on SIGTERM."""
    daemon = public_copy_of_daemon(workdir)
    sock_path = os.path.join(workdir, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    os.chmod(sock_path, 0o777)
    sock.settimeout(1)
    try:
        port = free_port()
        wd = watchdog_usec()
        env = dict(os.environ, NOTIFY_SOCKET=sock_path, WATCHDOG_USEC=str(wd))
        env.pop("WATCHDOG_PID", None)
        d = processes("mergewatchd-unit-user", as_unit_user([daemon, f"--web.listen-address=127.0.0.1:{port}"]),
                      env=env)
        messages = []

        def got(token):
            d.assert_running()
            try:
                messages.append((time.monotonic(), sock.recv(4096).decode()))
            except socket.timeout:
                pass
            return any(token in m for _, m in messages)

        wait_until(lambda: got("READY=1"), 30, "READY=1", interval=0, on_timeout=d.log)
        status, text = http_get(f"http://127.0.0.1:{port}/metrics")
        assert re.search(r'mergewatch_bpf_program_attached\{tracepoint="block_rq_issue",mode="\w+"\} 1', text), text
        assert re.search(r'mergewatch_bpf_program_attached\{tracepoint="block_rq_complete",mode="\w+"\} 1', text)
        with open(f"/proc/{d.pid}/status") as f:
            proc_status = f.read()
        assert re.search(r"^Uid:\s+65534\b", proc_status, re.M), proc_status
        assert re.search(r"^NoNewPrivs:\s+1$", proc_status, re.M), proc_status

        # Three pings from here on, however long a loaded host takes (a second apart on a quiet one): the
        # contract is in the gaps, each below WatchdogSec/2, the first counted from here.
        start = time.monotonic()

        def pings():
            return [t for t, m in messages if "WATCHDOG=1" in m and t >= start]

        def three_pings():
            got("WATCHDOG=1")  # receives what came, or waits up to 1 s
            return len(pings()) >= 3
        wait_until(three_pings, wd / 1e6, "three WATCHDOG=1", interval=0, on_timeout=d.log)
        gaps = [b - a for a, b in zip([start] + pings(), pings())]
        assert max(gaps) < wd / 2e6, f"watchdog gaps {gaps} against WatchdogSec/2 = {wd / 2e6} s"

        os.kill(d.pid, signal.SIGTERM)
        wait_until(lambda: got("STOPPING=1"), 20, "STOPPING=1", interval=0, on_timeout=d.log)
        assert d.proc.wait(timeout=20) == 0, d.log()
    finally:
        sock.close()


def allowed_syscalls():
    """Expand the unit's SystemCallFilter= lines with systemd-analyze syscall-filter."""
    def expand(item, seen=None):
        seen = seen if seen is not None else set()
        if not item.startswith("@"):
            return {item}
        if item in seen:
            return set()
        seen.add(item)
        out = run([tool("systemd-analyze"), "syscall-filter", "--no-pager", item]).stdout
        names = set()
        for line in out.splitlines()[1:]:
            line = line.strip()
            if line and not line.startswith("#"):
                names |= expand(line, seen)
        return names

    lines = unit_settings()[("[Service]", "SystemCallFilter")]
    allowed = set()
    for item in lines[0].split():
        allowed |= expand(item)
    for line in lines[1:]:
        for item in line.lstrip("~").split():
            allowed -= expand(item)
    return allowed


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


@pytest.mark.privileged
def test_daemon_stays_inside_the_units_sandbox(workdir, processes):
    """strace the daemon through start, scrapes and SIGTERM: every system call is in the unit's
    SystemCallFilter, sockets are of the unit's RestrictAddressFamilies only (AF_NETLINK for uevents included), nothing is opened for writing, and only
    /proc/self and sysfs/library paths are read (ProtectSystem=strict, ProcSubset=pid, PrivateDevices)."""
    daemon = daemon_binary()
    port = free_port()
    trace = os.path.join(workdir, "strace.out")
    tracer = processes("strace", [tool("strace"), "-f", "-qq", "-o", trace, daemon,
                                  f"--web.listen-address=127.0.0.1:{port}"])
    # strace's child is the daemon only once it has exec'd it; before that it is strace's own fork.
    def traced_daemon():
        for pid in children(tracer.pid):
            try:
                if os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(daemon):
                    return pid
            except OSError:
                pass
        return None
    wait_until(traced_daemon, 30, "the traced daemon to start", on_timeout=tracer.log)
    daemon_pid = traced_daemon()
    try:
        # strace stops the daemon at every system call: under load its start takes several times longer.
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200, 90, "the first scrape",
                   on_timeout=tracer.log)
        http_get(f"http://127.0.0.1:{port}/metrics")
        http_get(f"http://127.0.0.1:{port}/")
        # A couple of main-loop ticks traced: the main thread's poll() timing out three times more (each
        # timeout is followed by a tick), counted in the trace (strace writes it line by line).
        mark = os.path.getsize(trace)
        timeouts = re.compile(rb"^%d .*poll.*\) += 0 \(Timeout\)$" % daemon_pid, re.M)

        def ticks():
            with open(trace, "rb") as f:
                f.seek(mark)
                return len(timeouts.findall(f.read())) >= 3
        wait_until(ticks, 60, "three main-loop ticks in the trace", interval=0.2, on_timeout=tracer.log)
        os.kill(daemon_pid, signal.SIGTERM)
        tracer.proc.wait(timeout=90)
    finally:
        # Killing strace detaches the daemon and leaves it running: stop it by its own PID.
        if tracer.proc.poll() is None:
            try:
                os.kill(daemon_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    text = open(trace).read()
    used = set(re.findall(r"^\d+\s+(?:<\.\.\. )?([a-z_0-9]+)[( ]", text, flags=re.M)) - {"exit", "exit_group",
                                                                                         "execve"}
    assert "bpf" in used, "the trace shows no bpf(): did the daemon start?"
    outside = sorted(used - allowed_syscalls())
    assert not outside, f"system calls the unit's SystemCallFilter would refuse: {outside}"

    families = set(re.findall(r"socket\((AF_\w+)", text))
    allowed_families = set(unit_settings()[("[Service]", "RestrictAddressFamilies")][0].split())
    assert families <= allowed_families, families
    assert "AF_NETLINK" in families, "no uevent socket: device events would not work under the unit"

    opened = re.findall(r'open(?:at)?\((?:AT_FDCWD, )?"([^"]+)", ([A-Z_|]+)', text)
    writes = [(p, f) for p, f in opened if re.search(r"O_WRONLY|O_RDWR|O_CREAT", f)]
    assert not writes, f"opened for writing (ProtectSystem=strict): {writes}"
    proc_paths = [p for p, _ in opened if p.startswith("/proc/") and not re.match(r"/proc/(self|\d+)/", p)]
    assert not proc_paths, f"/proc outside the process's own (ProcSubset=pid): {proc_paths}"
    dev_paths = [p for p, _ in opened if p.startswith("/dev/") and p not in
                 ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")]
    assert not dev_paths, f"devices beyond PrivateDevices=yes: {dev_paths}"
