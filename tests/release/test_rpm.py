# SPDX-License-Identifier: Apache-2.0
"""The RPM (`make rpm`): the release tarball's payload where RHEL and Fedora put it, the systemd scriptlets the
spec writes out (preset on first install, disable and stop on removal, restart on upgrade), dependencies that
ask for no glibc newer than 2.31, and rpmlint with Fedora's rules finding no error."""
import os
import re
import subprocess
import tarfile

from conftest import REPO, changelog_version


def rpm_query(package, *args):
    return subprocess.run(["rpm", "-qp", *args, package], check=True, capture_output=True, text=True).stdout


def test_payload_lists_every_file_where_rhel_puts_it(rpm_package):
    files = set(subprocess.run(["rpm", "-qlp", rpm_package], check=True, capture_output=True, text=True)
                .stdout.splitlines())
    for path in ["/usr/sbin/mergewatchd", "/usr/bin/mergewatch", "/usr/lib/systemd/system/mergewatchd.service",
                 "/usr/lib/systemd/system/mergewatchd.socket", "/etc/default/mergewatchd",
                 "/usr/share/man/man8/mergewatchd.8.gz", "/usr/share/man/man8/mergewatch.8.gz",
                 "/usr/share/doc/mergewatch/README.md", "/usr/share/doc/mergewatch/runbook.md",
                 "/usr/share/licenses/mergewatch/Apache-2.0.txt", "/usr/share/licenses/mergewatch/third-party/SOURCES",
                 "/usr/share/mergewatch/prometheus/mergewatch.rules.yml", "/usr/share/mergewatch/grafana/mergewatch.json",
                 "/usr/share/mergewatch/mixin/mixin.libsonnet", "/usr/share/mergewatch/systemd/pre-5.8-kernel.conf",
                 "/usr/share/mergewatch/web-config.example.yml"]:
        assert path in files, path
    assert not [f for f in files if f.startswith("/usr/local")], "an RPM installs nothing under /usr/local"


def test_version_is_the_changelogs(rpm_package):
    assert rpm_query(rpm_package, "--queryformat", "%{VERSION}-%{RELEASE}") == \
        changelog_version().replace("-", "_") + "-1"


def test_binaries_are_the_tarballs(rpm_package, release_dir, tmp_path):
    extract = subprocess.run("rpm2cpio %s | cpio -idm --quiet" % rpm_package, shell=True, cwd=tmp_path,
                             capture_output=True, text=True)
    assert extract.returncode == 0, extract.stderr
    for name, path in (("mergewatchd", "usr/sbin/mergewatchd"), ("mergewatch", "usr/bin/mergewatch")):
        with open(os.path.join(release_dir, name), "rb") as a, open(tmp_path / path, "rb") as b:
            assert a.read() == b.read(), name
    config = (tmp_path / "etc/default/mergewatchd").read_text()
    assert config == open(os.path.join(REPO, "deploy", "default", "mergewatchd")).read()


def test_config_file_survives_upgrades(rpm_package):
    configs = rpm_query(rpm_package, "--queryformat", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]")
    assert re.search(r"^/etc/default/mergewatchd cn$", configs, re.M), configs  # %config(noreplace)


def test_scriptlets_apply_the_preset_and_stop_on_removal(rpm_package):
    scripts = rpm_query(rpm_package, "--scripts")
    post, preun, postun = (re.search(r"^%s scriptlet.*?:\n(.*?)(?=^\w+ scriptlet|\Z)" % name, scripts, re.M | re.S)
                           for name in ("postinstall", "preuninstall", "postuninstall"))
    assert post and preun and postun, scripts
    assert "[ $1 -eq 1 ]" in post.group(1) and "systemctl --no-reload preset mergewatchd.service" in post.group(1)
    assert "enable" not in post.group(1), "the preset decides; RHEL's leaves a new service disabled"
    assert "[ $1 -eq 0 ]" in preun.group(1) and "disable --now mergewatchd.service mergewatchd.socket" in preun.group(1)
    assert "daemon-reload" in postun.group(1) and "try-restart mergewatchd.service" in postun.group(1)


def test_requires_no_glibc_newer_than_2_31(rpm_package):
    requires = rpm_query(rpm_package, "--requires").splitlines()
    glibc = [tuple(int(x) for x in v.split(".")) for v in re.findall(r"\(GLIBC_([0-9.]+)\)", "\n".join(requires))]
    assert glibc and max(glibc) <= (2, 31), requires
    libraries = {r.split("(")[0] for r in requires if ".so" in r}
    assert libraries <= {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
                         "ld-linux-x86-64.so.2", "libgnutls.so.30", "libp11-kit.so.0", "libz.so.1"}, libraries


def test_rpmlint_with_fedoras_rules_finds_no_error(rpm_package, tmp_path):
    spec = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(rpm_package))), "SPECS", "mergewatch.spec")
    r = subprocess.run(["rpmlint", "-c", os.path.join(REPO, "packaging", "rpmlint.toml"), spec, rpm_package],
                       capture_output=True, text=True)
    summary = re.search(r"(\d+) errors, (\d+) warnings", r.stdout)
    assert summary, r.stdout + r.stderr
    assert summary.group(1) == "0", r.stdout
