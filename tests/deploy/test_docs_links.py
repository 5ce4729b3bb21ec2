# SPDX-License-Identifier: Apache-2.0
"""The documentation's relative links lead somewhere: every link in README.md, CONTRIBUTING.md, docs/*.md and the
other tracked Markdown files that is not a URL names a file or folder of the repository, and where it carries a
#anchor, a heading of that Markdown file (GitHub's anchors: the heading's text in lower case, punctuation but - and
_ dropped, spaces turned into -, a repeated anchor numbered -1, -2, ...). A section renamed or moved fails here,
naming the link, instead of leaving a reader at the top of a page. No tracker numbers in the prose either: a reader
of the repository cannot see the tracker."""
import glob
import os
import re
import subprocess
import urllib.parse

from conftest import REPO

REQUIRED = ("README.md", "CONTRIBUTING.md", "docs/runbook.md", "docs/architecture.md", "docs/metrics.md",
            "docs/operations.md", "docs/detector.md", "docs/kernels.md", "docs/testing.md", "docs/building.md")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
URL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, file:, man: ...


def markdown_files():
    """The required pages, docs/*.md and every tracked Markdown file, as paths relative to the repository."""
    found = set(REQUIRED) | {os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md"))}
    tracked = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--", "*.md"], capture_output=True).stdout
    found |= {p.decode() for p in tracked.split(b"\0") if p}
    return sorted(p for p in found if os.path.isfile(os.path.join(REPO, p)))  # a missing page: test_the_pages_exist


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with inline code spans blanked out."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)


def github_anchor(heading):
    """The id GitHub gives a heading: its text without markup, lower case, punctuation but - and _ dropped,
    each space a -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and _ (Unicode letters too, as GitHub)
    return text.replace(" ", "-")


def anchors_of(path):
    """Every anchor a reader can link to in the Markdown file: its headings' ids (repeats numbered as GitHub
    numbers them) and explicit <a name=...> / <a id=...>."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    anchors, seen = set(), {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        m = HEADING.match(line)
        if m:
            base = github_anchor(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
        anchors.update(HTML_ANCHOR.findall(line))
    return anchors


def links_of(path):
    """(line number, target) for every link and image of the Markdown file at path."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        for target in INLINE_LINK.findall(line):
            yield number, target
        m = REFERENCE_DEFINITION.match(line)
        if m:
            yield number, m.group(1)


def broken_links(path):
    """Messages for the relative links of one Markdown file that lead nowhere."""
    broken = []
    for number, target in links_of(path):
        if not target or URL.match(target):
            continue
        where = f"{path}:{number}: ({target})"
        file_part, _, anchor = target.partition("#")
        file_part = urllib.parse.unquote(file_part)
        if file_part.startswith("/"):  # GitHub resolves a leading / at the repository's root
            resolved = os.path.normpath(os.path.join(REPO, file_part.lstrip("/")))
        elif file_part:
            resolved = os.path.normpath(os.path.join(REPO, os.path.dirname(path), file_part))
        else:
            resolved = os.path.join(REPO, path)  # #anchor: this file
        if os.path.relpath(resolved, REPO).startswith(".."):
            broken.append(f"{where} leaves the repository")
            continue
        if not os.path.exists(resolved):
            broken.append(f"{where}: no file {os.path.relpath(resolved, REPO)}")
            continue
        if anchor and resolved.endswith(".md"):
            anchor = urllib.parse.unquote(anchor)
            if anchor not in anchors_of(resolved):
                broken.append(f"{where}: {os.path.relpath(resolved, REPO)} has no heading with the anchor #{anchor}")
    return broken


def test_the_pages_exist():
    missing = [p for p in REQUIRED if not os.path.isfile(os.path.join(REPO, p))]
    assert not missing, f"documentation pages missing: {missing}"


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = [message for path in markdown_files() for message in broken_links(path)]
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_the_anchor_rule_is_githubs():
    """The anchors of headings this documentation links to, as GitHub renders them."""
    assert github_anchor("On call: the `mergewatch` command") == "on-call-the-mergewatch-command"
    assert github_anchor("The VM test (`make test-vm`)") == "the-vm-test-make-test-vm"
    assert github_anchor("Without BPF: the diskstats source") == "without-bpf-the-diskstats-source"
    assert github_anchor("max_sectors_capped") == "max_sectors_capped"
    assert github_anchor("Running one suite, one test, one VM case") == "running-one-suite-one-test-one-vm-case"


def test_no_tracker_numbers_in_the_documentation():
    found = []
    for path in markdown_files():
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if re.search(r"issues? [0-9]+", line, re.I):
                    found.append(f"{path}:{number}: {line.strip()}")
    assert not found, "tracker numbers (say what was measured or why instead):\n" + "\n".join(found)
