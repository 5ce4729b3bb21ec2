# SPDX-License-Identifier: Apache-2.0
"""The release tarball under test (`make test-release` sets both variables):

  MERGEWATCH_RELEASE_TARBALL  build/release/mergewatch-<version>.linux-amd64.tar.gz (sha256sums.txt beside it)
  MERGEWATCH_RELEASE_ROOT     the pristine Debian 11 minbase root `make release` made with debootstrap
  MERGEWATCH_RELEASE_RPM      build/rpm/RPMS/x86_64/mergewatch-<version>-1.x86_64.rpm (`make rpm`)

Without them the tests skip, unless MERGEWATCH_NO_SKIP=1 makes that a failure; the tests that
enter the root (chroot) need root as well."""
import os
import subprocess
import tarfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHROOT_RUN = os.path.join(REPO, "packaging", "release", "chroot-run.sh")
TARBALL = os.environ.get("MERGEWATCH_RELEASE_TARBALL", "")
ROOT = os.environ.get("MERGEWATCH_RELEASE_ROOT", "")
RPM = os.environ.get("MERGEWATCH_RELEASE_RPM", "")
NO_SKIP = os.environ.get("MERGEWATCH_NO_SKIP") == "1"
BINARIES = ("mergewatchd", "mergewatch")


def skip_or_fail(reason):
    if NO_SKIP:
        pytest.fail(reason + " (MERGEWATCH_NO_SKIP=1)")
    pytest.skip(reason)


def changelog_version():
    return subprocess.run(["dpkg-parsechangelog", "-l", os.path.join(REPO, "debian", "changelog"), "-S", "Version"],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="session")
def tarball():
    if not TARBALL or not os.path.isfile(TARBALL):
        skip_or_fail("no release tarball: run `make test-release` (MERGEWATCH_RELEASE_TARBALL=%r)" % TARBALL)
    return TARBALL


@pytest.fixture(scope="session")
def release_dir(tarball, tmp_path_factory):
    """The tarball unpacked: the path of its one top folder."""
    out = tmp_path_factory.mktemp("release")
    with tarfile.open(tarball) as t:
        t.extractall(out)
    tops = os.listdir(out)
    assert len(tops) == 1, "the tarball must hold one top folder, not %r" % tops
    return os.path.join(out, tops[0])


@pytest.fixture(scope="session")
def rpm_package():
    if not RPM or not os.path.isfile(RPM):
        skip_or_fail("no RPM: run `make test-release` (MERGEWATCH_RELEASE_RPM=%r)" % RPM)
    return RPM


@pytest.fixture(scope="session")
def bullseye_root():
    if os.geteuid() != 0:
        skip_or_fail("entering the Debian 11 root (chroot) needs root")
    if not ROOT or not os.path.isfile(os.path.join(ROOT, "etc", "debian_version")):
        skip_or_fail("no Debian 11 root: run `make test-release` (MERGEWATCH_RELEASE_ROOT=%r)" % ROOT)
    return ROOT


def in_root(root, release_dir, command):
    """`command` (sh) inside the root with the unpacked release bound read-only at /mnt."""
    return subprocess.run([CHROOT_RUN, root, "-b", release_dir + ":/mnt:ro", "--", "/bin/sh", "-c", command],
                          capture_output=True, text=True, timeout=120)
