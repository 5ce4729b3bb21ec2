"""The Prometheus side, without the daemon: rule syntax, rule unit tests, the example configurations."""
import os
import re
import shutil

from conftest import DEPLOY, HERE, REPO, RULES, assert_alertmanager_routes, run, tool

PROM = os.path.join(DEPLOY, "prometheus")


def test_promtool_check_rules_with_lint():
    r = run([tool("promtool"), "check", "rules", "--lint=all", "--lint-fatal", RULES])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 9 rules found" in r.stdout, r.stdout


def test_promtool_test_rules():
    """Fires, stays pending, and stays silent for 4 KiB random I/O and an idle disk (tests/deploy/rules.test.yml)."""
    r = run([tool("promtool"), "test", "rules", os.path.join(HERE, "rules.test.yml")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_has_the_documented_labels_and_annotations():
    text = open(RULES).read()
    alerts = re.findall(r"- alert: (\w+)", text)
    assert alerts == ["MergewatchMergeCollapse", "MergewatchDown", "MergewatchTargetsAbsent",
                      "MergewatchBpfNotAttached"]
    blocks = re.split(r"\n      - alert: ", text)[1:]
    for block in blocks:
        name = block.split("\n", 1)[0]
        for key in ("severity:", "summary:", "description:", "runbook_url:", "for:"):
            assert key in block, f"{name} has no {key}"
    assert "severity: page" in blocks[0]


def test_runbook_urls_point_at_sections_of_docs_runbook():
    runbook = open(os.path.join(REPO, "docs", "runbook.md")).read()
    # GitHub/GitLab anchors: lower case, spaces to dashes, punctuation dropped.
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)}
    urls = re.findall(r"runbook_url: (\S+)", open(RULES).read())
    assert len(urls) == 4
    for url in urls:
        path, _, anchor = url.partition("#")
        assert path.endswith("/docs/runbook.md"), url
        assert anchor in anchors, f"{url}: no heading for #{anchor} in docs/runbook.md"


def test_example_prometheus_config_is_valid(workdir):
    """The fleet example with its paths pointed at this tree: config, rule file and file_sd layout."""
    sd = os.path.join(workdir, "file_sd")
    os.mkdir(sd)
    shutil.copy(os.path.join(PROM, "file_sd", "mergewatch-example.yml"), sd)
    config = open(os.path.join(PROM, "prometheus.example.yml")).read()
    config = config.replace("/etc/prometheus/rules/mergewatch.rules.yml", RULES)
    config = config.replace("/etc/prometheus/file_sd/mergewatch/", sd + "/")
    path = os.path.join(workdir, "prometheus.yml")
    open(path, "w").write(config)
    r = run([tool("promtool"), "check", "config", path])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 9 rules found" in r.stdout, r.stdout


def test_example_alertmanager_config_routes_the_page_to_the_pager():
    assert_alertmanager_routes(os.path.join(PROM, "alertmanager.example.yml"))
