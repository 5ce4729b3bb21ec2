#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Driver of the systemd-mode VM test (tests/vm/run-vm.sh --systemd): runs as root in the
# guest, started by mergewatch-vmtest-driver.service under the host's systemd as PID 1, with
# `make install DESTDIR=` output (daemon, unit, /etc/default/mergewatchd) copied into the root.
#
# It drives mergewatchd.service through enable, start, privileges, I/O, watchdog, kill -9 of
# the main PID, stop and the journal, and writes into $MW_OUT (/vmout, the host's run dir):
#   results.txt              key=value per observation (tests/vm/test_systemd_unit.py asserts them)
#   guest.log                this script's output
#   metrics-*.prom           /metrics scrapes; status-main.txt  /proc/PID/status of the main process
#   diskstat-{at-ready,after-dd}.txt  /sys/block/nvme0n1/stat next to the scrapes of the same name
#   bpftool-{prog,link}-{running-1,running-2,after-stop}.{json,txt}
#   show-*.txt               `systemctl show` / `systemctl status` at each step
#   journal-mergewatchd.json, journal-mergewatchd.txt, journal-boot.txt, unit-as-loaded.txt
#   exit-status              0 when every driver-side check passed, else the number that failed
# Then it powers the VM off. The driver-side checks are a summary: the pytest re-reads the files.
set -u
tag=mw-driver
# shellcheck source=tests/vm/driver-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../driver-lib.sh"
# No retry on purpose: right after `systemctl start` returns, /metrics must already answer.
scrape() { curl -sS --max-time 10 "$url" > "$out/$1" 2>> "$out/guest.log"; }
# attached TP FILE: the value of mergewatch_bpf_program_attached for tracepoint TP in FILE.
attached() { awk -v tp="tracepoint=\"$1\"" 'index($0, "mergewatch_bpf_program_attached{") == 1 && index($0, tp) { print $NF }' "$out/$2"; }
# count of programs whose name is one of mergewatch's block tracepoint handlers
mw_progs() { grep -cE 'name (btf|raw)_(rq_issue|rq_complete)( |$)' "$out/bpftool-$1.txt"; }

say "$(systemctl --version | head -n 1), kernel $(uname -r), virtualization $(systemd-detect-virt)"

# Load the NVMe driver by hand, before the daemon starts: nothing waits for udev's coldplug (udev is on the
# host, and so in this guest, only since setup.sh installs mdadm).
modprobe nvme
for _ in $(seq 1 60); do [ -b /dev/nvme0n1 ] && break; sleep 0.5; done
check nvme_present test -b /dev/nvme0n1

# 0. What `make install` printed: `systemctl enable --now mergewatchd`. Enable first.
timeout 60 systemctl enable "$unit"; rc=$?
res enable_rc "$rc"
res is_enabled "$(systemctl is-enabled "$unit")"
res wants_link "$(readlink /etc/systemd/system/multi-user.target.wants/$unit)"
check enable test "$rc" = 0 -a "$(systemctl is-enabled "$unit")" = enabled
systemctl cat "$unit" > "$out/unit-as-loaded.txt" 2>&1
res fragment_path "$(prop FragmentPath)"
res dropin_paths "$(prop DropInPaths)"

# 1. Type=notify: `systemctl start` returns once READY=1 arrived, i.e. after attach + listen.
say "systemctl start $unit"
t0=$(up)
timeout 120 systemctl start "$unit"; rc=$?
t1=$(up)
active=$(systemctl is-active "$unit")
scrape metrics-at-ready.prom; scrape_rc=$?
cp /sys/block/nvme0n1/stat "$out/diskstat-at-ready.txt"  # the disk's own count, next to each scrape
res start_rc "$rc"
res start_seconds "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
res active_at_ready "$active"
res metrics_at_ready_rc "$scrape_rc"
res attached_at_ready_rq_issue "$(attached block_rq_issue metrics-at-ready.prom)"
res attached_at_ready_rq_complete "$(attached block_rq_complete metrics-at-ready.prom)"
check start test "$rc" = 0 -a "$active" = active
check attached_at_ready test "$(attached block_rq_issue metrics-at-ready.prom)" = 1 \
	-a "$(attached block_rq_complete metrics-at-ready.prom)" = 1
pid1=$(prop MainPID)
res main_pid_1 "$pid1"
systemctl show "$unit" > "$out/show-running-1.txt"
systemctl status --no-pager "$unit" > "$out/status-running-1.txt" 2>&1

# 2. Identity and privileges of the main process.
cp "/proc/$pid1/status" "$out/status-main.txt"
st() { awk -v k="$1:" '$1 == k { $1 = ""; sub(/^ /, ""); print }' "$out/status-main.txt"; }
res main_uid "$(st Uid)"
res main_capeff "$(st CapEff)"
res main_capbnd "$(st CapBnd)"
res main_nonewprivs "$(st NoNewPrivs)"
res main_seccomp "$(st Seccomp)"
res main_user "$(ps -o user= -p "$pid1")"
check unprivileged test "$(st Uid | awk '{ print $1 }')" != 0 -a "$(st CapEff)" = 000000c000000000
bpf_snapshot running-1
res bpftool_running_1_programs "$(mw_progs running-1)"

# 3. Direct reads from the NVMe disk reach the histogram.
dd if=/dev/nvme0n1 of=/dev/null bs=4k count=256 iflag=direct 2>&1
sleep 1
scrape metrics-after-dd.prom
cp /sys/block/nvme0n1/stat "$out/diskstat-after-dd.txt"
check io_scraped test -s "$out/metrics-after-dd.prom"

# 4. WatchdogSec=30s: pings move WatchdogTimestamp, and the service outlives WatchdogSec with the
#    same main process (without pings systemd would abort it 30 s after start).
res watchdog_usec "$(prop WatchdogUSec)"
wd1=$(prop WatchdogTimestampMonotonic)
sleep 3
wd2=$(prop WatchdogTimestampMonotonic)
res watchdog_ts_1 "$wd1"
res watchdog_ts_2 "$wd2"
active_enter=$(prop ActiveEnterTimestampMonotonic)
active_enter_s=$(awk -v u="$active_enter" 'BEGIN { printf "%.3f", u / 1e6 }')
# Wait until the service has been active for WatchdogSec + 5 s (bounded: at most 45 s here).
for _ in $(seq 1 90); do
	awk -v a="$active_enter_s" -v b="$(up)" 'BEGIN { exit !(b - a >= 35) }' && break
	sleep 0.5
done
res active_for_seconds "$(since "$active_enter_s")"
res watchdog_ts_3 "$(prop WatchdogTimestampMonotonic)"
res active_after_watchdog "$(systemctl is-active "$unit")"
res main_pid_after_watchdog "$(prop MainPID)"
res nrestarts_after_watchdog "$(prop NRestarts)"
check watchdog eval '[ "$(prop WatchdogUSec)" = 30s ] && [ "$wd2" -gt "$wd1" ] && [ "$(prop MainPID)" = "$pid1" ] && [ "$(prop NRestarts)" = 0 ]'

# 5. kill -9 of the main PID: Restart=on-failure brings it back after RestartSec=5s.
say "kill -9 $pid1"
tk=$(up)
kill -9 "$pid1"
pid2=0; state=; n=
for _ in $(seq 1 120); do
	state=$(prop ActiveState); pid2=$(prop MainPID); n=$(prop NRestarts)
	[ "$state" = active ] && [ "$n" = 1 ] && [ "$pid2" != 0 ] && [ "$pid2" != "$pid1" ] && break
	sleep 0.5
done
res restart_seconds "$(since "$tk")"
res nrestarts "$n"
res main_pid_2 "$pid2"
res active_after_kill "$state"
scrape metrics-after-restart.prom; rc=$?
res metrics_after_restart_rc "$rc"
res attached_after_restart_rq_issue "$(attached block_rq_issue metrics-after-restart.prom)"
res attached_after_restart_rq_complete "$(attached block_rq_complete metrics-after-restart.prom)"
systemctl show "$unit" > "$out/show-running-2.txt"
systemctl status --no-pager "$unit" > "$out/status-running-2.txt" 2>&1
bpf_snapshot running-2
res bpftool_running_2_programs "$(mw_progs running-2)"
check restart eval '[ "$state" = active ] && [ "$n" = 1 ] && [ "$pid2" != "$pid1" ] && [ "$rc" = 0 ]'

# 6. Stop: SIGTERM, clean exit, programs and links gone. This unit is After=mergewatchd.service,
#    which keeps the stopped unit loaded: a garbage-collected unit shows default properties.
say "systemctl stop $unit"
timeout 60 systemctl stop "$unit"; rc=$?
res stop_rc "$rc"
res active_after_stop "$(systemctl is-active "$unit")"
systemctl show "$unit" > "$out/show-after-stop.txt"
for p in Result ExecMainPID ExecMainCode ExecMainStatus NRestarts; do res "after_stop_$p" "$(prop "$p")"; done
bpf_snapshot after-stop
res bpftool_after_stop_programs "$(mw_progs after-stop)"
check stop eval '[ "$rc" = 0 ] && [ "$(systemctl is-active "$unit")" = inactive ] && [ "$(prop Result)" = success ] &&
	[ "$(prop ExecMainPID)" = "$pid2" ] && [ "$(prop ExecMainCode)" = 1 ] && [ "$(prop ExecMainStatus)" = 0 ] &&
	[ "$(mw_progs after-stop)" = 0 ]'

# 7. Journal: the daemon's <N> prefixes become PRIORITY fields.
journalctl --sync 2>/dev/null
journalctl -u "$unit" -o json --no-pager > "$out/journal-mergewatchd.json" 2>&1
journalctl -u "$unit" -o short-monotonic --no-pager > "$out/journal-mergewatchd.txt" 2>&1
res journal_entries "$(wc -l < "$out/journal-mergewatchd.json")"
check journal test "$(grep '"_COMM":"mergewatchd"' "$out/journal-mergewatchd.json" | grep -c '"PRIORITY":"6"')" -gt 0

# 8. Socket activation with the shipped mergewatchd.socket, then a dm device whose name is
#    not UTF-8: every scrape must stay text Prometheus accepts. Its own function and result keys
#    (sock_*, odd_dm_*), after the journal step, so the steps above see exactly what they saw before.
socket_activation_and_odd_dm_name() {
	local sock=mergewatchd.socket name dm rc t0
	# The flags file as an operator changes it: the later assignment wins.
	echo 'MERGEWATCHD_ARGS=--web.systemd-socket --log.level=debug' >> /etc/default/mergewatchd
	say "systemctl start $sock"
	timeout 60 systemctl start "$sock"; rc=$?
	res sock_start_rc "$rc"
	res sock_listen "$(systemctl show -p Listen --value "$sock")"
	res sock_service_before_first_connection "$(systemctl is-active "$unit")"
	t0=$(up)
	# The first connection starts the service; it waits in the socket's queue meanwhile.
	curl -sS --max-time 60 "$url" > "$out/metrics-socket.prom" 2>> "$out/guest.log"; rc=$?
	res sock_first_scrape_rc "$rc"
	res sock_first_scrape_seconds "$(since "$t0")"
	res sock_service_active "$(systemctl is-active "$unit")"
	res sock_triggered_by "$(prop TriggeredBy)"
	res sock_main_pid "$(prop MainPID)"
	curl -sS -g --max-time 10 "http://[::1]:9863/metrics" > "$out/metrics-socket-ipv6.prom" 2>> "$out/guest.log"
	res sock_ipv6_scrape_rc "$?"
	check socket_activation eval '[ "$(systemctl is-active "$unit")" = active ] &&
		grep -q "^mergewatch_build_info" "$out/metrics-socket.prom" && grep -q "^mergewatch_build_info" "$out/metrics-socket-ipv6.prom"'

	modprobe dm-mod
	name=$(printf 'latin\xff')
	DM_DISABLE_UDEV=1 dmsetup --manglename none create "$name" --table "0 2048 linear /dev/nvme0n1 2048"; rc=$?
	res odd_dm_create_rc "$rc"
	dm=
	for d in /sys/block/dm-*; do [ "$(cat "$d/dm/name" 2>/dev/null)" = "$name" ] && dm=${d##*/}; done
	res odd_dm_device "$dm"
	# SIGHUP rescans sysfs at once (else within --topology.refresh-interval).
	systemctl kill --kill-who=main -s HUP "$unit"
	for _ in $(seq 1 40); do
		curl -sS --max-time 10 "$url" > "$out/metrics-odd-dm.prom" 2>> "$out/guest.log"; rc=$?
		[ -n "$dm" ] && grep -qF "device=\"$dm\"" "$out/metrics-odd-dm.prom" && break
		sleep 0.5
	done
	res odd_dm_scrape_rc "$rc"
	check odd_dm_scrape eval '[ -n "$dm" ] && grep -qF "device=\"$dm\",kind=\"dm\"" "$out/metrics-odd-dm.prom"'
	DM_DISABLE_UDEV=1 dmsetup --manglename none remove "$name"
	res odd_dm_remove_rc "$?"

	# The service alone first: the socket must go on listening for the next start.
	timeout 60 systemctl stop "$unit"; rc=$?
	res sock_socket_after_service_stop "$(systemctl is-active "$sock")"
	timeout 60 systemctl stop "$sock"
	res sock_stop_rc "$((rc + $?))"
	res sock_active_after_stop "$(systemctl is-active "$sock")"
	bpf_snapshot after-socket-stop
	res bpftool_after_socket_stop_programs "$(mw_progs after-socket-stop)"
	journalctl -u "$unit" -o short-monotonic --no-pager > "$out/journal-mergewatchd-socket.txt" 2>&1
}
socket_activation_and_odd_dm_name
