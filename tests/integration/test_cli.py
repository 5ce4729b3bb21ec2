"""Every way mergewatchd can fail to start says what to do and exits with its own code."""
import signal
import subprocess

import pytest

from conftest import DAEMON, attached_bpf_link_ids, bpf_link_ids_of, free_port

EXIT_USAGE, EXIT_NO_BTF, EXIT_NO_PRIVILEGE, EXIT_LISTEN = 2, 3, 4, 5


def run(*args, user=None, timeout=30):
    cmd = [DAEMON, *args]
    if user:
        cmd = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", "--inh-caps=-all", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("mergewatchd ")


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
    r = run(f"--web.listen-address=127.0.0.1:{free_port()}", "--path.btf=/nonexistent/vmlinux")
    assert r.returncode == EXIT_NO_BTF, r.stderr
    assert "/nonexistent/vmlinux" in r.stderr and "CONFIG_DEBUG_INFO_BTF" in r.stderr


@pytest.mark.privileged
def test_unprivileged_user_is_told_what_is_needed():
    r = run(f"--web.listen-address=127.0.0.1:{free_port()}", user="nobody")
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
