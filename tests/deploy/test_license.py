# SPDX-License-Identifier: Apache-2.0
"""The license: Apache-2.0 for the daemon, tests and deploy files; "BSD-2-Clause OR GPL-2.0-only" for the
BPF programs and the headers compiled into them (their object's LICENSE string stays "Dual BSD/GPL", which
the kernel needs for GPL-only helpers). Every source file says which in an SPDX line near its top, and
debian/copyright (machine-readable) says the same per path."""
import os
import re
import subprocess

from conftest import REPO

APACHE = "Apache-2.0"
DUAL = "BSD-2-Clause OR GPL-2.0-only"
# What counts as source: code, scripts, build files, deploy configs. Data (fixtures, goldens, JSON,
# pictures) and prose (Markdown) carry no header.
SOURCE_SUFFIXES = (".c", ".h", ".cpp", ".py", ".sh", ".mk", ".yml", ".libsonnet", ".jsonnet", ".bt",
                   ".in", ".socket", ".conf", ".ini", ".8")
SOURCE_NAMES = ("Makefile", "debian/rules", ".ci/run", "deploy/default/mergewatchd")


def tracked_files():
    out = subprocess.run(["git", "-C", REPO, "ls-files", "-z"], check=True, capture_output=True).stdout
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def is_source(path):
    if path.startswith("tests/fixtures/"):
        return False
    return path in SOURCE_NAMES or path.endswith(SOURCE_SUFFIXES)


def expected_license(path):
    bpf_side = (path.startswith(("bpf/", "include/")) or path.endswith(".bpf.c") or path.endswith(".bt"))
    return DUAL if bpf_side else APACHE


def spdx_of(path):
    with open(os.path.join(REPO, path), encoding="utf-8", errors="replace") as f:
        head = [f.readline() for _ in range(3)]
    for line in head:
        m = re.search(r"SPDX-License-Identifier: (.+?)\s*(\*/)?\s*$", line)
        if m:
            return m.group(1)
    return None


def test_every_source_file_names_its_license():
    files = [p for p in tracked_files() if is_source(p)]
    assert len(files) > 100, "the walk found too few source files: is this a git checkout?"
    wrong = {p: spdx_of(p) for p in files if spdx_of(p) != expected_license(p)}
    assert not wrong, "files whose SPDX line is missing or names the wrong license: %r" % wrong


def test_bpf_object_license_string_stays_dual_bsd_gpl():
    # The kernel grants GPL-only helpers to "Dual BSD/GPL"; an SPDX expression there would be refused.
    with open(os.path.join(REPO, "bpf", "mergewatch.bpf.c"), encoding="utf-8") as f:
        assert 'char LICENSE[] SEC("license") = "Dual BSD/GPL";' in f.read()


def test_license_texts_are_shipped():
    with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as f:
        assert "Apache License" in f.read(200)
    for name, marker in (("Apache-2.0.txt", "Apache License"), ("BSD-2-Clause.txt", "Redistribution and use"),
                         ("GPL-2.0-only.txt", "GNU GENERAL PUBLIC LICENSE")):
        with open(os.path.join(REPO, "LICENSES", name), encoding="utf-8") as f:
            assert marker in f.read(), name


def test_debian_copyright_is_machine_readable_with_both_licenses():
    with open(os.path.join(REPO, "debian", "copyright"), encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/")
    stanzas = [s for s in text.split("\n\n") if s.strip()]
    files = {}
    standalone = set()
    for s in stanzas:
        fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", s, re.M))
        if "Files" in fields:
            files[fields["Files"]] = fields["License"]
        elif "License" in fields and "Format" not in fields:
            standalone.add(fields["License"])
    assert files.get("*") == APACHE
    bpf_stanza = [k for k in files if "bpf/*" in k.split() and "include/*" in k.split()]
    assert bpf_stanza and files[bpf_stanza[0]] == "BSD-2-Clause or GPL-2.0-only"
    # Every license a Files stanza names has its text in a stand-alone License paragraph.
    assert {APACHE, "BSD-2-Clause", "GPL-2.0-only"} <= standalone
    assert "no-license" not in text
