# SPDX-License-Identifier: Apache-2.0
"""--log.format=json: every line the daemon writes, from start through scrapes and debug
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

import pytest

from conftest import DAEMON, free_port, wait_until


def run_daemon(*args, env_extra=None, stop_signal=signal.SIGTERM, expect_returncode=0):
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
            # Until the SIGHUP's line is written (pread: the daemon shares this file's offset).
            wait_until(lambda: b"SIGHUP: rescanning" in os.pread(err.fileno(), 1 << 24, 0), 30,
                       "the SIGHUP rescan's log line", interval=0.05)
        finally:
            proc.send_signal(stop_signal)
            proc.wait(timeout=30)
            err.seek(0)
            lines = err.read().splitlines()
    assert proc.returncode == expect_returncode, lines[-20:]
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


@pytest.mark.parametrize("fmt,journal", [("json", False), ("json", True), ("logfmt", False), ("logfmt", True)])
def test_a_fatal_signal_leaves_one_line_in_the_configured_format(fmt, journal):
    """SIGBUS stands for a crash: the handler writes one error line in the log format in force (it used to
    write logfmt under --log.format=json, a line a JSON shipper drops) and the process dies of the signal."""
    lines = run_daemon(f"--log.format={fmt}", env_extra={"JOURNAL_STREAM": "8:12345"} if journal else None,
                       stop_signal=signal.SIGBUS, expect_returncode=-signal.SIGBUS)
    last = lines[-1]
    if fmt == "json":
        record = json.loads(last)
        assert set(record) == {"ts", "level", "msg"} and record["level"] == "error", last
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"]), last
        msg = record["msg"]
    else:
        prefix = r"<3>" if journal else r"ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
        m = re.fullmatch(prefix + r'level=error msg="(.*)"', last)
        assert m, last
        msg = m.group(1)
    assert msg.startswith("fatal signal SIGBUS: mergewatchd dies"), last
    # The handler's own date arithmetic agrees with the clock (to the day, as the test may straddle midnight).
    if not journal or fmt == "json":
        stamp = record["ts"] if fmt == "json" else last.split()[0][3:]
        today = time.strftime("%Y-%m-%d", time.gmtime())
        assert stamp[:10] in (today, time.strftime("%Y-%m-%d", time.gmtime(time.time() - 120))), (stamp, today)
