# SPDX-License-Identifier: Apache-2.0
"""The release binaries run on any x86-64 Linux with glibc 2.31 or later: their dynamic section names no
library beyond glibc's own and the few allowed ones, they need no glibc symbol newer than GLIBC_2.31 (and
no libstdc++ or libgcc symbol: those are linked in), and inside a pristine Debian 11 minbase root (glibc
2.31, nothing installed; no host library reachable) `ldd` resolves them and both print the version."""
import hashlib
import os
import re
import shutil
import subprocess

import pytest

from conftest import BINARIES, changelog_version, in_root

# glibc's own libraries on x86-64, and the three shared libraries a release binary may need besides:
# the GnuTLS stack where static linking fails (libp11-kit: no static archive exists) and zlib.
GLIBC_LIBRARIES = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "ld-linux-x86-64.so.2"}
ALLOWED_LIBRARIES = {"libgnutls.so.30", "libp11-kit.so.0", "libz.so.1"}
GLIBC_FLOOR = (2, 31)
# Symbol versions a binary may reference besides GLIBC_*: those of the allowed libraries.
ALLOWED_VERSION_PREFIXES = ("GLIBC_", "LIBP11_KIT_", "GNUTLS_", "ZLIB_")


def tool_output(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", tool_output("readelf", "-d", path))


def symbol_versions(path):
    """{version: [symbols]} of the dynamic symbols the binary takes from elsewhere (objdump -T)."""
    out = {}
    for line in tool_output("objdump", "-T", path).splitlines():
        m = re.search(r"\*UND\*\s+\S+\s+\(?([A-Za-z_][\w.]*)\)?\s+(\S+)$", line)
        if m and m.group(1) not in ("Base",):
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def glibc_version(tag):
    return tuple(int(x) for x in tag[len("GLIBC_"):].split("."))


def test_tarball_layout_and_checksum(tarball, release_dir):
    version = changelog_version()
    assert os.path.basename(release_dir) == "mergewatch-%s.linux-amd64" % version
    assert os.path.basename(tarball) == "mergewatch-%s.linux-amd64.tar.gz" % version
    for name in ["mergewatchd", "mergewatch", "LICENSE", "README.md", "runbook.md", "web-config.example.yml",
                 "LICENSES/Apache-2.0.txt", "LICENSES/BSD-2-Clause.txt", "LICENSES/GPL-2.0-only.txt",
                 "LICENSES/third-party/SOURCES", "systemd/mergewatchd.service", "systemd/mergewatchd.socket",
                 "default/mergewatchd", "prometheus/mergewatch.rules.yml", "grafana/mergewatch.json",
                 "mixin/mixin.libsonnet", "man/mergewatchd.8", "man/mergewatch.8"]:
        assert os.path.isfile(os.path.join(release_dir, name)), name
    for name in BINARIES:
        assert os.access(os.path.join(release_dir, name), os.X_OK), name
    sums = os.path.join(os.path.dirname(tarball), "sha256sums.txt")
    with open(tarball, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    assert open(sums).read() == "%s  %s\n" % (digest, os.path.basename(tarball))


@pytest.mark.parametrize("name", BINARIES)
def test_needs_only_glibc_and_the_allowed_libraries(release_dir, name):
    libs = needed(os.path.join(release_dir, name))
    assert "libc.so.6" in libs, libs
    extra = sorted(set(libs) - GLIBC_LIBRARIES - ALLOWED_LIBRARIES)
    assert not extra, "%s needs %s: link them statically (allowed besides glibc: %s)" % (
        name, extra, sorted(ALLOWED_LIBRARIES))


@pytest.mark.parametrize("name", BINARIES)
def test_no_glibc_symbol_newer_than_2_31(release_dir, name):
    versions = symbol_versions(os.path.join(release_dir, name))
    glibc = [v for v in versions if v.startswith("GLIBC_") and not v.startswith("GLIBC_PRIVATE")]
    assert glibc, "objdump -T found no GLIBC_ symbol versions: %r" % versions
    newer = {v: versions[v] for v in glibc if glibc_version(v) > GLIBC_FLOOR}
    assert not newer, "%s needs glibc symbols newer than GLIBC_2.31: %r" % (name, newer)
    others = {v: syms for v, syms in versions.items() if not v.startswith(ALLOWED_VERSION_PREFIXES)}
    # GLIBCXX_, CXXABI_, GCC_: libstdc++ and libgcc must be linked in, not taken from the host.
    assert not others, "%s takes versioned symbols from other libraries: %r" % (name, others)


@pytest.mark.parametrize("name", BINARIES)
def test_no_rpath_or_runpath(release_dir, name):
    dynamic = tool_output("readelf", "-d", os.path.join(release_dir, name))
    assert "(RPATH)" not in dynamic and "(RUNPATH)" not in dynamic


def test_both_run_in_a_pristine_debian_11_root(release_dir, bullseye_root):
    """chroot: only the root's files are reachable, the binaries bound read-only at /mnt."""
    version = changelog_version()
    r = in_root(bullseye_root, release_dir, "cat /etc/debian_version; ldd --version | head -n 1;"
                " /mnt/mergewatchd --version && /mnt/mergewatch --version")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("11."), "not a Debian 11 root: %r" % lines[0]
    assert lines[1].endswith(" 2.31"), "not glibc 2.31: %r" % lines[1]
    assert "mergewatchd, version %s " % version in r.stdout, r.stdout
    assert "mergewatch %s\n" % version in r.stdout, r.stdout


@pytest.mark.parametrize("name", BINARIES)
def test_ldd_in_the_root_resolves_every_library_from_the_root(release_dir, bullseye_root, name):
    r = in_root(bullseye_root, release_dir, "ldd /mnt/%s" % name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not found" not in r.stdout, r.stdout
    resolved = re.findall(r"^\s*(\S+) => (\S+)", r.stdout, re.M)
    assert resolved, r.stdout
    for lib, path in resolved:
        assert path.startswith(("/lib/", "/usr/lib/")), "%s from %s:\n%s" % (lib, path, r.stdout)
    direct = set(needed(os.path.join(release_dir, name)))
    assert {lib for lib, _ in resolved} >= direct - {"ld-linux-x86-64.so.2"}, r.stdout


def staged_systemd_root(tmp_path, release_dir, sbindir):
    """A root for `systemd-analyze verify --root`: the tarball's units in /etc/systemd/system, the daemon
    in `sbindir` (or nowhere), the host's targets and slices (the units' default dependencies)."""
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    units = root / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    for unit in ("mergewatchd.service", "mergewatchd.socket"):
        shutil.copy(os.path.join(release_dir, "systemd", unit), root / "etc/systemd/system")
    for name in os.listdir("/lib/systemd/system"):
        if name.endswith((".target", ".slice")) and os.path.isfile(os.path.join("/lib/systemd/system", name)):
            shutil.copy(os.path.join("/lib/systemd/system", name), units)
    if sbindir:
        (root / sbindir.lstrip("/")).mkdir(parents=True)
        shutil.copy(os.path.join(release_dir, "mergewatchd"), root / sbindir.lstrip("/"))
    man8 = tmp_path / "man" / "man8"
    man8.mkdir(parents=True)
    for page in ("mergewatchd.8", "mergewatch.8"):
        shutil.copy(os.path.join(release_dir, "man", page), man8)
    return root


def verify(tmp_path, root):
    if shutil.which("systemd-analyze") is None:
        pytest.fail("no systemd-analyze (Debian package systemd)")
    return subprocess.run(["systemd-analyze", "verify", "--root=%s" % root, "mergewatchd.service", "mergewatchd.socket"],
                          capture_output=True, text=True, env=dict(os.environ, MANPATH=str(tmp_path / "man")))


@pytest.mark.parametrize("sbindir", ["/usr/local/sbin", "/usr/sbin"])
def test_the_unit_finds_the_daemon_in_either_sbin(release_dir, tmp_path, sbindir):
    unit = open(os.path.join(release_dir, "systemd", "mergewatchd.service")).read()
    assert re.search(r"^ExecStart=mergewatchd \$MERGEWATCHD_ARGS$", unit, re.M), "ExecStart must name no directory"
    assert not re.search(r"@[A-Z]+@", unit), "a placeholder is left"
    r = verify(tmp_path, staged_systemd_root(tmp_path, release_dir, sbindir))
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


def test_the_unit_fails_verification_without_the_daemon(release_dir, tmp_path):
    """The control: verify does look the command up."""
    r = verify(tmp_path, staged_systemd_root(tmp_path, release_dir, None))
    assert "Command mergewatchd is not executable" in r.stdout + r.stderr, r.stdout + r.stderr
