# SPDX-License-Identifier: Apache-2.0
"""The mixin under the conventions `mixtool lint` (monitoring-mixins/mixtool, with grafana/dashboard-linter's
dashboard rules) checks, written here because mixtool is not a Debian package; and `jsonnetfmt --test` on every
mixin file."""
import glob
import json
import os
import re

import yaml

from conftest import DEPLOY, run, tool

MIXIN = os.path.join(DEPLOY, "mixin")


def jsonnet(*args):
    r = run([tool("jsonnet"), "-J", MIXIN, *args], cwd=MIXIN)
    assert r.returncode == 0, r.stderr
    return r.stdout


def rules(override=""):
    mixin = f"(import 'mixin.libsonnet') + {{_config+:: {{{override}}}}}"
    return yaml.safe_load(jsonnet("-S", "-e", f"local m = {mixin}; std.manifestYamlDoc("
                                              "{groups: m.prometheusRules.groups + m.prometheusAlerts.groups})"))


def board(override=""):
    return json.loads(jsonnet("-e", f"((import 'mixin.libsonnet') + {{_config+:: {{{override}}}}})"
                                    ".grafanaDashboards['mergewatch.json']"))


def selectors(expr):
    """[(metric, label matchers text)] of every vector selector of a mergewatch metric or up."""
    # A recorded series (level:mergewatch_metric:operations) is one name, matched whole.
    return re.findall(r"(?<![\w:])((?:[a-z_]+:)?mergewatch_[a-z0-9_]+(?::[a-z0-9_]+)?|up)(?![\w:])(\{[^}]*\})?", expr)


def test_jsonnetfmt_leaves_every_mixin_file_as_it_is():
    files = sorted(glob.glob(os.path.join(MIXIN, "*.libsonnet")) + glob.glob(os.path.join(MIXIN, "*.jsonnet")))
    assert len(files) >= 7
    for path in files:
        r = run([tool("jsonnetfmt"), "--test", path])
        assert r.returncode == 0, f"jsonnetfmt would reformat {os.path.basename(path)}: run jsonnetfmt -i on it"


def test_alerts_follow_the_mixin_conventions():
    """CamelCase names; severity critical, warning or info (critical for the collapse page); summary capitalized
    and without templating, description templated; an http(s) runbook_url."""
    alerts = {r["alert"]: r for g in rules()["groups"] for r in g["rules"] if "alert" in r}
    assert len(alerts) >= 4
    for name, a in alerts.items():
        assert re.fullmatch(r"(?:[A-Z][a-z0-9]+)+", name), f"{name}: not CamelCase"
        assert a["labels"]["severity"] in ("critical", "warning", "info"), f"{name}: {a['labels']}"
        summary, description = a["annotations"]["summary"], a["annotations"]["description"]
        assert summary[0].isupper() and "{{" not in summary, f"{name}: summary {summary!r}"
        assert "{{" in description and "$labels" in description, f"{name}: description not templated"
        assert re.match(r"^https?://", a["annotations"]["runbook_url"]), f"{name}: {a['annotations']['runbook_url']}"
    assert alerts["MergewatchMergeCollapse"]["labels"]["severity"] == "critical"
    assert {a["labels"]["severity"] for n, a in alerts.items() if n != "MergewatchMergeCollapse"} == {"warning"}


def test_alertmanager_example_routes_on_the_mixin_severities():
    with open(os.path.join(DEPLOY, "prometheus", "alertmanager.example.yml")) as f:
        text = f.read()
    assert 'severity="critical"' in text and "page" not in re.sub(r"#.*", "", text).replace("pager", "")


def test_recording_rules_honour_the_selector_and_the_range():
    """Every selector of every recording rule carries the configured job selector and every range is the configured
    one, not a hard-coded [5m]."""
    for override, selector, rng in (("", 'job="mergewatch"', "5m"),
                                    ("mergewatchSelector: 'job=\"blockio\"', recordingRange: '2m'",
                                     'job="blockio"', "2m")):
        recording = [r for g in rules(override)["groups"] for r in g["rules"] if "record" in r]
        assert len(recording) >= 5
        for r in recording:
            sels = selectors(r["expr"])
            assert sels and all(selector in s for _, s in sels), (r["record"], sels)
            # Rules over raw series take the configured range; rules over other recorded series (the kernel
            # cohorts' medians and counts) take none.
            ranges = set(re.findall(r"\[([^\]]+)\]", r["expr"]))
            assert ranges <= {rng}, r["expr"]
            if ranges:
                assert r["record"].endswith(f"_rate{rng}"), r["record"]


def test_dashboard_follows_the_dashboard_linter_rules():
    """Not editable; datasource, job and instance templates (job and instance multi-value with All, reloaded on
    time change); every target on ${datasource}, with job=~"$job" and instance=~"$instance" in every selector and
    $__rate_interval as every range; every panel titled and described, with a unit."""
    b = board()
    assert b["editable"] is False
    variables = {v["name"]: v for v in b["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}", v
        assert v["multi"] and v["includeAll"] and v["refresh"] == 2, v
    assert variables["job"]["definition"] == 'label_values(mergewatch_build_info{job="mergewatch"}, job)'
    panels = [p for p in b["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    for p in panels:
        assert p["title"] and p.get("description"), p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        unit = p["fieldConfig"]["defaults"].get("unit") if p["type"] != "heatmap" else p["options"]["yAxis"]["unit"]
        assert unit, f"{p['title']}: no unit"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            sels = selectors(t["expr"])
            assert sels, t["expr"]
            for metric, s in sels:
                assert 'job=~"$job"' in s and 'instance=~"$instance"' in s, f"{p['title']}: {metric}{s}"
            assert set(re.findall(r"\[([^\]]+)\]", t["expr"])) <= {"$__rate_interval"}, t["expr"]


def test_job_and_instance_templates_pass_template_job_and_instance_rules():
    """dashboard-linter's template-job-rule and template-instance-rule (lint/template_utils.go checkTemplate),
    warnings included: the datasource $datasource, a query, the label the name in title case (a warning there), a
    multi select, allValue '.+'."""
    variables = {v["name"]: v for v in board()["templating"]["list"]}
    for name in ("job", "instance"):
        v = variables.get(name)
        assert v is not None, f"is missing the {name} template"
        assert v["datasource"]["uid"] in ("$datasource", "${datasource}"), v["datasource"]
        assert v["type"] == "query", v["type"]
        assert v["label"] == name.title(), f"{name} template should be labeled '{name.title()}', is '{v['label']}'"
        assert v["multi"] is True, name
        assert v["allValue"] == ".+", v["allValue"]


def test_cluster_option_adds_a_picker_and_filters_every_query():
    b = board("showMultiCluster: true, clusterLabel: 'k8s_cluster'")
    variables = {v["name"]: v for v in b["templating"]["list"]}
    assert variables["cluster"]["definition"] == 'label_values(mergewatch_build_info{job="mergewatch"}, k8s_cluster)'
    assert 'k8s_cluster=~"$cluster"' in variables["job"]["definition"]
    for p in b["panels"]:
        for t in p.get("targets", []):
            assert all('k8s_cluster=~"$cluster"' in s for _, s in selectors(t["expr"])), t["expr"]
    assert "cluster" not in {v["name"] for v in board()["templating"]["list"]}
