# SPDX-License-Identifier: Apache-2.0
"""The alert path end to end, with real parts only: mergewatchd on real tracepoints -> a real Prometheus scraping
it and evaluating the SHIPPED rule file -> a real Alertmanager -> a webhook receiver in this test.

The only change made to deploy/prometheus/mergewatch.rules.yml is a programmatic one: every `for: Nm` becomes
`for: Ns` (the same durations in seconds instead of minutes); everything else, expressions, labels and
annotation templates, is the shipped text, checked line by line. Prometheus scrapes and evaluates every second;
Alertmanager groups and repeats quickly, and routes severity=critical to /pager and the rest to /tickets, as the
example configuration does.

The page test scrapes over HTTPS with basic auth: the daemon runs with a web config file made from the shipped
deploy/web-config.example.yml (certificate made with openssl, bcrypt hash with python3-bcrypt), and Prometheus
scrapes with scheme https, the CA file and the password, as a fleet would.

Merge collapse is real: a RAM-backed loop device with nomerges=2 and the `none` scheduler, read by fio with
4 KiB direct I/O submitted in batches of 64, and the daemon's detector pointed at that one loop device with short
window/raise/clear times. Setting nomerges=0 while the I/O continues clears it.
"""
import json
import os
import re
import signal
import time
import urllib.request

import pytest
import yaml

from conftest import (DEPLOY, RULES, assert_alertmanager_routes, attached_bpf_link_ids, bpf_link_ids_of,
                      daemon_binary, free_port, http_get, run, start_daemon, tool, wait_until)
from webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.privileged

# Detector policy: only our loop device, no stacked device required, seconds instead of minutes.
WINDOW, RAISE_AFTER, CLEAR_AFTER = 5, 2, 4
# Bounds on the waits. Typical times, measured: page 10-15 s after fio starts, resolved ~10 s after
# nomerges=0, MergewatchDown ~7 s after the daemon stops. The bounds leave room for a loaded 2-core machine.
READY_TIMEOUT = 60
FIRING_TIMEOUT = 60
RESOLVED_TIMEOUT = 45
# After the last expected notification: a few group_intervals for anything unexpected to arrive. A sleep
# that stays: it is a span in which nothing may happen, and what is asserted after it (the notifications
# that did arrive, no alert firing) holds on a loaded host too, where the span only proves less.
SETTLE = 3

FOR_LINE = re.compile(r'^(\s+for: "?)(\d+)m("?)$', re.M)


# --- the rule file, with shorter for: ---------------------------------------------------------------------

def shipped_rules():
    with open(RULES) as f:
        return f.read()


def shipped_alert_rules():
    """{alertname: rule} from the shipped rule file."""
    doc = yaml.safe_load(shipped_rules())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def rules_with_short_for(text):
    """The rule text with every `for: Nm` turned into `for: Ns`; nothing else changes."""
    return FOR_LINE.subn(lambda m: f"{m.group(1)}{m.group(2)}s{m.group(3)}", text)


def write_test_rules(path):
    text = shipped_rules()
    short, n = rules_with_short_for(text)
    alerts = shipped_alert_rules()
    # MergewatchMergeCollapse has no hold of its own (for: 0s, its hysteresis is the daemon's): every other alert.
    in_minutes = [a for a, r in alerts.items() if str(r.get("for", "")).endswith("m")]
    assert alerts["MergewatchMergeCollapse"]["for"] == "0s", alerts["MergewatchMergeCollapse"]
    assert n == len(in_minutes) == len(alerts) - 1 >= 3, f"{n} for: lines rewritten for {len(alerts)} alerts"
    # Line by line: only the for: lines differ, and only in their unit.
    old_lines, new_lines = text.splitlines(), short.splitlines()
    assert len(old_lines) == len(new_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines) if a != b]
    assert len(changed) == n and all(FOR_LINE.match(a) and rules_with_short_for(a)[0] == b for a, b in changed), changed
    # And as YAML: the same rules, with every alert's for: in seconds.
    expected = yaml.safe_load(text)
    for group in expected["groups"]:
        for rule in group["rules"]:
            if str(rule.get("for", "")).endswith("m"):
                rule["for"] = rule["for"][:-1] + "s"
    assert yaml.safe_load(short) == expected
    with open(path, "w") as f:
        f.write(short)


# --- Prometheus, Alertmanager, the webhook ------------------------------------------------------------------

def get_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.fixture
def webhook():
    receiver = WebhookReceiver()
    yield receiver
    receiver.stop()


def distinct_free_ports(n, taken=()):
    ports = []
    while len(ports) < n:
        port = free_port()
        if port not in ports and port not in taken:
            ports.append(port)
    return ports


class AlertPath:
    """Prometheus (scraping one mergewatchd, evaluating the test rules) and Alertmanager (to the webhook)."""

    def __init__(self, processes, workdir, webhook, daemon_port, web_tls=None, interval="1s", fixture=False):
        self.webhook = webhook
        self.web_tls = web_tls
        self.daemon_port = daemon_port
        self.instance = f"127.0.0.1:{daemon_port}"
        self.seen = {}  # (alertname, device) -> states seen in Prometheus's alerts API, in order of first sight
        self.daemons = []

        rules = os.path.join(workdir, "mergewatch.rules.yml")
        write_test_rules(rules)

        self.am_port, self.prom_port = distinct_free_ports(2, taken={daemon_port})
        am_config = os.path.join(workdir, "alertmanager.yml")
        with open(am_config, "w") as f:
            yaml.safe_dump({
                "route": {
                    "receiver": "tickets",
                    "group_by": ["alertname", "instance", "device"],
                    "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h",
                    "routes": [{"matchers": ['severity="critical"'], "receiver": "pager"}],
                },
                "receivers": [
                    {"name": "pager", "webhook_configs": [{"url": webhook.url("/pager"), "send_resolved": True}]},
                    {"name": "tickets",
                     "webhook_configs": [{"url": webhook.url("/tickets"), "send_resolved": True}]},
                ],
            }, f)
        assert_alertmanager_routes(am_config)

        prom_config = os.path.join(workdir, "prometheus.yml")
        with open(prom_config, "w") as f:
            yaml.safe_dump({
                "global": {"scrape_interval": interval, "scrape_timeout": "1s", "evaluation_interval": interval},
                "rule_files": [rules],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.am_port}"]}]}]},
                # The job name is part of the rules' contract (job="mergewatch").
                "scrape_configs": [{"job_name": "mergewatch",
                                    "static_configs": [{"targets": [self.instance]}],
                                    **(web_tls.scrape_config() if web_tls else {})}]
                # The webhook's exposition (its series carry job="mergewatch" and the daemon's instance).
                + ([{"job_name": "fixture", "honor_labels": True,
                     "static_configs": [{"targets": [f"127.0.0.1:{webhook.port}"]}]}] if fixture else []),
            }, f)
        r = run([tool("promtool"), "check", "config", prom_config])
        assert r.returncode == 0 and "SUCCESS: 18 rules found" in r.stdout, r.stdout + r.stderr

        am_data = os.path.join(workdir, "alertmanager-data")
        prom_data = os.path.join(workdir, "prometheus-data")
        os.mkdir(am_data)
        os.mkdir(prom_data)
        self.am = processes("alertmanager", [tool("prometheus-alertmanager"), f"--config.file={am_config}",
                                             f"--web.listen-address=127.0.0.1:{self.am_port}",
                                             "--cluster.listen-address=", f"--storage.path={am_data}"])
        self.prom = processes("prometheus", [tool("prometheus"), f"--config.file={prom_config}",
                                             f"--web.listen-address=127.0.0.1:{self.prom_port}",
                                             f"--storage.tsdb.path={prom_data}"])
        for proc, port in ((self.am, self.am_port), (self.prom, self.prom_port)):
            def ready(proc=proc, port=port):
                proc.assert_running()
                return http_get(f"http://127.0.0.1:{port}/-/ready")[0] == 200
            wait_until(ready, READY_TIMEOUT, f"{proc.name} /-/ready", interval=0.2, on_timeout=proc.log)

    # Prometheus and Alertmanager state

    def prom_alerts(self):
        return get_json(f"http://127.0.0.1:{self.prom_port}/api/v1/alerts")["data"]["alerts"]

    def observe(self):
        """Record the state of every alert Prometheus has now (pending/firing); returns the list."""
        alerts = self.prom_alerts()
        for a in alerts:
            states = self.seen.setdefault((a["labels"]["alertname"], a["labels"].get("device")), [])
            if a["state"] not in states:
                states.append(a["state"])
        return alerts

    def target_health(self):
        targets = get_json(f"http://127.0.0.1:{self.prom_port}/api/v1/targets")["data"]["activeTargets"]
        return {t["labels"]["instance"]: (t["health"], t["lastError"]) for t in targets}

    def wait_target_up(self):
        wait_until(lambda: self.target_health().get(self.instance, ("",))[0] == "up", READY_TIMEOUT,
                   f"Prometheus to scrape {self.instance}", interval=0.2, on_timeout=self.diagnostics)

    def wait_notification(self, path, status, alertname, what, timeout, fingerprint=None):
        """Poll Prometheus (recording alert states) until the webhook got `status` for `alertname` on `path`."""
        def arrived():
            self.observe()
            for s, a in self.webhook.notifications(path):
                if (s == status and a["status"] == status and a["labels"].get("alertname") == alertname
                        and (fingerprint is None or a["fingerprint"] == fingerprint)):
                    return a
            return None

        return wait_until(arrived, timeout, what, interval=0.25, on_timeout=self.diagnostics)

    def amtool_query(self, *matchers):
        r = run([tool("amtool"), f"--alertmanager.url=http://127.0.0.1:{self.am_port}", "alert", "query",
                 "-o", "json", *matchers])
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout)

    def diagnostics(self):
        parts = []
        for d in self.daemons:
            parts.append(d.log(40))
        parts += [self.prom.log(30), self.am.log(30)]
        for what, url in (("Prometheus alerts", f"http://127.0.0.1:{self.prom_port}/api/v1/alerts"),
                          ("Prometheus targets", f"http://127.0.0.1:{self.prom_port}/api/v1/targets"),
                          ("Alertmanager alerts", f"http://127.0.0.1:{self.am_port}/api/v2/alerts")):
            try:
                parts.append(f"--- {what} ---\n{json.dumps(get_json(url), sort_keys=True)}")
            except Exception as e:  # noqa: BLE001 - diagnostics must not hide the failure
                parts.append(f"--- {what}: {e}")
        try:
            if self.web_tls:
                text = self.web_tls.checked_get(f"https://127.0.0.1:{self.daemon_port}/metrics",
                                                password=self.web_tls.password)[1]
            else:
                text = http_get(f"http://127.0.0.1:{self.daemon_port}/metrics")[1]
            parts.append("--- daemon collapse series ---\n" + "\n".join(
                line for line in text.splitlines() if "collapse" in line or "nomerges" in line))
        except Exception as e:  # noqa: BLE001
            parts.append(f"--- daemon scrape: {e}")
        parts.append(f"--- alert states seen in Prometheus: {self.seen}")
        parts.append(self.webhook.dump())
        return "\n".join(parts)


# --- the daemon and the workload ---------------------------------------------------------------------------

def policy(dev):
    return [f"--collapse.lower-devices=^{dev.name}$", "--collapse.require-upper=none",
            f"--collapse.window={WINDOW}s", f"--collapse.raise-after={RAISE_AFTER}s",
            f"--collapse.clear-after={CLEAR_AFTER}s"]


def start_fio(processes, dev, runtime=150):
    """Sequential 4 KiB direct reads in batches of 64, time-based so they run until stopped (bounded anyway)."""
    return processes("fio", [tool("fio"), "--name=mergewatch-e2e", f"--filename={dev.path}", "--rw=read",
                             "--bs=4k", "--direct=1", "--ioengine=libaio", "--iodepth=64",
                             "--iodepth_batch_submit=64", "--iodepth_batch_complete_min=64", "--time_based",
                             f"--runtime={runtime}"])


def stop_daemon_cleanly(daemon):
    """SIGTERM to the daemon's PID: exit status 0 and none of its BPF links left attached."""
    links = bpf_link_ids_of(daemon.pid)
    assert links, "the daemon holds no BPF links"
    os.kill(daemon.pid, signal.SIGTERM)
    status = daemon.proc.wait(timeout=20)
    assert status == 0, f"mergewatchd exited with {status} on SIGTERM\n{daemon.log()}"
    left = links & attached_bpf_link_ids()
    assert not left, f"BPF links still attached after the daemon exited: {sorted(left)}"


# The services behind the collapsed pair. mergewatchd names them only for a pair with an upper device (they are
# taken at the first hop of a remap chain, and a loop device has none: docs/design/attribution.md), and this
# host has no device-mapper, so the page test serves them from a fixture target scraped with honor_labels under
# the daemon's own job and instance: the real collapse raises the page, the rule's query finds these series, and
# the text travels through Prometheus and Alertmanager to the webhook. A hostile name (quotes, a backslash, a
# newline, non-ASCII) is among them; "other" at 0.08, the idle /idle.slice at 0 (left out).
SERVICES = [("/system.slice/backup \\\"nightly\\\"\\n\\\\ üñí.service", 0.9), ("other", 0.08), ("/db.slice", 0.02),
            ("/idle.slice", 0)]
SERVICES_TEXT = '90% /system.slice/backup "nightly" \\ üñí.service, 8% other, 2% /db.slice'


def services_exposition(instance, device):
    lines = ["# TYPE mergewatch_collapse_service_request_ratio gauge"]
    for cgroup, share in SERVICES:
        lines.append(f'mergewatch_collapse_service_request_ratio{{job="mergewatch",instance="{instance}",'
                     f'device="{device}",upper="",cgroup="{cgroup}"}} {share}')
    return "\n".join(lines) + "\n"


def assert_services_named(ann, daemon_scrape):
    """The page names the services, largest share first, zero shares left out, the newline a space: in the
    description and alone in the services annotation. And the daemon itself named none for the loop device."""
    assert "mergewatch_collapse_service_request_ratio{" not in daemon_scrape, "services for a pair without upper"
    assert ann["services"] == SERVICES_TEXT, ann["services"]
    assert f" Requests from: {SERVICES_TEXT}. queue/nomerges " in ann["description"], ann["description"]
    print(f"services: {ann['services']}")


def collapse_value(text, device):
    m = re.search(rf'^mergewatch_merge_collapse\{{device="{device}",upper=""\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


# --- the tests ---------------------------------------------------------------------------------------------

def test_merge_collapse_pages_through_prometheus_and_alertmanager_and_resolves(loop_device, webhook, workdir,
                                                                               processes, web_tls):
    dev = loop_device(size_mb=128)
    dev.set_queue(scheduler="none", nomerges=2)
    daemon, port = start_daemon(processes, *policy(dev), f"--web.config.file={web_tls.config}")
    webhook.exposition = services_exposition(f"127.0.0.1:{port}", dev.name)
    path = AlertPath(processes, workdir, webhook, port, web_tls=web_tls, fixture=True)
    path.daemons.append(daemon)
    shipped = shipped_alert_rules()["MergewatchMergeCollapse"]
    try:
        path.wait_target_up()
        assert path.target_health()[path.instance] == ("up", ""), "scraped over HTTPS with basic auth"
        fio = start_fio(processes, dev)

        # 1. The page.
        alert = path.wait_notification("/pager", "firing", "MergewatchMergeCollapse",
                                       "the MergewatchMergeCollapse page at the webhook", FIRING_TIMEOUT)
        fio.assert_running()
        assert alert["labels"] == {"alertname": "MergewatchMergeCollapse", "severity": "critical", "device": dev.name,
                                   "job": "mergewatch", "instance": path.instance}, alert["labels"]
        payload = next(p for p in webhook.payloads("/pager") if alert in p["alerts"])
        assert payload["receiver"] == "pager" and payload["status"] == "firing" and payload["version"] == "4"
        assert payload["groupLabels"] == {"alertname": "MergewatchMergeCollapse", "instance": path.instance,
                                          "device": dev.name}
        ann = alert["annotations"]
        assert set(ann) == {"summary", "description", "services", "runbook_url"}, ann
        assert ann["summary"] == shipped["annotations"]["summary"]
        assert ann["runbook_url"] == shipped["annotations"]["runbook_url"]
        assert ann["runbook_url"].endswith("/runbook.md#mergewatchmergecollapse")
        # The description, rendered from live queries: the host, the disk, the evidence gauges, nomerges=2.
        m = re.fullmatch(
            rf"Host {re.escape(path.instance)}: requests dispatched to {dev.name} are no longer merged, so the disk "
            r"receives many small requests where a few large ones would do: (?P<share>[0-9.]+)% of "
            r"(?P<rate>[0-9.]+k?) requests/s were missed merges, mean request (?P<bytes>[0-9]+) bytes where "
            r"merging would have built (?P<merged>[0-9]+) bytes\. "
            rf"No device is stacked above it\. Requests from: .+\. "
            rf"queue/nomerges of {dev.name} is (?P<nomerges>\S+) "
            r"\(0 = merging allowed, 2 = all merging disabled\)\.", ann["description"])
        assert m, f"description not as the rule renders it:\n{ann['description']}"
        assert m["nomerges"] == "2"
        assert float(m["share"]) >= 90, ann["description"]  # 62-63 of each 64-bio batch
        assert 0 < int(m["bytes"]) <= 4096, ann["description"]
        assert int(m["merged"]) >= 4 * int(m["bytes"]), ann["description"]  # --collapse.min-run-size-ratio
        print(f"page: {ann['description']}")
        scrape = web_tls.checked_get(f"https://127.0.0.1:{port}/metrics", password=web_tls.password)[1]
        assert_services_named(ann, scrape)
        # No hold in Prometheus (for: 0s): firing at the first evaluation; Alertmanager has it active.
        assert path.seen[("MergewatchMergeCollapse", dev.name)][:1] == ["firing"], path.seen
        active = path.amtool_query("alertname=MergewatchMergeCollapse")
        assert [a["labels"]["device"] for a in active] == [dev.name], active

        # 2. Merging allowed again while the I/O goes on: the same alert resolves.
        dev.set_queue(nomerges=0)
        resolved = path.wait_notification("/pager", "resolved", "MergewatchMergeCollapse",
                                          "the resolved notification at the webhook", RESOLVED_TIMEOUT,
                                          fingerprint=alert["fingerprint"])
        fio.assert_running()
        assert resolved["labels"] == alert["labels"]
        assert resolved["startsAt"] == alert["startsAt"] and resolved["endsAt"] > resolved["startsAt"]
        print(f"resolved: {resolved['annotations']['description']}")

        # 3. Nothing else: exactly one page and its resolution, no ticket, no other alert firing in Prometheus.
        time.sleep(SETTLE)
        path.observe()
        pages = [(s, a["labels"]["alertname"], a["labels"].get("device")) for s, a in webhook.notifications("/pager")]
        assert pages == [("firing", "MergewatchMergeCollapse", dev.name),
                         ("resolved", "MergewatchMergeCollapse", dev.name)], webhook.dump()
        assert webhook.payloads("/tickets") == [], webhook.dump()
        assert not webhook.errors, webhook.errors
        others = {k: v for k, v in path.seen.items() if k != ("MergewatchMergeCollapse", dev.name)}
        assert not any("firing" in states for states in others.values()), others
        # (A pending MergewatchDown would only mean a slow scrape on a loaded machine; firing is what must not be.)
        print(f"alert states seen in Prometheus: {path.seen}")

        fio.stop()
        stop_daemon_cleanly(daemon)
    except BaseException:
        print(path.diagnostics())
        raise


# The time to page with the shipped rule and the daemon's default window, raise and clear times:
# Prometheus scraping and evaluating every 15 s, as a fleet does. The page must fire in Prometheus within 90 s
# of the onset and of the daemon's gauge rising (Alertmanager's group_wait comes on top, the operator's choice).
PAGE_BUDGET = 90


def test_the_page_fires_within_90_seconds_with_a_15_second_scrape(loop_device, webhook, workdir, processes):
    dev = loop_device(size_mb=128)
    dev.set_queue(scheduler="none", nomerges=2)
    # Only the device selection differs from the defaults (a loop device, nothing stacked on it).
    daemon, port = start_daemon(processes, f"--collapse.lower-devices=^{dev.name}$", "--collapse.require-upper=none")
    path = AlertPath(processes, workdir, webhook, port, interval="15s")
    path.daemons.append(daemon)
    try:
        path.wait_target_up()
        fio = start_fio(processes, dev)
        onset = time.monotonic()
        gauge_rose = None

        def firing():
            nonlocal gauge_rose
            if gauge_rose is None and collapse_value(http_get(f"http://127.0.0.1:{port}/metrics")[1], dev.name) == 1:
                gauge_rose = time.monotonic()
            return any(a["labels"]["alertname"] == "MergewatchMergeCollapse" and a["state"] == "firing"
                       and a["labels"].get("device") == dev.name for a in path.observe())

        wait_until(firing, PAGE_BUDGET + 30, "MergewatchMergeCollapse firing in Prometheus", interval=0.5,
                   on_timeout=path.diagnostics)
        fired = time.monotonic()
        fio.assert_running()
        assert gauge_rose is not None, path.diagnostics()
        print(f"gauge rose {gauge_rose - onset:.1f} s after onset; firing {fired - gauge_rose:.1f} s after the "
              f"gauge rose, {fired - onset:.1f} s after onset")
        assert fired - gauge_rose <= PAGE_BUDGET
        assert fired - onset <= PAGE_BUDGET
        fio.stop()
        stop_daemon_cleanly(daemon)
    except BaseException:
        print(path.diagnostics())
        raise


def test_promtool_check_metrics_on_a_live_scrape_during_collapse(loop_device, workdir, processes):
    """A scrape taken while the detector reports collapse (every family, the collapse evidence included) is
    clean for `promtool check metrics`: no parse error and no lint problem (rc 0, no output at all)."""
    dev = loop_device(size_mb=128)
    dev.set_queue(scheduler="none", nomerges=2)
    daemon, port = start_daemon(processes, *policy(dev))
    fio = start_fio(processes, dev)
    url = f"http://127.0.0.1:{port}/metrics"
    text = wait_until(lambda: (lambda t: t if collapse_value(t, dev.name) == 1 else None)(http_get(url)[1]),
                      FIRING_TIMEOUT, f"mergewatch_merge_collapse{{device={dev.name}}} 1", interval=0.5,
                      on_timeout=daemon.log)
    fio.assert_running()
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert families.get("mergewatch_request_size_bytes") == "histogram"
    assert families.get("mergewatch_missed_merges_total") == "counter"
    assert re.search(rf'^mergewatch_collapse_small_request_ratio\{{device="{dev.name}",upper=""\}} ', text, re.M), text

    r = run([tool("promtool"), "check", "metrics"], input=text)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", \
        f"promtool check metrics: rc {r.returncode}\n{r.stdout}{r.stderr}"
    print(f"promtool check metrics: clean on {len(text.splitlines())} lines, {len(families)} families")

    # The check can fail on this input: the same scrape with a counter's _total suffix dropped is a lint error.
    broken = text.replace("mergewatch_missed_merges_total", "mergewatch_missed_merges")
    r = run([tool("promtool"), "check", "metrics"], input=broken)
    assert r.returncode == 3 and 'mergewatch_missed_merges counter metrics should have "_total" suffix' in \
        r.stdout + r.stderr, f"rc {r.returncode}\n{r.stdout}{r.stderr}"

    fio.stop()
    stop_daemon_cleanly(daemon)


def test_mergewatch_down_reaches_the_ticket_receiver_and_resolves(webhook, workdir, processes):
    """The daemon stopped (SIGTERM): MergewatchDown (severity warning) arrives through the same path on the
    non-paging receiver; started again on the same port, the alert resolves. Nothing pages."""
    daemon, port = start_daemon(processes)
    path = AlertPath(processes, workdir, webhook, port)
    path.daemons.append(daemon)
    shipped = shipped_alert_rules()["MergewatchDown"]
    try:
        path.wait_target_up()
        stop_daemon_cleanly(daemon)

        alert = path.wait_notification("/tickets", "firing", "MergewatchDown", "MergewatchDown at the webhook",
                                       FIRING_TIMEOUT)
        assert alert["labels"] == {"alertname": "MergewatchDown", "severity": "warning", "job": "mergewatch",
                                   "instance": path.instance}, alert["labels"]
        ann = alert["annotations"]
        assert ann["summary"] == shipped["annotations"]["summary"]
        assert ann["runbook_url"] == shipped["annotations"]["runbook_url"]
        assert ann["runbook_url"].endswith("/runbook.md#mergewatchdown")
        assert f"mergewatchd at {path.instance} " in ann["description"], ann["description"]
        assert path.seen[("MergewatchDown", None)][:2] == ["pending", "firing"], path.seen

        # Started again on the same address: scraped again, the alert resolves.
        again = processes("mergewatchd-again", [daemon_binary(), f"--web.listen-address=127.0.0.1:{port}"])
        path.daemons.append(again)

        def ready():
            again.assert_running()
            with open(again.log_path, errors="replace") as f:
                return 'msg="ready:' in f.read()

        wait_until(ready, READY_TIMEOUT, "mergewatchd to start again", on_timeout=again.log)
        resolved = path.wait_notification("/tickets", "resolved", "MergewatchDown",
                                          "MergewatchDown resolved at the webhook", RESOLVED_TIMEOUT,
                                          fingerprint=alert["fingerprint"])
        assert resolved["labels"] == alert["labels"]

        time.sleep(SETTLE)
        path.observe()
        tickets = [(s, a["labels"]["alertname"]) for s, a in webhook.notifications("/tickets")]
        assert tickets == [("firing", "MergewatchDown"), ("resolved", "MergewatchDown")], webhook.dump()
        assert webhook.payloads("/pager") == [], webhook.dump()
        others = {k: v for k, v in path.seen.items() if k != ("MergewatchDown", None)}
        assert not any("firing" in states for states in others.values()), others

        stop_daemon_cleanly(again)
    except BaseException:
        print(path.diagnostics())
        raise


def test_web_config_tls_and_basic_auth(workdir, processes, web_tls):
    """The shipped example passes `promtool check web-config` (with its certificate files present); the daemon
    serves it: the right password gets the metrics over TLS, a wrong or missing one 401 with a Basic challenge,
    and plain HTTP to the TLS port no HTTP response at all."""
    example_dir = os.path.join(workdir, "example")
    os.makedirs(os.path.join(example_dir, "tls"))
    example = os.path.join(example_dir, "web-config.yml")
    with open(os.path.join(DEPLOY, "web-config.example.yml")) as src, open(example, "w") as dst:
        dst.write(src.read())
    r = run([tool("promtool"), "check", "web-config", example])
    assert r.returncode != 0 and "server.crt" in r.stdout + r.stderr, "fails while the certificate is missing"
    for name in ("server.crt", "server.key"):
        os.link(os.path.join(web_tls.dir, "tls", name), os.path.join(example_dir, "tls", name))
    r = run([tool("promtool"), "check", "web-config", example])
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr
    r = run([tool("promtool"), "check", "web-config", web_tls.config])
    assert r.returncode == 0, r.stdout + r.stderr

    daemon, port = start_daemon(processes, f"--web.config.file={web_tls.config}")
    url = f"https://127.0.0.1:{port}/metrics"
    status, body, _ = web_tls.checked_get(url, password=web_tls.password)
    assert status == 200 and "mergewatch_build_info" in body
    for password in ("wrong", None):
        status, body, headers = web_tls.checked_get(url, password=password)
        assert status == 401 and "mergewatch_build_info" not in body, (status, body)
        assert headers.get("WWW-Authenticate", "").startswith("Basic realm="), headers
    # Right after a failed check the gate may answer 429 (Retry-After) instead of checking: checked_get
    # waits it out, so this asserts the check's own verdict.
    status, _, _ = web_tls.checked_get(url, user="someone", password=web_tls.password)
    assert status == 401
    import urllib.error
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)) as plain:
        http_get(f"http://127.0.0.1:{port}/metrics")
    assert not isinstance(plain.value, urllib.error.HTTPError), "plain HTTP must get no HTTP answer at all"
    r = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", f"http://127.0.0.1:{port}/metrics"])
    assert r.returncode != 0 and r.stdout == "000", (r.returncode, r.stdout, r.stderr)
    assert daemon.proc.poll() is None


def test_client_certificates_are_required_and_verified(workdir, processes, web_tls):
    """client_auth_type RequireAndVerifyClientCert with client_ca_file: a client certificate signed by that CA gets
    the metrics; none, or one from another CA, gets 403. Certificates made here with openssl."""
    tls = os.path.join(web_tls.dir, "tls")

    def openssl(*args):
        r = run(["openssl", *args])
        assert r.returncode == 0, r.stderr

    def ca(name):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                "-subj", f"/CN={name}", "-keyout", f"{tls}/{name}.key", "-out", f"{tls}/{name}.crt")

    def client(name, signer):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{tls}/{name}.key", "-out", f"{tls}/{name}.csr")
        openssl("x509", "-req", "-in", f"{tls}/{name}.csr", "-CA", f"{tls}/{signer}.crt", "-CAkey",
                f"{tls}/{signer}.key", "-CAcreateserial", "-days", "2", "-out", f"{tls}/{name}.crt")

    ca("clients-ca")
    ca("other-ca")
    client("prometheus-client", "clients-ca")
    client("stranger", "other-ca")
    with open(web_tls.config) as f:
        text = f.read()
    text = text.replace("  # client_auth_type: RequireAndVerifyClientCert\n  # client_ca_file: tls/clients-ca.crt\n",
                        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: tls/clients-ca.crt\n")
    assert "\n  client_ca_file: tls/clients-ca.crt" in text, "the example's commented client CA lines changed"
    with open(web_tls.config, "w") as f:
        f.write(text)
    r = run([tool("promtool"), "check", "web-config", web_tls.config])
    assert r.returncode == 0, r.stdout + r.stderr

    daemon, port = start_daemon(processes, f"--web.config.file={web_tls.config}")
    url = f"https://127.0.0.1:{port}/metrics"

    def curl(*cert):
        r = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", web_tls.cert,
                 "-u", f"{web_tls.USER}:{web_tls.password}", *cert, url])
        return r.stdout

    assert curl("--cert", f"{tls}/prometheus-client.crt", "--key", f"{tls}/prometheus-client.key") == "200"
    assert curl() == "403"
    assert curl("--cert", f"{tls}/stranger.crt", "--key", f"{tls}/stranger.key") == "403"
    assert daemon.proc.poll() is None
