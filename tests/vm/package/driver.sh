#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Driver of the package VM test (tests/vm/run-vm.sh --package DEB, tests/vm/test_package.py): runs as root
# in the guest under the host's systemd as PID 1, on Debian's 6.1 kernel, with nothing of mergewatch
# installed. It installs the package as a fleet host would (`apt-get install ./mergewatch_*.deb`),
# checks what the package's maintainer scripts did (enabled, started, Type=notify, /metrics answers with
# the programs attached), then `apt-get purge` and checks that nothing is left: no unit, no process, no
# BPF program or link, no file of the package, no flags file.
#
# Writes into $MW_OUT (/vmout): results.txt (key=value), guest.log, metrics-installed.prom,
# show-installed.txt, dpkg-files.txt, bpftool-{prog,link}-{installed,purged}.json, left-after-purge.txt,
# journal-mergewatchd.txt, journal-boot.txt, exit-status (the number of failed driver checks). Then it
# powers the VM off.
set -u
tag=mw-package
# shellcheck source=tests/vm/driver-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../driver-lib.sh"
# shellcheck source=/dev/null
. "$out/guest.env"

say "$(systemctl --version | head -n 1), kernel $(uname -r), package $MW_PACKAGE"
# The guest's root is the host's (a container image), whose policy-rc.d forbids starting services from
# maintainer scripts ("exit 101"). A real host has none: remove it from the guest's overlay.
[ -e /usr/sbin/policy-rc.d ] && rm -f /usr/sbin/policy-rc.d && say "removed the container image's /usr/sbin/policy-rc.d"
# Three costs of a container image's apt under TCG over 9p that have nothing to do with this package
# (measured: install 85 s and purge 77 s with them): the man-db trigger rebuilding the whole man index
# (twice on purge), PackageKit started by apt's DPkg::Post-Invoke hook, and parsing the 26 MB of
# repository lists. The guest has no network, and every dependency is installed already (the host's
# userland), so apt resolves against the dpkg status alone, with an empty lists directory.
rm -f /var/lib/man-db/auto-update
# The guest's root is an overlay on the host's live /: another apt run on the host (a shared machine)
# shows its dpkg journal through the lower layer ("dpkg was interrupted", measured once). Snapshot the
# dpkg state the package run touches into the guest: status copied up, updates/ and triggers/ on tmpfs.
for d in updates triggers; do
	cp -a /var/lib/dpkg/$d /run/mw-dpkg-$d && mount -t tmpfs -o mode=0755 tmpfs /var/lib/dpkg/$d &&
		cp -a /run/mw-dpkg-$d/. /var/lib/dpkg/$d/
done
rm -f /var/lib/dpkg/updates/*  # a host dpkg run caught in the middle is not ours to finish
cp -p /var/lib/dpkg/status /var/lib/dpkg/status.mw && mv /var/lib/dpkg/status.mw /var/lib/dpkg/status
say "dpkg state snapshot taken"
systemctl mask --runtime --now packagekit.service > /dev/null 2>&1
mkdir -p /run/mw-apt-lists/partial
apt_opts=(-o Dir::State::Lists=/run/mw-apt-lists -o Dpkg::Use-Pty=0)
# (dpkg's own record of the package, not dpkg-query: that parses all of status and available, 12 s here)
check clean_before test ! -e /var/lib/dpkg/info/mergewatch.list -a ! -e /lib/systemd/system/$unit \
	-a ! -e /usr/sbin/mergewatchd

# 1. Install as a fleet host does. No network in the guest: the dependencies are already installed
#    (the host's userland), so apt only has to unpack and configure this package.
cd "$(dirname "$MW_PACKAGE")" || exit 1
t0=$(up)
say "apt-get install ./$(basename "$MW_PACKAGE")"
DEBIAN_FRONTEND=noninteractive timeout 240 apt-get install -y --no-install-recommends "${apt_opts[@]}" \
	"./$(basename "$MW_PACKAGE")" > "$out/apt-install.log" 2>&1; rc=$?
res install_rc "$rc"
res install_seconds "$(since "$t0")"
cd / || exit 1
check install test "$rc" = 0
res package_status "$(dpkg-query -W -f='${Status} ${Version}' mergewatch 2>&1)"
dpkg -L mergewatch > "$out/dpkg-files.txt" 2>&1
res conffiles "$(dpkg-query -W -f='${Conffiles}' mergewatch | awk 'NF { print $1 }' | tr '\n' ' ')"

# 2. What the maintainer scripts did, untouched by this driver: enabled and started (Type=notify, so
#    `deb-systemd-invoke start` returned after READY=1).
{ systemctl show "$unit"; echo; systemctl status --no-pager "$unit"; } > "$out/show-installed.txt" 2>&1
res is_enabled "$(systemctl is-enabled "$unit" 2>&1)"
res wants_link "$(readlink /etc/systemd/system/multi-user.target.wants/$unit)"
res active "$(systemctl is-active "$unit" 2>&1)"
res type "$(prop Type)"
res fragment_path "$(prop FragmentPath)"
res documentation "$(prop Documentation)"
res main_pid "$(prop MainPID)"
res status_text "$(prop StatusText)"
res main_user "$(ps -o user= -p "$(prop MainPID)" 2>/dev/null)"
check service_active test "$(systemctl is-active "$unit")" = active -a "$(prop Type)" = notify
curl -sS --max-time 10 "$url" > "$out/metrics-installed.prom" 2>> "$out/guest.log"; rc=$?
res metrics_rc "$rc"
check metrics test "$rc" = 0 -a -s "$out/metrics-installed.prom"
bpf_snapshot installed
res uid "$(awk '/^Uid:/ { print $2 }' "/proc/$(prop MainPID)/status" 2>/dev/null)"
main_pid=$(prop MainPID)
res version_report "$(/usr/sbin/mergewatchd --version 2>&1 | tr '\n' ';')"
# The shipped example Prometheus config, as installed, names the installed rule file (host's promtool).
promtool check config /usr/share/mergewatch/prometheus/prometheus.example.yml > "$out/promtool-example.txt" 2>&1
res example_config_rc "$?"

# 2b. An admin opts in to the socket (on another port: the running service holds :9863; the drop-in is
#     this driver's, in /run, removed below), then `apt-get remove`: the package's prerm must stop and
#     disable the socket, not leave it listening for a binary that is gone.
mkdir -p /run/systemd/system/mergewatchd.socket.d
printf '[Socket]\nListenStream=\nListenStream=127.0.0.1:19863\n' > /run/systemd/system/mergewatchd.socket.d/mw-test.conf
systemctl daemon-reload
# systemd refuses to start a socket whose service is running ("Socket service ... already active"): stop
# the service, start the socket, start the service again (it gets the socket's fd, unused without
# --web.systemd-socket, and binds :9863 as before), so the remove below has both to stop.
systemctl stop "$unit"
systemctl enable --now mergewatchd.socket >> "$out/guest.log" 2>&1
systemctl start "$unit"
main_pid=$(prop MainPID)
res socket_enabled_before "$(systemctl is-enabled mergewatchd.socket 2>&1)"
res socket_active_before "$(systemctl is-active mergewatchd.socket 2>&1)"
res service_active_with_socket "$(systemctl is-active "$unit" 2>&1)"
say "apt-get remove mergewatch"
DEBIAN_FRONTEND=noninteractive timeout 240 apt-get remove -y "${apt_opts[@]}" mergewatch \
	> "$out/apt-remove.log" 2>&1; rc=$?
res remove_rc "$rc"
res socket_active_after_remove "$(systemctl is-active mergewatchd.socket 2>&1)"
res socket_link_after_remove "$(ls /etc/systemd/system/sockets.target.wants/mergewatchd.socket 2>/dev/null)"
res socket_listening_after_remove "$(ss -Hltn 'sport = :19863' 2>/dev/null | wc -l)"
res service_active_after_remove "$(systemctl is-active "$unit" 2>&1)"
check socket_removed test "$rc" = 0 -a "$(systemctl is-active mergewatchd.socket)" != active \
	-a ! -L /etc/systemd/system/sockets.target.wants/mergewatchd.socket
rm -rf /run/systemd/system/mergewatchd.socket.d
systemctl daemon-reload

# 3. Purge (after the remove above: the conffile and purge-time state are left): removes the conffile
#    and the units' enablement state.
t0=$(up)
say "apt-get purge mergewatch"
DEBIAN_FRONTEND=noninteractive timeout 240 apt-get purge -y "${apt_opts[@]}" mergewatch \
	> "$out/apt-purge.log" 2>&1; rc=$?
res purge_rc "$rc"
res purge_seconds "$(since "$t0")"
check purge test "$rc" = 0
journalctl --sync 2>/dev/null
journalctl -u "$unit" -o short-monotonic --no-pager > "$out/journal-mergewatchd.txt" 2>&1
res package_status_after "$(dpkg-query -W -f='${Status}' mergewatch 2>&1 | head -n 1)"
res load_state_after "$(prop LoadState)"
res active_after "$(systemctl is-active "$unit" 2>&1)"
res unit_files_after "$(systemctl list-unit-files --no-legend "$unit" 2>/dev/null | wc -l)"
res main_pid_alive_after "$( [ -n "$main_pid" ] && [ "$main_pid" != 0 ] && kill -0 "$main_pid" 2>/dev/null && echo yes || echo no)"
res processes_after "$(pgrep -x mergewatchd | tr '\n' ' ')"
say "looking for what the purge left"
bpf_snapshot purged
# Every path the package had, and anything named after it in the places a package or systemd writes.
{
	while read -r f; do
		[ -e "$f" ] || [ -L "$f" ] || continue
		# Directories (and merged-/usr links such as /lib): dpkg removes those it emptied and shares the
		# rest; the package's own (named mergewatch) are found below.
		[ -d "$f" ] && continue
		echo "$f"
	done < "$out/dpkg-files.txt"
	find /etc /lib/systemd /usr/lib/systemd /var/lib/systemd /run/systemd -maxdepth 3 \
		\( -name 'mergewatchd*' -o -name 'mergewatch' -o -name 'mergewatch.*' \) 2>/dev/null
	find /usr/sbin /usr/share /usr/share/doc /usr/share/man/man8 /var/lib/dpkg/info /var/lib /var/log \
		/var/cache -maxdepth 1 \
		\( -name 'mergewatchd*' -o -name 'mergewatch' -o -name 'mergewatch.*' \) 2>/dev/null
} | sort -u > "$out/left-after-purge.txt"
res left_after "$(wc -l < "$out/left-after-purge.txt")"
check nothing_left test ! -s "$out/left-after-purge.txt" -a "$(systemctl is-active "$unit")" != active \
	-a -z "$(pgrep -x mergewatchd)"
