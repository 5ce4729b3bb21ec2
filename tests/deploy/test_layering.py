# SPDX-License-Identifier: Apache-2.0
"""The daemon's folders include each other in the directions docs/architecture.md allows ("Include directions"):
the table there is read here, and every #include "..." of daemon/ that names a file of another group is checked
against it. A new upward or sideways include fails this test until the table (and the design) says otherwise."""
import glob
import os
import re

from conftest import REPO

ARCHITECTURE = os.path.join(REPO, "docs", "architecture.md")
FOLDERS = ("topology", "source", "detector", "findings", "metrics", "http", "attribution")


def allowed_directions():
    """{group: set of groups it may include}, from the table under "## Include directions"; and the base files."""
    with open(ARCHITECTURE) as f:
        text = f.read()
    section = text.split("## Include directions", 1)[1].split("\n## ", 1)[0]
    allowed, base_files = {}, set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("from", "---") or set(cells[0]) <= {"-"}:
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        if cells[0].startswith("base:"):
            group = "base"
            base_files = set(names)
        else:
            assert len(names) == 1 and names[0].rstrip("/") in FOLDERS, f"unknown row: {line}"
            group = names[0].rstrip("/")
        targets = {t.rstrip("/") for t in re.findall(r"`([^`]+)`", cells[1])}
        if re.search(r"\bbase\b", cells[1]):
            targets.add("base")
        allowed[group] = targets
    assert set(allowed) == {"base", *FOLDERS}, f"the table must name every folder and the base: {sorted(allowed)}"
    assert base_files, "no base files named"
    return allowed, base_files


def group_of(relative, base_files):
    """The group of a path relative to daemon/: a folder, "base", or "lifecycle" (the other top-level files)."""
    if "/" in relative:
        return relative.split("/", 1)[0]
    return "base" if relative in base_files else "lifecycle"


def violations(allowed, base_files, daemon_dir):
    found = []
    for path in sorted(glob.glob(os.path.join(daemon_dir, "**", "*.[ch]*"), recursive=True)):
        relative = os.path.relpath(path, daemon_dir)
        source = group_of(relative, base_files)
        if source == "lifecycle":
            continue
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m or not os.path.exists(os.path.join(daemon_dir, m.group(1))):
                    continue  # the ABI (include/mergewatch/), the generated skeleton, system headers
                target = group_of(m.group(1), base_files)
                if target != source and target not in allowed[source]:
                    found.append(f"daemon/{relative}:{number}: {source} includes {target} ({m.group(1)})")
    return found


def test_every_include_follows_the_documented_directions():
    allowed, base_files = allowed_directions()
    found = violations(allowed, base_files, os.path.join(REPO, "daemon"))
    assert not found, "includes against docs/architecture.md's directions:\n" + "\n".join(found)


def test_an_upward_include_is_caught(tmp_path):
    """The check itself: a copy of daemon/ with topology/ including metrics/ fails it."""
    import shutil
    allowed, base_files = allowed_directions()
    copy = tmp_path / "daemon"
    shutil.copytree(os.path.join(REPO, "daemon"), copy)
    with open(copy / "topology" / "topology.h", "a") as f:
        f.write('#include "metrics/exposition.h"\n')
    found = violations(allowed, base_files, str(copy))
    assert len(found) == 1 and "topology includes metrics" in found[0], found
