# SPDX-License-Identifier: Apache-2.0
"""The monitoring mixin (deploy/mixin/): it builds with jsonnet, the committed rule file and dashboard are exactly
its output, its config is the one place for the job selector and runbook URL, what `make install` (and so the
Debian package) ships is that output, and every dashboard query parses and returns data from a real Prometheus
scraping a real mergewatchd during a real merge collapse on a loop device."""
import json
import os
import re

import pytest
import yaml

from conftest import DEPLOY, REPO, RULES, daemon_binary, run, tool
from dashboard_run import COHORT_JOIN, OTHER_KERNEL, Failure, DashboardRun, dashboard, panel_targets, substitute

MIXIN = os.path.join(DEPLOY, "mixin")
DASHBOARD = os.path.join(DEPLOY, "grafana", "mergewatch.json")


def jsonnet(*args):
    # jsonnet 0.18's manifestYamlDoc costs about 1.2 ms of CPU per character of rules.jsonnet's output (11 s for
    # the 9 KB of rules on this machine): the bound leaves room for the other helpers' load.
    r = run([tool("jsonnet"), "-J", MIXIN, *args], cwd=MIXIN, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_mixin_has_the_three_standard_fields():
    out = json.loads(jsonnet("-e", "local m = import 'mixin.libsonnet'; "
                                   "[std.objectHasAll(m, f) for f in ['prometheusAlerts', 'prometheusRules', "
                                   "'grafanaDashboards']] + [std.objectFieldsAll(m.grafanaDashboards)]"))
    assert out == [True, True, True, ["mergewatch.json"]], out


def test_committed_rules_and_dashboard_are_the_mixins_output():
    """`make mixin` was run after the last change to deploy/mixin/ (byte for byte)."""
    with open(RULES) as f:
        assert f.read() == jsonnet("-S", "rules.jsonnet"), \
            "deploy/prometheus/mergewatch.rules.yml is not the mixin's output: run `make mixin`"
    with open(DASHBOARD) as f:
        assert f.read() == jsonnet("dashboard.jsonnet"), \
            "deploy/grafana/mergewatch.json is not the mixin's output: run `make mixin`"


def test_promtool_checks_the_generated_rules(workdir):
    path = os.path.join(workdir, "generated.rules.yml")
    with open(path, "w") as f:
        f.write(jsonnet("-S", "rules.jsonnet"))
    r = run([tool("promtool"), "check", "rules", "--lint=all", "--lint-fatal", path])
    assert r.returncode == 0 and "SUCCESS: 18 rules found" in r.stdout, r.stdout + r.stderr


def test_selector_and_runbook_url_come_from_the_config_alone():
    """Overriding _config changes every alert's runbook link and every selector, in rules and dashboard."""
    override = ("(import 'mixin.libsonnet') + {_config+:: {mergewatchSelector: 'job=\"blockio\"', "
                "runbookURL: 'https://wiki.example.org/mergewatch'}}")
    rules = yaml.safe_load(jsonnet("-S", "-e", f"local m = {override}; std.manifestYamlDoc("
                                               "{groups: m.prometheusRules.groups + m.prometheusAlerts.groups})"))
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) == 8
    records = {r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    for a in alerts:
        assert a["annotations"]["runbook_url"] == f"https://wiki.example.org/mergewatch#{a['alert'].lower()}"
        if a["alert"] == "MergewatchKernelCohortSlowReads":
            # Built on the cohort recording rules (their job label aggregated away): the selector is in the
            # per-host rules the cohort ones are made of.
            used = [r for r in records if r in a["expr"]]
            assert used and all(r.startswith("kernel_class") for r in used), a["expr"]
            assert all('job="blockio"' in e for r, e in records.items() if r.startswith("instance_class_kernel")), records
            continue
        assert 'job="blockio"' in a["expr"] and "mergewatch\"" not in a["expr"], a["expr"]
    board = json.loads(jsonnet("-e", f"({override}).grafanaDashboards['mergewatch.json']"))
    # The dashboard's queries take the job picker; the picker offers the jobs the selector selects.
    exprs = [t[2] for t in panel_targets(board)]
    assert exprs and all('job=~"$job"' in e and 'job="' not in e for e in exprs), exprs
    job = [v for v in board["templating"]["list"] if v["name"] == "job"][0]
    assert job["definition"] == 'label_values(mergewatch_build_info{job="blockio"}, job)', job
    assert board["links"][0]["url"] == "https://wiki.example.org/mergewatch"


def test_make_install_ships_the_generated_files(workdir):
    """What debian/rules runs (make install PREFIX=/usr): the shipped rules and dashboard are the mixin's."""
    dest = os.path.join(workdir, "root")
    r = run(["make", "-C", REPO, "--no-print-directory", "-o", "all", "install", f"DESTDIR={dest}", "PREFIX=/usr",
             "UNITDIR=/lib/systemd/system", f"DAEMON={daemon_binary()}"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    share = os.path.join(dest, "usr/share/mergewatch")
    with open(os.path.join(share, "prometheus/mergewatch.rules.yml")) as f:
        assert f.read() == jsonnet("-S", "rules.jsonnet")
    with open(os.path.join(share, "grafana/mergewatch.json")) as f:
        assert f.read() == jsonnet("dashboard.jsonnet")
    for path in ("usr/sbin/mergewatchd", "usr/bin/mergewatch", "usr/share/man/man8/mergewatch.8",
                 "lib/systemd/system/mergewatchd.service", "etc/default/mergewatchd",
                 "usr/share/man/man8/mergewatchd.8", "usr/share/doc/mergewatch/runbook.md",
                 "usr/share/doc/mergewatch/README.md", "usr/share/mergewatch/mixin/mixin.libsonnet",
                 "usr/share/mergewatch/mixin/config.libsonnet", "usr/share/mergewatch/systemd/pre-5.8-kernel.conf",
                 "usr/share/mergewatch/prometheus/prometheus.example.yml"):
        assert os.path.isfile(os.path.join(dest, path)), f"make install did not install /{path}"
    # The example Prometheus config names the rule file where this installs it: promtool accepts the installed
    # example with only the install root put in front of the package's paths.
    with open(os.path.join(share, "prometheus/prometheus.example.yml")) as f:
        example = f.read()
    assert "\n  - /usr/share/mergewatch/prometheus/mergewatch.rules.yml\n" in example
    rooted = os.path.join(workdir, "prometheus.yml")
    with open(rooted, "w") as f:
        f.write(example.replace("/usr/share/mergewatch/", share + "/"))
    r = run([tool("promtool"), "check", "config", rooted])
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    with open(os.path.join(dest, "lib/systemd/system/mergewatchd.service")) as f:
        unit = f.read()
    assert "ExecStart=/usr/sbin/mergewatchd $MERGEWATCHD_ARGS" in unit
    assert "Documentation=man:mergewatchd(8)\nDocumentation=file:/usr/share/doc/mergewatch/runbook.md\n" in unit


def test_dashboard_has_the_pickers_and_panels():
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "job", "instance", "device"} <= set(variables)
    for name in ("job", "instance", "device"):
        assert variables[name]["multi"] and variables[name]["includeAll"], name
    types = {p["title"]: p["type"] for p in board["panels"]}
    assert types["Request size at dispatch"] == "heatmap"
    for title in ("Collapse state", "Collapse evidence: shares", "Collapse evidence: rates and sizes",
                  "Mean request size", "Requests per second", "Back merges vs missed merges",
                  "Device latency p50 / p99", "Queue latency p50 / p99", "Queue settings", "Stacking",
                  "I/O split tickets"):
        assert title in types, f"no panel {title!r}"
    assert {"Kernel cohorts: p99 read latency", "Kernel cohorts: mean request size"} <= set(types)
    # The who row: the services behind a collapse and the per-volume panels, all of a disk's volumes apart.
    assert types["Who: services and volumes"] == "row"
    assert types["Services behind a collapse"] == "table"
    for title in VOLUME_PANELS:
        assert types[title] == "timeseries", title
        for _, _, expr, legend, _ in [t for t in panel_targets(board) if t[0] == title]:
            assert "origin" in re.findall(r"by \(([^)]*)\)", expr)[0].split(", "), f"{title}: {expr}"
            assert "mergewatch_remapped_" in expr and "{{origin}}" in legend, f"{title}: {expr} {legend!r}"
    # Every query of a panel filters on the host picker; per-device ones on the device picker too. The kernel
    # cohort panels compare the fleet: they take the job and host pickers (All by default, as the linter's
    # convention wants every query to), never the device picker, which would cut cohorts apart.
    for title, ref, expr, _, _ in panel_targets(board):
        assert 'instance=~"$instance"' in expr, f"{title} {ref}: {expr}"
        if title.startswith("Kernel cohorts"):
            assert '$device' not in expr, f"{title} {ref}: {expr}"


# The per-volume panels and what each shows for the two volumes of test_volume_panels_compute_per_volume_figures
# (scaled and rounded: promtool compares floats exactly, the interpolation is not exact in binary floating point).
VOLUME_PANELS = {
    "Requests per second per volume": ("round({})", {"dm-2": 100, "dm-4": 3000}),
    "Mean request size per volume": ("round({})", {"dm-2": 131072, "dm-4": 4096}),
    "Mean device latency per volume": ("round(1e9 * {})", {"dm-2": 500000, "dm-4": 100000}),
    # p99 interpolated in the bucket that holds it: 2^18 ns + 0.99 * 2^18 ns, 2^16 ns + 0.99 * 2^16 ns.
    "Device latency p99 per volume": ("round(1e9 * {})", {"dm-2": 521667, "dm-4": 130417}),
}


def volume_series():
    """promtool input series: one disk, two volumes reading it, one minute apart: the origin LV dm-2 at 100
    requests/s of 128 KiB taking 0.5 ms each (all in the 2^19 ns bucket), its snapshot dm-4 at 3000 requests/s of
    4 KiB taking 0.1 ms (all in the 2^17 ns bucket). Another disk's volume must not show under the picked disk."""
    out = []

    def add(metric, labels, per_minute):
        out.append({"series": f'{metric}{{job="mergewatch",instance="db-17:9863",{labels}}}',
                    "values": f"0+{per_minute}x30"})

    for disk, origin, rps, size, lat, le in (("nvme0n1", "dm-2", 100, 131072, 0.0005, "0.000524288"),
                                             ("nvme0n1", "dm-4", 3000, 4096, 0.0001, "0.000131072"),
                                             ("nvme1n1", "dm-9", 7, 512, 0.002, "0.004194304")):
        labels = f'device="{disk}",origin="{origin}",op="read"'
        n = rps * 60
        add("mergewatch_remapped_dispatched_requests_total", labels, n)
        add("mergewatch_remapped_dispatched_bytes_total", labels, n * size)
        add("mergewatch_remapped_request_latency_seconds_sum", labels, round(n * lat, 6))
        add("mergewatch_remapped_request_latency_seconds_count", labels, n)
        lat_bounds = [2.0 ** k / 1e9 for k in range(10, 37)]
        for bound in lat_bounds:
            add("mergewatch_remapped_request_latency_seconds_bucket", f'{labels},le="{bound!r}"',
                n if bound >= float(le) else 0)
        add("mergewatch_remapped_request_latency_seconds_bucket", f'{labels},le="+Inf"', n)
    return out


def test_volume_panels_compute_per_volume_figures(workdir):
    """Each per-volume panel's query, as Grafana sends it for the disk nvme0n1, evaluated by promtool over known
    counters: requests/s, mean size, mean and p99 device time of each volume, and nothing of the other disk.
    (No device-mapper on this host: the live test below can only parse these.)"""
    tests = []
    for title, (wrap, want) in VOLUME_PANELS.items():
        [(_, _, expr, _, _)] = [t for t in panel_targets() if t[0] == title]
        q = substitute(expr, ".+", "nvme0n1", rate_interval="5m")
        labels = {"instance": "db-17:9863", "device": "nvme0n1", "op": "read"}
        tests.append({"expr": wrap.format(q), "eval_time": "20m",
                      "exp_samples": [{"labels": "{" + ",".join(f'{k}="{v}"' for k, v in
                                                                 sorted({**labels, "origin": o}.items())) + "}",
                                       "value": v} for o, v in want.items()]})
    path = os.path.join(workdir, "volumes.test.yml")
    with open(path, "w") as f:
        yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m",
                        "tests": [{"interval": "1m", "input_series": volume_series(), "promql_expr_test": tests}]}, f)
    r = run([tool("promtool"), "test", "rules", path])
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


# --- the dashboard against real data ------------------------------------------------------------------------

# Needs I/O through a device stacked on the disk (dm/md); this host has no device-mapper (the VM does), so
# these can only be shown to parse here: the loop device has no upper device and the fixture daemon no I/O.
# The per-volume families count requests by the device their first bio was submitted to, and the services are
# taken at a remap chain's first hop: both need a remap too (test_volume_panels_compute_per_volume_figures checks
# the per-volume arithmetic, rules.test.yml the services' text, tests/vm their samples).
NEEDS_STACKED_IO = {"mergewatch_collapse_upper_bio_bytes", "mergewatch_io_split_finding",
                    "mergewatch_collapse_service_request_ratio",
                    "mergewatch_remapped_dispatched_requests_total", "mergewatch_remapped_dispatched_bytes_total",
                    *(f"mergewatch_remapped_request_latency_seconds_{s}" for s in ("sum", "count", "bucket"))}
# From sysfs stacking alone: answered by the daemon that reads the LVM-on-NVMe sysfs fixture.
NEEDS_STACKING = {"mergewatch_device_holder_info", "mergewatch_device_info"}


def metric_of(expr):
    return set(re.findall(r"\b(mergewatch_[a-z_]+)\{", expr))


@pytest.mark.privileged
def test_every_dashboard_query_returns_data_during_a_real_collapse():
    run_ = DashboardRun(daemon_binary())
    try:
        run_.start()
        run_.wait_collapse()
        # Rates over $__rate_interval (10 s) need that much history of the collapse, in Prometheus's samples.
        run_.wait_collapse_history(12)
        loop, dev = run_.loop_instance, run_.dev.name  # as regexes: "." matches itself too
        results, empty = {}, []
        for title, ref, expr, _, _ in panel_targets():
            metrics = metric_of(expr)
            if metrics & NEEDS_STACKING:
                instance, device = run_.stacked_instance, ".+"
            elif COHORT_JOIN in expr:
                # Cohorts compare hosts: the host picker at its default, All.
                instance, device = ".+", dev
            else:
                instance, device = loop, dev
            q = substitute(expr, instance, device)
            try:
                result = run_.query(q)  # fails (Failure) if Prometheus cannot parse it
            except Failure as e:
                pytest.fail(f"{title} {ref} does not parse: {q}\n{e}")
            results[(title, ref)] = result
            if not result and not metrics & NEEDS_STACKED_IO:
                empty.append(f"{title} {ref}: {q}")
            elif not metrics & NEEDS_STACKED_IO and not metrics & NEEDS_STACKING:
                # The loop device's series, not someone else's.
                assert all(s["metric"].get("device", dev) == dev for s in result), (title, ref, result)
        assert not empty, "dashboard queries without data during the collapse:\n" + "\n".join(empty) + run_.diag()
        # The verdict and its evidence, as the panels show them.
        state = results[("Collapse state", "A")]
        # Prometheus drops the empty upper label (no device stacked on a loop device).
        assert [(s["metric"]["device"], s["metric"].get("upper", ""), s["value"][1]) for s in state] == [(dev, "", "1")]
        small = float(results[("Collapse evidence: shares", "A")][0]["value"][1])
        assert small >= 0.8, small  # --collapse.min-small-share
        sizes = {s["metric"]["le"]: float(s["value"][1]) for s in results[("Request size at dispatch", "A")]}
        assert sizes["4096"] > 0 and sizes["4096"] == sizes["+Inf"], sizes  # every request at most 4 KiB
        nomerges = {s["metric"]["device"]: s["value"][1] for s in results[("Queue settings", "A")]}
        assert nomerges == {dev: "2"}, nomerges
        schedulers = {s["metric"]["scheduler"] for s in results[("Queue settings", "B")]}
        assert schedulers == {"mq-deadline"}, schedulers
        # Two kernel cohorts: this host's and the relabelled scrape's (dashboard_run.OTHER_KERNEL).
        cohorts = {s["metric"]["kernel"] for s in results[("Kernel cohorts: p99 read latency", "A")]}
        assert cohorts == {os.uname().release, OTHER_KERNEL}, cohorts
        holders = {(s["metric"]["device"], s["metric"]["holder"]) for s in results[("Stacking", "A")]}
        assert ("nvme1n1", "dm-0") in holders, holders
        # The pickers' own queries.
        for var in dashboard()["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"])
            values = run_.api(f"label/{m.group(2)}/values",
                              **{"match[]": substitute(m.group(1), loop, ".+")})
            want = {"instance": run_.loop_instance, "job": "mergewatch"}.get(var["name"], dev)
            assert want in values, f"picker {var['name']}: {values}"
        print(f"{len(results)} dashboard queries answered during the collapse of {dev}; "
              f"parsed only (need dm): {sorted(NEEDS_STACKED_IO)}")
    finally:
        run_.stop()
