# SPDX-License-Identifier: Apache-2.0
"""The reference tables in docs/ and the man page say what the daemon really has: every flag with its
default (docs/operations.md, "Flags"), every metric family it exports (docs/metrics.md, "Families"), every exit
code (docs/operations.md, "Exit codes")."""
import glob
import os
import re
import shutil
import subprocess

import pytest

from conftest import DAEMON, REPO, fio, wait_until
from test_cli import run



OPERATIONS = os.path.join("docs", "operations.md")
METRICS = os.path.join("docs", "metrics.md")


def doc_section(path, title):
    """The text under `## title` in the Markdown file at path (relative to the repository), to the next `## `."""
    text = open(os.path.join(REPO, path)).read()
    assert f"\n## {title}\n" in text, f"{path} has no section '## {title}'"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def documented_flags():
    """{flag: default} from the flag table of docs/operations.md."""
    table = doc_section(OPERATIONS, "Flags")
    flags = {}
    for row in table.splitlines():
        # A `\|` inside a cell (a regex default) is a pipe, not a column.
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]
        if len(cells) >= 2 and cells[0].startswith("`--"):
            for flag in re.findall(r"`(--[a-z][a-z.-]*)`", cells[0]):
                flags[flag] = cells[1].strip("`")
    return flags


def help_flags():
    """{flag: default} from --help."""
    r = run("--help")
    assert r.returncode == 0
    shown = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s+(?:-h,)?(--[a-z][a-z.-]*)(.*)", line)
        if m:
            default = re.search(r"=(\S+)", m.group(2))  # CLI11: "--flag TYPE=default  description"
            shown[m.group(1)] = default.group(1) if default else ""
    return shown


def test_help_and_the_flag_table_list_the_same_flags_and_defaults():
    shown = help_flags()
    documented = documented_flags()
    assert set(shown) == set(documented), f"flags in --help but not in {OPERATIONS} (or the reverse)"
    for flag, default in documented.items():
        assert shown[flag] == default, f"{flag}: --help says {shown[flag]!r}, {OPERATIONS} {default!r}"


def documented_metrics():
    families = set(re.findall(r"^\| `((?:mergewatch|process)_[a-z_]+)`", doc_section(METRICS, "Families"), re.M))
    assert families, f"no metric table under '## Families' in {METRICS}"
    return families


def test_every_documented_metric_is_in_the_code():
    code = "".join(open(p).read() for ext in ("cpp", "h")
                   for p in glob.glob(os.path.join(REPO, "daemon", "**", "*." + ext), recursive=True))
    missing = {m for m in documented_metrics() if f'"{m}"' not in code}
    assert not missing, f"documented in {METRICS}, exported nowhere: {sorted(missing)}"


# Families that need a dm or md device stacked on a disk (bios at a bio-based device, the
# block_bio_remap chain, an upper device for the detector): the host has neither, so they are
# checked in the VM, in tests/vm/test_vm_stacking.py (an LV and an md RAID0 on the guest's NVMe disk) or
# tests/vm/test_vm_split.py (the split ticket: snapshots read with direct I/O).
VM_ONLY = {
    "mergewatch_bio_size_bytes": "bios at dm/md (block_bio_queue, attached while one is stacked)",
    "mergewatch_remapped_requests_total": "a disk's requests remapped from a dm/md device (block_bio_remap)",
    "mergewatch_remapped_missed_merges_total": "the same, missed merges",
    "mergewatch_collapse_upper_bio_bytes": "the detector's upper device (dm, or md with require-upper=any)",
    "mergewatch_collapse_upper_request_ratio": "the same, share of requests from it",
    "mergewatch_io_split_finding": "a snapshot's bios cut into chunks no setting merges (tests/vm/test_vm_split.py)",
    "mergewatch_remapped_dispatched_requests_total": "a volume's requests at the disk (block_bio_remap chain)",
    "mergewatch_remapped_dispatched_bytes_total": "the same, their bytes",
    "mergewatch_remapped_request_latency_seconds": "the same, their device time",
    "mergewatch_collapse_service_request_ratio": "the services behind a collapsed pair with an upper device",
}


def families_with_samples(text):
    """Families with at least one sample: prometheus-cpp prints # TYPE for empty families too."""
    from prometheus_client.parser import text_string_to_metric_families
    return {f.name for f in text_string_to_metric_families(text) if f.samples}


@pytest.mark.privileged
def test_every_documented_metric_family_is_exported_live(daemon_factory, loop_device):
    """Each family in docs/metrics.md's table shows samples in a live scrape, with the setup that makes
    the conditional ones appear: I/O through mq-deadline (queue latency: insert fires), a loop disk
    as a detector candidate (collapse gauges), and a sysfs tree with an LVM stack (device_holder_info;
    the fixture of the 2019 incident, as the daemon sees it through --path.sysfs)."""
    documented = documented_metrics()
    d = daemon_factory("--collapse.lower-devices=^loop", "--collapse.require-upper=none")
    dev = loop_device()
    dev.set_queue(scheduler="mq-deadline", nomerges=2)
    fio(dev, size_mb=8)
    stacked = daemon_factory(f"--path.sysfs={os.path.join(REPO, 'tests', 'fixtures', 'sysfs', 'seed-lvm-snapshot')}")
    others = families_with_samples(stacked.scrape_text())
    # LinkedIn's RAID1 members on none with no elevator loaded: the queue findings.
    hdd = daemon_factory(f"--path.sysfs={os.path.join(REPO, 'tests', 'fixtures', 'sysfs', 'md-raid1-hdd')}")
    others |= families_with_samples(hdd.scrape_text())
    assert set(VM_ONLY) <= documented, f"VM_ONLY names a family {METRICS} does not document"

    def missing():
        live = others | families_with_samples(d.scrape_text())
        live |= {f + "_total" for f in live}  # prometheus_client names counters without their _total suffix
        return documented - set(VM_ONLY) - live
    # The detector's families follow its first tick after the I/O: polled until they are there.
    wait_until(lambda: not missing(), 30, "every documented family in a live scrape", interval=0.2,
               on_timeout=lambda: f"documented but without samples in a live scrape: {sorted(missing())}")
    vm_test = "".join(open(os.path.join(REPO, "tests", "vm", f)).read()
                      for f in ("test_vm_stacking.py", "test_vm_split.py", "test_vm_who.py"))
    # A histogram is checked by its name or by its _count/_sum series.
    unchecked = {f for f in VM_ONLY if not any(f'"{f}{suffix}"' in vm_test for suffix in ("", "_count", "_sum"))}
    assert not unchecked, f"VM-only families the VM test does not check: {sorted(unchecked)}"


@pytest.mark.privileged
def test_every_exported_metric_is_documented(daemon_factory, loop_device):
    # A loop device as a detector candidate, so the detector's gauges are exported too.
    d = daemon_factory("--collapse.lower-devices=^loop", "--collapse.require-upper=none")
    dev = loop_device()
    dev.set_queue(scheduler="mq-deadline", nomerges=2)
    fio(dev, size_mb=8)
    families = {m.group(1) for m in re.finditer(r"^# TYPE (\S+) ", d.scrape_text(), re.M)}
    ours = families
    assert not {f for f in families if f.startswith("exposer_")}, "no HTTP library metrics (NaN quantiles)"
    assert "process_resident_memory_bytes" in ours and "mergewatch_bpf_program_runs_total" in ours
    assert "mergewatch_collapse_small_request_ratio" in ours, "the detector's evidence should be exported"
    undocumented = ours - documented_metrics()
    assert not undocumented, f"exported but missing from the metrics table of {METRICS}: {sorted(undocumented)}"


MAN_PAGE = os.path.join(REPO, "docs", "mergewatchd.8")


def render_man(*cmd, env=None):
    """stdout of a man page renderer; fails on any warning it printed."""
    if shutil.which(cmd[0]) is None:
        pytest.fail(f"{cmd[0]} not found: install the Debian packages groff and man-db (make deps)")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and not r.stderr.strip(), f"{' '.join(cmd)}: rc {r.returncode}\n{r.stderr}"
    return r.stdout


def man_text():
    # -Tascii with overstriking off (grotty -c -b -o -u): plain text, \- is "-".
    return render_man("groff", "-ww", "-man", "-Tascii", "-P-cbou", MAN_PAGE)


def man_section(title):
    return man_text().split(f"\n{title}\n", 1)[1].split("\n\n\n", 1)[0] if f"\n{title}\n" in man_text() else ""


def test_man_page_renders_without_warnings():
    text = man_text()
    for section in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "METRICS", "SIGNALS", "EXIT STATUS", "FILES",
                    "EXAMPLES"):
        assert f"\n{section}\n" in text, f"man page has no {section} section"
    # man-db's own pipeline as a reader gets it (tbl, groff, grotty), with all its warnings on.
    env = dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0", LC_ALL="C.UTF-8")
    out = render_man("man", "--warnings=all", "-l", MAN_PAGE, env=env)
    assert "mergewatchd" in out


def test_man_page_environment_lists_every_variable_the_daemon_reads():
    """ENVIRONMENT names exactly the variables the daemon's code passes to getenv()."""
    code = ""
    for root, _, files in os.walk(os.path.join(REPO, "daemon")):
        for name in files:
            if name.endswith((".cpp", ".h")):
                with open(os.path.join(root, name)) as f:
                    code += f.read()
    read = set(re.findall(r'getenv\("([A-Z_]+)"\)', code))
    assert {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "JOURNAL_STREAM"} <= read
    documented = set(re.findall(r"^ {7}([A-Z][A-Z_]+)$", man_section("ENVIRONMENT"), re.M))
    assert documented == read, f"man page ENVIRONMENT {sorted(documented)}, getenv() in daemon/ {sorted(read)}"


def man_flags():
    """{flag: default} from the man page's OPTIONS: tag lines `--flag=value (default: X)`, `--version`, `-h, --help`."""
    flags = {}
    for m in re.finditer(r"^ {7}(?:-h, )?(--[a-z][a-z.-]*)(?:=\S+)?(?: \(default: (\S*)\))?$",
                         man_section("OPTIONS"), re.M):
        flags[m.group(1)] = m.group(2) or ""
    return flags


def test_man_page_and_help_list_the_same_flags_and_defaults():
    shown, man = help_flags(), man_flags()
    missing = sorted(set(shown) - set(man))
    extra = sorted(set(man) - set(shown))
    wrong = sorted(f"{f}: --help {shown[f]!r}, man page {man[f]!r}" for f in set(shown) & set(man)
                   if shown[f] != man[f])
    lines_to_add = "".join(f"\n  .TP\n  .BI \\-\\-{f[2:].replace('-', chr(92) + '-')}= value \" \\fR(default: \\fB{shown[f]}\\fR)\""
                           f"\n  <what it does>" for f in missing)
    assert not (missing or extra or wrong), (
        f"docs/mergewatchd.8 OPTIONS is out of step with --help:\n"
        f"in --help, not in the man page: {missing}\nin the man page, not in --help: {extra}\n"
        f"defaults that differ: {wrong}\nadd to docs/mergewatchd.8 under .SH OPTIONS:{lines_to_add}")


def test_man_page_lists_the_documented_metrics():
    man = set(re.findall(r"^ {7}((?:mergewatch|process)_[a-z_]+)$", man_section("METRICS"), re.M))
    documented = documented_metrics()
    assert man == documented, (
        f"docs/mergewatchd.8 METRICS is out of step with the metrics table of {METRICS}:\n"
        f"in {METRICS}, not in the man page: {sorted(documented - man)}\n"
        f"in the man page, not in {METRICS}: {sorted(man - documented)}\n"
        "add each as `.TP` / `.B name` / `Type (labels): meaning.` under .SH METRICS")


def test_man_page_lists_every_exit_code():
    with open(os.path.join(REPO, "daemon", "exit_codes.h")) as f:
        codes = {int(c) for c in re.findall(r"kExit\w+ = (\d+),", f.read())}
    listed = {int(c) for c in re.findall(r"^ {7}(\d+)(?: {2,}|$)", man_section("EXIT STATUS"), re.M)}
    assert codes and listed == codes, f"daemon/exit_codes.h has {sorted(codes)}, the man page {sorted(listed)}"


def exit_codes_in_code():
    """{name: code} from daemon/exit_codes.h."""
    text = open(os.path.join(REPO, "daemon", "exit_codes.h")).read()
    return {name: int(code) for name, code in re.findall(r"^\s+(kExit\w+) = (\d+),", text, re.M)}


def test_exit_codes_agree_across_code_docs_runbook_and_unit():
    """Every exit code of exit_codes.h is in the table of docs/operations.md, the runbook names every failure
    code, and the unit retries exactly the ones that can heal by retrying: 1 (unexpected runtime
    failure) and 6 (BPF load/attach, e.g. a transient resource shortage) and 5 (the port may come
    free) restart; 2, 3 and 4 (a flag, the kernel, the privileges) need an operator first."""
    codes = exit_codes_in_code()
    assert set(codes.values()) == set(range(7)), codes
    documented = {int(c) for c in re.findall(r"^\| (\d+) \|", doc_section(OPERATIONS, "Exit codes"), re.M)}
    assert documented == set(codes.values()), f"the exit code table of {OPERATIONS} vs daemon/exit_codes.h"
    runbook = open(os.path.join(REPO, "docs", "runbook.md")).read()
    in_runbook = {int(c) for c in re.findall(r"^\s+\| (\d+) \|", runbook, re.M)}
    assert in_runbook == set(codes.values()) - {codes["kExitOk"], codes["kExitFailure"]}, in_runbook
    unit = open(os.path.join(REPO, "deploy", "systemd", "mergewatchd.service.in")).read()
    prevent = {int(c) for c in re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.M).group(1).split()}
    assert prevent == {codes["kExitUsage"], codes["kExitNoBtf"], codes["kExitNoPrivilege"]}, prevent
    assert re.search(r"^Restart=on-failure$", unit, re.M), "exits 1, 5 and 6 must be restarted"
    for name in ("kExitFailure", "kExitListen", "kExitBpfLoad"):
        assert codes[name] not in prevent, name
    assert "Exits 2, 3 and 4 are not retried" in runbook
