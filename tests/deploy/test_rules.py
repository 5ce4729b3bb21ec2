# SPDX-License-Identifier: Apache-2.0
"""The Prometheus side, without the daemon: rule syntax, rule unit tests, the example configurations."""
import os
import re
import shutil

import yaml

from conftest import DEPLOY, HERE, REPO, RULES, assert_alertmanager_routes, run, tool

PROM = os.path.join(DEPLOY, "prometheus")


def test_promtool_check_rules_with_lint():
    r = run([tool("promtool"), "check", "rules", "--lint=all", "--lint-fatal", RULES])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 18 rules found" in r.stdout, r.stdout


def test_promtool_test_rules():
    """Fires, stays pending, and stays silent for 4 KiB random I/O and an idle disk (tests/deploy/rules.test.yml)."""
    r = run([tool("promtool"), "test", "rules", os.path.join(HERE, "rules.test.yml")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def alert_rules():
    with open(RULES) as f:
        doc = yaml.safe_load(f)
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_has_the_documented_labels_and_annotations():
    alerts = alert_rules()
    assert [a["alert"] for a in alerts] == ["MergewatchMergeCollapse", "MergewatchDown", "MergewatchTargetsAbsent",
                                            "MergewatchBpfNotAttached", "MergewatchDetectionBlind",
                                            "MergewatchQueueConfigFinding", "MergewatchIoSplit",
                                            "MergewatchKernelCohortSlowReads"]
    for a in alerts:
        assert a.get("for") and a.get("labels", {}).get("severity"), f"{a['alert']} has no for: or severity"
        for key in ("summary", "description", "runbook_url"):
            assert a["annotations"].get(key), f"{a['alert']} has no {key}"
    assert alerts[0]["labels"]["severity"] == "critical"


def test_runbook_urls_point_at_sections_of_the_runbook():
    """Each alert links to its own section of docs/runbook.md, by default the project's copy: an https URL that
    works wherever the alert is read, never a file:// one that only works on the host."""
    runbook = open(os.path.join(REPO, "docs", "runbook.md")).read()
    # GitHub/GitLab anchors: lower case, spaces to dashes, punctuation dropped.
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)}
    alerts = alert_rules()
    assert len(alerts) == 8
    for a in alerts:
        path, _, anchor = a["annotations"]["runbook_url"].partition("#")
        assert path.startswith("https://") and path.endswith("/docs/runbook.md"), a["annotations"]["runbook_url"]
        assert anchor == a["alert"].lower() and anchor in anchors, f"{a['alert']}: no heading for #{anchor}"


def test_example_prometheus_config_is_valid(workdir):
    """The fleet example with its paths pointed at this tree: config, rule file and file_sd layout."""
    sd = os.path.join(workdir, "file_sd")
    os.mkdir(sd)
    shutil.copy(os.path.join(PROM, "file_sd", "mergewatch-example.yml"), sd)
    config = open(os.path.join(PROM, "prometheus.example.yml")).read()
    config = config.replace("/usr/share/mergewatch/prometheus/mergewatch.rules.yml", RULES)
    config = config.replace("/etc/prometheus/file_sd/mergewatch/", sd + "/")
    path = os.path.join(workdir, "prometheus.yml")
    open(path, "w").write(config)
    r = run([tool("promtool"), "check", "config", path])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 18 rules found" in r.stdout, r.stdout


def test_example_alertmanager_config_routes_the_page_to_the_pager():
    assert_alertmanager_routes(os.path.join(PROM, "alertmanager.example.yml"))
