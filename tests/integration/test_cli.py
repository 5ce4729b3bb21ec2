# SPDX-License-Identifier: Apache-2.0
"""Every way mergewatchd can fail to start says what to do and exits with its own code."""
import os
import re
import signal
import subprocess
import tempfile

import pytest

from conftest import DAEMON, attached_bpf_link_ids, bpf_link_ids_of, free_port, wait_until

EXIT_USAGE, EXIT_NO_BTF, EXIT_NO_PRIVILEGE, EXIT_LISTEN = 2, 3, 4, 5


def run(*args, user=None, timeout=30):
    cmd = [DAEMON, *args]
    if user:
        cmd = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", "--inh-caps=-all", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_version():
    """node_exporter's layout: version, branch and revision (this is a git build), build date, toolchain."""
    r = run("--version")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert re.match(r"^mergewatchd, version \S+ \(branch: \S+, revision: [0-9a-f]{40}\)$", lines[0]), r.stdout
    assert re.match(r"^  build date: +\d{8}-\d\d:\d\d:\d\d$", lines[1]), r.stdout
    assert re.match(r"^  toolchain: +\S", lines[2]) and re.match(r"^  platform: +linux/\S+$", lines[3]), r.stdout


def test_unknown_flag():
    r = run("--web.listen-adress=:1")
    assert r.returncode == EXIT_USAGE
    assert "--web.listen-adress" in r.stderr and "--help" in r.stderr


def test_bad_listen_address():
    r = run("--web.listen-address=nohost:abc")
    assert r.returncode == EXIT_USAGE
    assert "port must be a number" in r.stderr


@pytest.mark.privileged
def test_missing_btf_is_explained():
    # --source=bpf: the default (auto) runs on diskstats instead (test_diskstats_source.py).
    r = run(f"--web.listen-address=127.0.0.1:{free_port()}", "--path.btf=/nonexistent/vmlinux", "--source=bpf")
    assert r.returncode == EXIT_NO_BTF, r.stderr
    assert "/nonexistent/vmlinux" in r.stderr and "CONFIG_DEBUG_INFO_BTF" in r.stderr


@pytest.mark.privileged
def test_unprivileged_user_is_told_what_is_needed():
    r = run(f"--web.listen-address=127.0.0.1:{free_port()}", "--source=bpf", user="nobody")
    assert r.returncode == EXIT_NO_PRIVILEGE, r.stderr
    assert "CAP_BPF" in r.stderr and "root" in r.stderr


@pytest.mark.privileged
def test_port_in_use_fails_cleanly_and_leaves_the_first_instance_alone(daemon):
    r = run(f"--web.listen-address=127.0.0.1:{daemon.port}")
    assert r.returncode == EXIT_LISTEN, r.stderr
    assert f"cannot listen on 127.0.0.1:{daemon.port}" in r.stderr and "--web.listen-address" in r.stderr
    assert "mergewatch_build_info" in daemon.scrape_text()


@pytest.mark.privileged
def test_unknown_paths_are_404_and_landing_page_links_metrics(daemon):
    import urllib.error
    import urllib.request
    assert 'href="/metrics"' in daemon.scrape_text("/")
    for path in ("/etc/passwd", "/metrics/../../etc/passwd", "/metrics/x", "/../../etc/passwd"):
        with pytest.raises(urllib.error.HTTPError) as e:
            daemon.scrape_text(path)
        assert e.value.code == 404, path


@pytest.mark.privileged
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_detach_every_link(daemon_factory, sig):
    d = daemon_factory()
    ours = bpf_link_ids_of(d.proc.pid)
    assert len(ours) >= 5, "the daemon should hold its links while running"
    assert ours <= attached_bpf_link_ids()
    assert d.stop(sig) == 0
    assert "BPF programs detached" in d.log_text()
    assert ours.isdisjoint(attached_bpf_link_ids()), "links left attached after " + sig.name


@pytest.mark.privileged
def test_reports_attach_mode_and_programs(daemon):
    text = daemon.scrape_text()
    for tp in ("block_rq_insert", "block_rq_issue", "block_rq_complete", "block_bio_backmerge",
               "block_bio_frontmerge"):
        assert f'mergewatch_bpf_program_attached{{tracepoint="{tp}",mode="tp_btf"}} 1' in text
    assert "mergewatch_build_info{" in text


def bpf_maps_of(pid):
    """{name: max_entries} of the BPF maps a process holds (fdinfo gives the id, bpftool the name)."""
    import json
    import os
    maps = {}
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except OSError:
            continue
        if "map_id" in info:
            shown = json.loads(subprocess.run(["bpftool", "-j", "map", "show", "id", info["map_id"]],
                                              capture_output=True, text=True, check=True, timeout=30).stdout)
            maps[shown["name"]] = int(info["max_entries"])
    return maps


@pytest.mark.privileged
@pytest.mark.parametrize("entries,slots", [(100, 128), (64, 64), (65537, 131072)])
def test_inflight_entries_round_up_to_a_power_of_two(daemon_factory, entries, slots):
    """docs/operations.md ("Flags"): --bpf.inflight-entries is rounded up to a power of two. The kernel's map, the
    exported capacity and the log agree on the rounded size; a power of two is kept as it is."""
    d = daemon_factory(f"--bpf.inflight-entries={entries}")
    assert bpf_maps_of(d.proc.pid)["inflight"] == slots
    assert 'mergewatch_bpf_inflight_capacity ' + str(slots) + "\n" in d.scrape_text()
    rounded = f"in-flight table: {slots} slots (--bpf.inflight-entries={entries} rounded up to a power of two)"
    assert (rounded in d.log_text()) == (entries != slots), d.log_text()


def test_inflight_entries_out_of_range_is_a_usage_error():
    for entries in ("63", str((1 << 22) + 1)):
        r = run(f"--bpf.inflight-entries={entries}")
        assert r.returncode == EXIT_USAGE and "--bpf.inflight-entries" in r.stderr, (entries, r.stderr)


EXIT_BPF_LOAD = 6


def started_or_exited(proc):
    """"exited", or "started" once the daemon holds the signalfd of its main loop; None before either."""
    if proc.poll() is not None:
        return "exited"
    try:
        for fd in os.listdir(f"/proc/{proc.pid}/fd"):
            if os.readlink(f"/proc/{proc.pid}/fd/{fd}") == "anon_inode:[signalfd]":
                return "started"
    except OSError:  # exiting, or a descriptor closed meanwhile: the next poll tells
        pass
    return None


@pytest.mark.privileged
def test_bpf_load_or_attach_failure_exits_6_with_libbpf_lines():
    """Too few file descriptors (RLIMIT_NOFILE) for the maps, programs or links, once the listen
    socket is open: neither missing BTF nor privilege, so exit 6 with libbpf's reason. Raising the
    limit two at a time walks through loading, then attaching (a window of ~8 descriptors here: one per link), to a
    daemon that starts."""
    stages = set()
    for nofile in range(8, 64, 2):
        port = free_port()
        with tempfile.TemporaryFile(mode="w+") as err:
            proc = subprocess.Popen(["prlimit", f"--nofile={nofile}", DAEMON,
                                     f"--web.listen-address=127.0.0.1:{port}", "--source=bpf"],
                                    stdout=subprocess.DEVNULL, stderr=err, text=True)  # prlimit execs: same PID
            outcome = None
            try:
                # Whichever comes first, however long a loaded host takes: an exit, or the signalfd of
                # the main loop (past the last descriptor the start needs). Not a guess from a quiet host's
                # start time: a slow failure is not taken for a start.
                outcome = wait_until(lambda: started_or_exited(proc), 120, f"mergewatchd with {nofile} descriptors "
                                     "to exit or reach its main loop", interval=0.05)
            finally:
                if proc.poll() is None and outcome != "started":
                    proc.kill()
                    proc.wait()
            if outcome == "started":  # enough descriptors
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=20) == 0
                break
            err.seek(0)
            stderr = err.read()
        if "programs attached" in stderr and "Too many open files" in stderr:
            # Serving already, the descriptors ran out for what comes after (the signalfd): a
            # runtime failure, exit 1 with the reason; only a descriptor count can land here.
            assert proc.returncode == 1 and "cannot attach to" in stages, (nofile, proc.returncode, stderr, stages)
            stages.add("after serving")
            continue
        if "cannot start the HTTP server" in stderr:
            # Past attaching, the HTTP server's own threads and epoll need descriptors too: that is
            # the endpoint failing to come up (exit 5, as for a listen failure), with the reason.
            assert proc.returncode == EXIT_LISTEN and "Too many open files" in stderr, (nofile, stderr)
            assert "cannot attach to" in stages, ("the HTTP server is started after the programs attach", stages)
            stages.add("http server")
            continue
        assert proc.returncode == EXIT_BPF_LOAD, (nofile, proc.returncode, stderr)
        # docs/operations.md ("Exit codes"): "the message carries libbpf's last lines" (the reason varies with where the
        # descriptors ran out: EMFILE, or EINVAL from a feature probe that could not open its map).
        assert "libbpf: " in stderr and ("Too many open files" in stderr or "-22" in stderr), (nofile, stderr)
        stages |= {stage for stage in ("did not load in any mode", "cannot attach to") if stage in stderr}
    else:
        raise AssertionError("mergewatchd did not start with 63 file descriptors")
    assert {"did not load in any mode", "cannot attach to"} <= stages, (nofile, stages)
