# SPDX-License-Identifier: Apache-2.0
"""The `mergewatch` command against the real daemon on real loop devices: `status` during a merge
collapse and after it, `--json` against the scrape, no daemon or a wrong answer, TLS with basic auth
on a non-default telemetry path, and `top` in a real terminal (tmux)."""
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request

import pytest

from conftest import free_port, parse_samples
from test_collapse import POLICY, start_fio, stop_fio, wait_for

MERGEWATCH = os.environ.get("MERGEWATCH_CLI", os.path.join(os.path.dirname(__file__), "../../build/mergewatch"))


def mergewatch(*args, timeout=60):
    return subprocess.run([MERGEWATCH, *args], capture_output=True, text=True, timeout=timeout)


def url_of(daemon):
    return f"http://127.0.0.1:{daemon.port}"


@pytest.fixture
def detector(daemon_factory):
    return daemon_factory(*POLICY)


@pytest.mark.privileged
def test_status_names_the_collapse_with_nomerges_and_remedy_then_exit_0_once_merging_returns(detector, loop_device):
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=2)
    fio = start_fio(dev)
    try:
        wait_for(detector, dev, 1)
        r = mergewatch("status", "--url", url_of(detector), "--interval", "1s")
        print(r.stdout)
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        assert r.stderr == ""
        lines = r.stdout.splitlines()
        # The device row, marked, with the requests it is receiving.
        row = next(l for l in lines if l.startswith(f"! {dev.name} "))
        assert row.split()[2] not in ("0", "-"), row
        assert f"  {dev.name}: nomerges 2, scheduler none" in r.stdout
        assert f"MERGE COLLAPSE on {dev.name}: active" in r.stdout
        remedy = f"echo 0 > /sys/block/{dev.name}/queue/nomerges"
        assert f"  remedy:   {remedy}" in lines
        assert f"  cause:    nomerges=2 on {dev.name} (the block layer attempts no merge at all)" in lines
        # The same words as the daemon's alert line.
        assert f"Remedy: {remedy}" in detector.log_text()
        assert f"  {dev.name} requests: <=4K 100%" in lines

        dev.set_queue(nomerges=0)
        wait_for(detector, dev, 0)
        r = mergewatch("status", "--url", url_of(detector), "--interval", "1s")
        print(r.stdout)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        assert f"  {dev.name}: nomerges 0, scheduler none" in r.stdout
        assert "no merge collapse and no queue finding active" in r.stdout
        assert f"MERGE COLLAPSE on {dev.name}" not in r.stdout
        row = next(l for l in r.stdout.splitlines() if l.startswith(f"  {dev.name} "))
        assert row.split()[4] != "0", row  # merges made again
    finally:
        stop_fio(fio)


@pytest.mark.privileged
def test_json_holds_the_same_figures_as_the_scrape(detector, loop_device):
    dev = loop_device(size_mb=64)
    dev.set_queue(scheduler="none", nomerges=2)
    subprocess.run(["dd", f"if={dev.path}", "of=/dev/null", "bs=4k", "count=300", "iflag=direct"], check=True,
                   capture_output=True)
    # The device is quiet now: the scrape taken after the command holds the same counters.
    deadline = time.monotonic() + 30
    while f'device="{dev.name}"' not in detector.scrape_text():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    r = mergewatch("status", "--json", "--url", url_of(detector), "--interval", "500ms")
    assert r.returncode in (0, 1), r.stderr  # another helper's collapse on the host is not ours to judge
    doc = json.loads(r.stdout)
    s = parse_samples(detector.scrape_text())

    def total(name, **labels):
        return sum(v for (n, l), v in s.items() if n == name and all(dict(l).get(k) == x for k, x in labels.items()))

    device = next(d for d in doc["devices"] if d["name"] == dev.name)
    after = device["counters"]["after"]
    assert after["request_size_bytes"]["count"] == total("mergewatch_request_size_bytes_count", device=dev.name) >= 300
    assert after["request_size_bytes"]["sum"] == total("mergewatch_request_size_bytes_sum", device=dev.name)
    bucket_4k = next(b["count"] for b in after["request_size_bytes"]["buckets"] if b["le"] == 4096)
    assert bucket_4k == total("mergewatch_request_size_bytes_bucket", device=dev.name, le="4096")
    assert after["request_latency_seconds"]["count"] == total("mergewatch_request_latency_seconds_count", device=dev.name)
    assert after["missed_merges"] == total("mergewatch_missed_merges_total", device=dev.name)
    assert after["back_merges"] == total("mergewatch_bio_merges_total", device=dev.name, kind="back")
    assert device["queue"] == {"nomerges": 2, "scheduler": "none", "rotational": 0,
                               "max_sectors_kb": total("mergewatch_queue_max_sectors_bytes", device=dev.name) / 1024}
    # The rates are the difference of the raw counters over the interval.
    before = device["counters"]["before"]
    assert device["rates"]["requests_per_second"] == pytest.approx(
        (after["request_size_bytes"]["count"] - before["request_size_bytes"]["count"]) / doc["interval_seconds"])
    assert device["collapsed"] is False
    with urllib.request.urlopen(f"{url_of(detector)}/status", timeout=10) as resp:
        status = json.load(resp)
    ours = [v for v in status["verdicts"] if v["device"] == dev.name]
    assert [v["device"] for v in doc["verdicts"] if v["device"] == dev.name] == [v["device"] for v in ours]


def test_no_daemon_exit_2_and_one_line():
    port = free_port()
    r = mergewatch("status", "--url", f"http://127.0.0.1:{port}")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(
        f"mergewatch: cannot reach mergewatchd at http://127.0.0.1:{port}/metrics: "), r.stderr
    r = mergewatch("status", "--json", "--url", f"http://127.0.0.1:{port}")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1


class Answer(http.server.BaseHTTPRequestHandler):
    bodies = {}

    def do_GET(self):
        status, body = self.bodies.get(self.path, (404, "404 page not found\n"))
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("bodies,says", [
    ({"/metrics": (200, "<html><body>router login</body></html>\n")},
     "answered something that is not a Prometheus exposition: line 1: expected a metric name"),
    ({"/metrics": (200, "node_load1 0.5\n")}, "answers metrics, but not mergewatchd's"),
    ({"/metrics": (401, "401 Unauthorized\n")}, "answered HTTP 401 (basic auth"),
    ({"/metrics": (200, "mergewatch_build_info{version=\"x\",kernel=\"y\"} 1\n"), "/status": (200, "{\"a\": 1}")},
     "/status: the status document has no verdicts and findings lists"),
    ({}, "answered HTTP 404 (is the telemetry path right?"),
])
def test_an_unusable_answer_exits_2_with_one_line_saying_why(fake_endpoint, bodies, says):
    Answer.bodies = bodies
    r = mergewatch("status", "--url", fake_endpoint, "--interval", "100ms")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "" and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


@pytest.fixture
def web_tls(tmp_path):
    """A self-signed certificate for 127.0.0.1 and a basic auth user, as a mergewatchd web config."""
    import bcrypt
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    password = "pw-" + os.urandom(8).hex()
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)).decode()
    config = tmp_path / "web-config.yml"
    config.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                      f"basic_auth_users:\n  prometheus: {hashed}\n")
    password_file = tmp_path / "password"
    password_file.write_text(password + "\n")
    return {"config": str(config), "cert": str(cert), "password_file": str(password_file), "password": password,
            "dir": tmp_path}


@pytest.mark.privileged
def test_tls_basic_auth_and_a_non_default_telemetry_path(daemon_factory, web_tls):
    d = daemon_factory(f"--web.config.file={web_tls['config']}", "--web.telemetry-path=/mw/metrics")
    url = f"https://127.0.0.1:{d.port}/mw/metrics"
    r = mergewatch("status", "--url", url, "--ca-file", web_tls["cert"], "--user", "prometheus",
                   "--password-file", web_tls["password_file"], "--interval", "200ms")
    assert r.returncode in (0, 1), r.stderr  # 1 only for another helper's collapse on the host
    assert r.stdout.startswith(f"mergewatch status: {url}\n"), r.stdout
    # The same through a client config file, relative paths from its folder.
    client = web_tls["dir"] / "client.yml"
    client.write_text(f"url: {url}\ntls_config:\n  ca_file: server.crt\n"
                      f"basic_auth:\n  username: prometheus\n  password_file: password\n")
    r = mergewatch("status", "--config", str(client), "--interval", "200ms")
    assert r.returncode in (0, 1), r.stderr
    # /status sits behind the same auth as the metrics.
    r = mergewatch("status", "--url", url, "--ca-file", web_tls["cert"], "--interval", "200ms")
    assert r.returncode == 2 and "answered HTTP 401" in r.stderr, r.stderr
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", web_tls["cert"],
                        f"https://127.0.0.1:{d.port}/mw/status"], capture_output=True, text=True)
    assert r.stdout == "401"
    r = subprocess.run(["curl", "-s", "--cacert", web_tls["cert"], "-u", f"prometheus:{web_tls['password']}",
                        f"https://127.0.0.1:{d.port}/mw/status"], capture_output=True, text=True)
    assert "verdicts" in json.loads(r.stdout)
    # An unknown CA is refused, not skipped.
    r = mergewatch("status", "--url", url, "--user", "prometheus", "--password-file", web_tls["password_file"])
    assert r.returncode == 2 and "cannot reach mergewatchd" in r.stderr, r.stderr


class Tmux:
    """A tmux server of its own (-L), so no other session on the host is touched."""

    def __init__(self, width, height, command):
        self.socket = f"mergewatch-test-{os.getpid()}-{time.monotonic_ns()}"
        self.tmux(["new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height), command])

    def tmux(self, args, check=True):
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=check,
                              timeout=10)

    def screen(self):
        return self.tmux(["capture-pane", "-p", "-t", "top"]).stdout.splitlines()

    def alive(self):
        return self.tmux(["has-session", "-t", "top"], check=False).returncode == 0

    def wait_screen(self, predicate, what, seconds=30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            lines = self.screen()
            if predicate(lines):
                return lines
            time.sleep(0.2)
        raise AssertionError(f"{what} not on the screen within {seconds} s:\n" + "\n".join(self.screen()))

    def kill(self):
        self.tmux(["kill-server"], check=False)


@pytest.mark.privileged
def test_top_in_a_terminal_marks_the_collapsing_device_fits_80_columns_and_q_quits(detector, loop_device):
    assert shutil.which("tmux"), "tmux is a test package (make deps)"
    dev = loop_device(size_mb=256)
    dev.set_queue(scheduler="none", nomerges=2)
    fio = start_fio(dev)
    term = Tmux(80, 24, f"{MERGEWATCH} top --url {url_of(detector)}")
    try:
        wait_for(detector, dev, 1)
        lines = term.wait_screen(lambda ls: any(l.startswith(f"! {dev.name} ") for l in ls), "the marked device row")
        print("\n".join(lines))
        assert lines[0].startswith("mergewatch top  http://127.0.0.1:") and "q quits" in lines[0]
        assert lines[1].split()[:3] == ["DEVICE", "REQ/S", "REQSZ"] and lines[1].rstrip().endswith("SCHED")
        row = next(l for l in lines if l.startswith(f"! {dev.name} "))
        assert row.split()[-2:] == ["2", "none"], row  # nomerges, scheduler
        # A line longer than the screen ends in '>' at its last column (a loop device numbered 100 or more
        # makes the cause 81 columns).
        def on_screen(text, width=80):
            return text if len(text) <= width else text[:width - 1] + ">"
        assert on_screen(f"! COLLAPSE {dev.name}: nomerges=2 on {dev.name} (the block layer attempts no merge at all)") \
            in lines
        assert on_screen(f"  remedy: echo 0 > /sys/block/{dev.name}/queue/nomerges") in lines
        assert all(len(l) <= 80 for l in lines)
        # Narrower: columns go, and the screen says which.
        term.tmux(["resize-window", "-t", "top", "-x", "50", "-y", "24"])
        lines = term.wait_screen(lambda ls: len(ls) > 1 and ls[1].startswith("narrow terminal, hidden: "),
                                 "the narrow-terminal note")
        assert all(len(l) <= 50 for l in lines)
        assert any(l.startswith(f"! {dev.name} ") for l in lines)
        term.tmux(["resize-window", "-t", "top", "-x", "20", "-y", "24"])
        term.wait_screen(lambda ls: ls and ls[0].startswith("terminal too narrow"), "the too-narrow line")
        term.tmux(["send-keys", "-t", "top", "q"])
        deadline = time.monotonic() + 30
        while term.alive():
            assert time.monotonic() < deadline, "mergewatch top did not quit on q:\n" + "\n".join(term.screen())
            time.sleep(0.1)
    finally:
        term.kill()
        stop_fio(fio)


MAN_PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "mergewatch.8")


def test_man_page_renders_without_warnings_and_lists_the_help_flags_and_defaults():
    import re
    r = subprocess.run(["groff", "-ww", "-man", "-Tascii", "-P-cbou", MAN_PAGE], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    text = r.stdout
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "ENVIRONMENT", "EXAMPLES"):
        assert f"\n{section}\n" in text, f"man page has no {section} section"
    env = dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0", LC_ALL="C.UTF-8")
    r = subprocess.run(["man", "--warnings=all", "-l", MAN_PAGE], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr

    options = text.split("\nOPTIONS\n", 1)[1].split("\nEXIT STATUS\n", 1)[0]
    man = {}  # tag lines; a short tag has its text on the same line
    for m in re.finditer(r"^ {7}(?:-h, )?(--[a-z-]+)(?:=\S+)?(?: \(default: (\S+)\))?(?=$|\s)", options, re.M):
        man[m.group(1)] = m.group(2) or ""
    shown = {}
    for args in (["--help"], ["status", "--help"], ["top", "--help"]):
        r = mergewatch(*args)
        assert r.returncode == 0, r.stderr
        for line in r.stdout.splitlines():
            m = re.match(r"\s+(?:-h,)?(--[a-z-]+)(.*)", line)
            if m:
                default = re.match(r" [A-Z]+=(\S+)", m.group(2))
                shown[m.group(1)] = default.group(1) if default else ""
    assert man == shown
    assert mergewatch("--version").stdout.startswith("mergewatch ")
