# SPDX-License-Identifier: Apache-2.0
"""--log.format=json (issue 25, item 4): every line the daemon writes, from start through scrapes and debug
messages to shutdown, is one whole JSON object with ts, level and msg, also under journald (JOURNAL_STREAM set),
where logfmt lines get a "<N>" priority prefix and JSON lines must not."""
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request

from conftest import DAEMON, free_port


def run_daemon(*args, env_extra=None):
    """Runs the daemon until it serves a scrape, sends SIGHUP (a rescan: more lines) and SIGTERM; returns its
    stderr lines. stderr goes to a file, not a pipe: at --log.level=debug the start writes more than a pipe
    holds (1,800 lines), and a pipe nobody reads until the end blocked the daemon before it served."""
    port = free_port()
    env = dict(os.environ, **(env_extra or {}))
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen([DAEMON, f"--web.listen-address=127.0.0.1:{port}", "--log.level=debug", *args],
                                stdout=subprocess.DEVNULL, stderr=err, text=True, env=env)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                    break
                except OSError:
                    assert proc.poll() is None, "the daemon exited before it served"
                    assert time.monotonic() < deadline, "no scrape answered within 30 s"
                    time.sleep(0.1)
            os.kill(proc.pid, signal.SIGHUP)
            time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            err.seek(0)
            lines = err.read().splitlines()
    assert proc.returncode == 0, lines[-20:]
    return lines


def test_json_lines_parse_one_by_one_also_under_journald():
    for env in (None, {"JOURNAL_STREAM": "8:12345"}):
        lines = run_daemon("--log.format=json", env_extra=env)
        assert len(lines) >= 5, lines
        for line in lines:
            record = json.loads(line)  # a whole object per line: no prefix, nothing after
            assert isinstance(record, dict) and set(record) == {"ts", "level", "msg"}, line
            assert record["level"] in ("debug", "info", "warn", "error"), line
        messages = [json.loads(line)["msg"] for line in lines]
        assert any(m.startswith("ready:") for m in messages) and any("SIGHUP" in m for m in messages), messages


def test_logfmt_stays_the_default_and_bad_format_is_refused():
    lines = run_daemon(env_extra={"JOURNAL_STREAM": "8:12345"})
    assert all(re.match(r'^<\d>level=(debug|info|warn|error) msg="', line) for line in lines), lines[:3]
    r = subprocess.run([DAEMON, "--log.format=xml"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--log.format must be logfmt or json" in r.stderr, r.stderr
