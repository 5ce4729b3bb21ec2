# SPDX-License-Identifier: Apache-2.0
"""A real merge collapse for the dashboard: used by tests/deploy/test_mixin.py (every dashboard query returns
data) and docs/dashboard_picture.py (docs/dashboard.png). Real parts only:

- a RAM-backed loop device with the mq-deadline scheduler (so requests are inserted and queue latency exists)
  and nomerges=2, read by fio with 4 KiB direct I/O submitted in batches of 64 (the e2e test's collapse);
- mergewatchd watching that loop device with short detector times (its "host");
- a second mergewatchd reading the seed-lvm-snapshot sysfs fixture (an LVM snapshot on NVMe, as in 2019):
  this host has no device-mapper, so only that daemon can show the stacking (holders, dm/LVM names);
- Prometheus scraping both every second as job "mergewatch", and the first a second time as another host whose
  kernel label is relabelled (a second kernel cohort for the dashboard's cohort row).

Everything started here is stopped by PID, the loop device detached, in stop().
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests"))
from mwtest import LoopDevice, free_port  # noqa: E402

DASHBOARD = os.path.join(REPO, "deploy", "grafana", "mergewatch.json")
STACKED_SYSFS = os.path.join(REPO, "tests", "fixtures", "sysfs", "seed-lvm-snapshot")
# Detector policy in seconds (the e2e test's): raise a few seconds into the collapse.
POLICY = ["--collapse.require-upper=none", "--collapse.window=5s", "--collapse.raise-after=2s",
          "--collapse.clear-after=4s"]
RATE_INTERVAL = "10s"  # what $__rate_interval stands for: ten 1 s scrapes
OTHER_KERNEL = "6.1.0-27-amd64"  # the second kernel cohort's release (a relabelled scrape of the loop daemon)
# What marks a kernel cohort query: the join that takes the kernel from mergewatch_build_info.
COHORT_JOIN = "group_left (kernel)"


class Failure(Exception):
    pass


def get_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_until(predicate, timeout, what, diag=lambda: ""):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except Exception as e:  # noqa: BLE001 - the thing polled may not be up yet
            last = e
        time.sleep(0.25)
    raise Failure(f"timed out after {timeout} s waiting for {what} (last error: {last})\n{diag()}")


def tool(name):
    path = shutil.which(name)
    if path is None:
        raise Failure(f"{name} not found (make deps)")
    return path


class DashboardRun:
    def __init__(self, daemon):
        self.daemon = daemon
        self.dir = tempfile.mkdtemp(prefix="mergewatch-dashboard-")
        self.procs = []
        self.dev = None

    # --- processes ---------------------------------------------------------------------------------------

    def _start(self, name, cmd):
        log = open(os.path.join(self.dir, f"{name}.log"), "wb")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        p.name, p.log_file = name, log
        self.procs.append(p)
        return p

    def log(self, name, tail=30):
        path = os.path.join(self.dir, f"{name}.log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f"--- {name} log ---\n" + "\n".join(f.read().splitlines()[-tail:])

    def diag(self):
        return "\n".join(self.log(p.name) for p in self.procs)

    def _daemon(self, name, port, *args):
        p = self._start(name, [self.daemon, f"--web.listen-address=127.0.0.1:{port}", *args])

        def ready():
            if p.poll() is not None:
                raise Failure(f"{name} exited with {p.returncode}\n{self.log(name)}")
            with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
                return 'msg="ready:' in f.read()
        wait_until(ready, 30, f"{name} to report ready", lambda: self.log(name))
        return p

    def start(self):
        self.dev = LoopDevice(size_mb=128)
        self.dev.set_queue(scheduler="mq-deadline", nomerges=2)
        ports = set()
        while len(ports) < 3:
            ports.add(free_port())
        self.loop_port, self.stacked_port, self.prom_port = sorted(ports)
        self.loop_instance = f"127.0.0.1:{self.loop_port}"
        self.stacked_instance = f"127.0.0.1:{self.stacked_port}"
        self._daemon("mergewatchd-loop", self.loop_port, f"--collapse.lower-devices=^{self.dev.name}$", *POLICY)
        self._daemon("mergewatchd-stacked", self.stacked_port, f"--path.sysfs={STACKED_SYSFS}")
        data = os.path.join(self.dir, "prometheus-data")
        os.mkdir(data)
        config = os.path.join(self.dir, "prometheus.yml")
        # The dashboard's kernel cohort row needs a second kernel: the loop daemon scraped once more as a
        # second host whose mergewatch_build_info is relabelled with another kernel release.
        self.cohort_instance = f"{self.loop_instance}-{OTHER_KERNEL}"
        with open(config, "w") as f:
            json.dump({"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                       "scrape_configs": [{"job_name": "mergewatch", "static_configs": [
                           {"targets": [self.loop_instance, self.stacked_instance]},
                           {"targets": [self.loop_instance], "labels": {"instance": self.cohort_instance}}],
                           "metric_relabel_configs": [{
                               "source_labels": ["__name__", "instance"],
                               "regex": f"mergewatch_build_info;{re.escape(self.cohort_instance)}",
                               "target_label": "kernel", "replacement": OTHER_KERNEL}]}]}, f)  # JSON is YAML
        self.prom = self._start("prometheus", [tool("prometheus"), f"--config.file={config}",
                                               f"--web.listen-address=127.0.0.1:{self.prom_port}",
                                               f"--storage.tsdb.path={data}"])
        wait_until(lambda: urllib.request.urlopen(f"{self.prom_url}/-/ready", timeout=5).status == 200, 60,
                   "Prometheus /-/ready", self.diag)

        def both_up():
            targets = get_json(f"{self.prom_url}/api/v1/targets")["data"]["activeTargets"]
            return sum(t["health"] == "up" for t in targets) == 3
        wait_until(both_up, 30, "Prometheus to scrape both daemons (the loop one twice)", self.diag)
        self.start_time = time.time()
        self.fio = self._start("fio", [tool("fio"), "--name=mergewatch-dashboard", f"--filename={self.dev.path}",
                                       "--rw=read", "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=64",
                                       "--iodepth_batch_submit=64", "--iodepth_batch_complete_min=64",
                                       "--time_based", "--runtime=300"])
        return self

    @property
    def prom_url(self):
        return f"http://127.0.0.1:{self.prom_port}"

    @property
    def collapse_selector(self):
        return f'mergewatch_merge_collapse{{job="mergewatch",instance="{self.loop_instance}",device="{self.dev.name}"}}'

    def wait_collapse(self, timeout=60):
        """Until Prometheus holds mergewatch_merge_collapse 1 for the loop device."""
        def raised():
            if self.fio.poll() is not None:
                raise Failure(f"fio exited with {self.fio.returncode}\n{self.log('fio')}")
            r = self.query(self.collapse_selector)
            return r and float(r[0]["value"][1]) == 1
        wait_until(raised, timeout, "the collapse to be raised and scraped", self.diag)

    def wait_collapse_history(self, seconds, timeout=90):
        """After wait_collapse(): until Prometheus's own samples hold `seconds` of the raised collapse (its
        scrape timestamps, not this process's clock: a loaded host scrapes late and is waited for)."""
        def scraped_at():
            r = self.query(f"timestamp({self.collapse_selector} == 1)")
            return float(r[0]["value"][1]) if r else None
        first = wait_until(scraped_at, timeout, "the raised collapse in Prometheus", self.diag)
        wait_until(lambda: (scraped_at() or 0) >= first + seconds, timeout,
                   f"{seconds} s of the raised collapse in Prometheus", self.diag)

    def stop(self):
        errors = []
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
                    errors.append(f"{p.name} needed SIGKILL")
            p.log_file.close()
            if p.name.startswith("mergewatchd") and p.returncode != 0:
                errors.append(f"{p.name} exited with {p.returncode}\n{self.log(p.name)}")
        if self.dev is not None:
            self.dev.detach()
        shutil.rmtree(self.dir, ignore_errors=True)
        if errors:
            raise Failure("; ".join(errors))

    # --- queries -----------------------------------------------------------------------------------------

    def api(self, path, **params):
        url = f"{self.prom_url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            body = get_json(url)
        except urllib.error.HTTPError as e:  # 400 for a query that does not parse: its error text says why
            body = json.loads(e.read())
        if body.get("status") != "success":
            raise Failure(f"Prometheus refused {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def query_range(self, expr, start, end, step):
        return self.api("query_range", query=expr, start=start, end=end, step=step)["result"]


def dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def panel_targets(board=None):
    """[(panel title, refId, expr, legendFormat, panel)] for every query target of every panel."""
    out = []
    for panel in (board or dashboard())["panels"]:
        for t in panel.get("targets", []):
            out.append((panel["title"], t["refId"], t["expr"], t.get("legendFormat", ""), panel))
    return out


def substitute(expr, instance, device, rate_interval=RATE_INTERVAL, job="mergewatch"):
    """The query Grafana sends for these picker values (regexes, as multi-value variables are); the job
    is the scrape config's job_name above."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$instance", instance)
            .replace("$device", device).replace("$job", job))
