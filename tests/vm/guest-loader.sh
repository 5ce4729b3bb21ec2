#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Guest script (run-vm.sh --script): the loader cases on whatever kernel the guest booted.
# Each case starts mergewatchd (MW_DAEMON) with its own flags, waits for READY or its exit,
# reads 256 x 4 KiB with O_DIRECT from the NVMe disk with serial mw0001 (MW_DISK from guest-scenario.sh,
# else found by serial) and compares the daemon's request count with its /sys/block/X/stat. Results: $MW_OUT/loader-results.txt (key=value lines, read by
# tests/vm/test_vm_kernels.py) and loader-<case>.{log,before.prom,after.prom,xlated}.
#   auto      default flags: the program type and variants the loader picks
#   raw_tp    --bpf.program-type=raw_tp: the raw_tp set with its per-layout variants
#   hidden    /sys/kernel/btf/vmlinux hidden by a bind mount, default --path.btf: must exit 3
#   pathbtf   hidden too, --path.btf naming a copy of the kernel's BTF in which
#             BPF_FUNC_get_current_task_btf is renamed (tests/btf_hide_name.py): loading and
#             counting from the file, and the helper fallback taken because the file says so
set -u
OUT=${MW_OUT:-/vmout}
DAEMON=${MW_DAEMON:?MW_DAEMON}
here=$(cd "$(dirname "$0")" && pwd)
PORT=9863
URL=http://127.0.0.1:$PORT/metrics
R=$OUT/loader-results.txt
: > "$R"
now() { cut -d' ' -f1 /proc/uptime; }
log() { printf '[%8s] %s\n' "$(now)" "$*"; }
put() { echo "$1=$2" >> "$R"; log "$1=$2"; }

ip link set lo up
mountpoint -q /sys/kernel/security || mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
daemon_pid=
trap '[ -z "$daemon_pid" ] || kill -TERM "$daemon_pid" 2>/dev/null' EXIT

put kernel "$(uname -r)"
put lockdown "$(cat /sys/kernel/security/lockdown 2>/dev/null || echo absent)"
put btf_vmlinux "$([ -s /sys/kernel/btf/vmlinux ] && echo present || echo absent)"
modprobe nvme
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/guest-lib.sh"	# disk_by_serial
DISK=${MW_DISK:-}
for _ in $(seq 150); do [ -n "$DISK" ] || DISK=$(disk_by_serial mw0001) || true; [ -n "$DISK" ] && [ -b "/dev/$DISK" ] && break; sleep 0.2; done
[ -n "$DISK" ] && [ -b "/dev/$DISK" ] || { log "FAIL: no NVMe disk with serial mw0001"; exit 1; }
put disk "$DISK"

reads() { awk '{ print $1 }' "/sys/block/$DISK/stat"; }
metric_reads() {  # the daemon's completed read requests of the disk in a scrape
	awk -v dev="device=\"$DISK\"" '/^mergewatch_request_size_bytes_count\{/ && index($0, dev) && /op="read"/ { s += $NF } END { printf "%d\n", s }' "$1"
}

metric_timed() {  # the disk's read latency samples a clock timed in a scrape (bpf/request_clock.bpf.h)
	awk -v dev="device=\"$DISK\"" -v clock="clock=\"$2\"" '/^mergewatch_request_latency_timed_total\{/ && index($0, dev) && index($0, clock) && /op="read"/ { s += $NF } END { printf "%d\n", s }' "$1"
}

# run_case NAME EXPECT(ready|exit) ARGS...
run_case() {
	local name=$1 expect=$2 pid rc=running i
	shift 2
	log "case $name: $DAEMON --web.listen-address=127.0.0.1:$PORT $*"
	"$DAEMON" --web.listen-address=127.0.0.1:$PORT "$@" > "$OUT/loader-$name.log" 2>&1 &
	pid=$!
	daemon_pid=$pid
	for i in $(seq 900); do  # 180 s: a load under TCG takes 10-60 s
		grep -q 'msg="ready:' "$OUT/loader-$name.log" && break
		kill -0 "$pid" 2>/dev/null || { wait "$pid"; rc=$?; daemon_pid=; break; }
		sleep 0.2
	done
	put "$name.exit" "$rc"
	put "$name.mode" "$(sed -n 's/.*attached [0-9]* BPF programs using \([a-z_]*\).*/\1/p' "$OUT/loader-$name.log" | head -1)"
	if [ "$rc" != running ]; then
		put "$name.error" "$(grep -m1 'level=error' "$OUT/loader-$name.log" | sed 's/^.*msg="//' | cut -c1-300)"
		return
	fi
	# The programs it holds, by id from its fdinfo (one bpftool process, batch mode: each bpftool start
	# costs 10-30 s under TCG, one per program made these listings 300 s of a boot), and which task
	# helper calls the translated code of the two programs that read the plug (btf_rq_insert, btf_getrq*),
	# for the auto case only (the raw_tp flavor always calls bpf_get_current_task; dumping all nine took
	# 70 s on 5.10).
	local ids i
	ids=$(grep -h '^prog_id:' /proc/$pid/fdinfo/* 2>/dev/null | awk '{ print $2 }' | sort -un)
	for i in $ids; do echo "prog show id $i"; done > /tmp/loader-$name.batch
	bpftool batch file /tmp/loader-$name.batch > "$OUT/loader-$name.programs" 2>&1 || log "bpftool batch failed"
	put "$name.programs" "$(sed -n 's/^[0-9][0-9]*: [a-z_]*  name \([^ ]*\) .*/\1/p' "$OUT/loader-$name.programs" | paste -sd,)"
	: > "$OUT/loader-$name.xlated"
	if [ "$name" = auto ]; then
		sed -n 's/^\([0-9][0-9]*\): [a-z_]*  name [a-z]*_\(rq_insert\|getrq\)[a-z_]* .*/prog dump xlated id \1/p' \
			"$OUT/loader-$name.programs" > /tmp/loader-$name.xbatch
		put "$name.xlated_programs" "$(grep -c . /tmp/loader-$name.xbatch)"
		bpftool batch file /tmp/loader-$name.xbatch > "$OUT/loader-$name.xlated" 2>&1 || log "bpftool batch failed"
	fi
	put "$name.calls_task_btf" "$(grep -c 'call bpf_get_current_task_btf' "$OUT/loader-$name.xlated")"
	put "$name.calls_task" "$(grep -c 'call bpf_get_current_task#' "$OUT/loader-$name.xlated")"
	local s0 s1 m0 m1 scheduler
	# The reads under none, whatever the disk runs: a queue without a scheduler is timed by the request
	# clock (bpf/request_clock.bpf.h), which test_vm_kernels.py checks per kernel.
	scheduler=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "/sys/block/$DISK/queue/scheduler")
	echo none > "/sys/block/$DISK/queue/scheduler"
	curl -fsS --max-time 20 -o "$OUT/loader-$name.before.prom" "$URL" || log "scrape failed"
	s0=$(reads)
	dd if="/dev/$DISK" of=/dev/null bs=4k count=256 skip=$((RANDOM % 1000 * 256)) iflag=direct 2> /dev/null
	s1=$(reads)
	echo "$scheduler" > "/sys/block/$DISK/queue/scheduler"
	sleep 1
	curl -fsS --max-time 20 -o "$OUT/loader-$name.after.prom" "$URL" || log "scrape failed"
	m0=$(metric_reads "$OUT/loader-$name.before.prom"); m1=$(metric_reads "$OUT/loader-$name.after.prom")
	put "$name.stat_reads" $((s1 - s0))
	put "$name.metric_reads" $((${m1:-0} - ${m0:-0}))
	local clock
	for clock in kernel_stamp dispatch_clock inflight_table; do
		m0=$(metric_timed "$OUT/loader-$name.before.prom" $clock); m1=$(metric_timed "$OUT/loader-$name.after.prom" $clock)
		put "$name.timed_$clock" $((${m1:-0} - ${m0:-0}))
	done
	put "$name.scheduler" "$scheduler"
	put "$name.request_clock_log" "$(grep -c 'kernel BTF has no QUEUE_FLAG_STATS' "$OUT/loader-$name.log")"
	kill -TERM "$pid"; wait "$pid"
	put "$name.stop_exit" $?
	daemon_pid=
}

# --source=bpf in every case: the loader's own verdict (the default, auto, would run on diskstats instead of
# exiting: auto's fallback to diskstats, which guest-scenario.sh's nocap-* cases and test_vm_diskstats.py cover).
run_case auto ready --source=bpf
run_case raw_tp ready --source=bpf --bpf.program-type=raw_tp
if [ -s /sys/kernel/btf/vmlinux ]; then
	cp /sys/kernel/btf/vmlinux /tmp/vmlinux.btf
	# 5.10 has no such name to hide: the copy is then the kernel's BTF unchanged.
	/usr/bin/python3 "$here/../btf_hide_name.py" /tmp/vmlinux.btf /tmp/vmlinux-notaskbtf.btf \
		BPF_FUNC_get_current_task_btf 2>/dev/null || cp /tmp/vmlinux.btf /tmp/vmlinux-notaskbtf.btf
	: > /tmp/empty
	mount --bind /tmp/empty /sys/kernel/btf/vmlinux
	put hidden_size "$(stat -c %s /sys/kernel/btf/vmlinux)"
	run_case hidden exit --source=bpf
	run_case pathbtf ready --source=bpf --path.btf=/tmp/vmlinux-notaskbtf.btf
	# Where else libbpf would look for the kernel's BTF (libbpf_find_kernel_btf): none of them here.
	put pathbtf.other_btf_files "$(ls /boot/vmlinux-"$(uname -r)" /lib/modules/"$(uname -r)"/vmlinux* \
		/lib/modules/"$(uname -r)"/build/vmlinux /usr/lib/debug/boot/vmlinux-"$(uname -r)"* 2>/dev/null | wc -l)"
	put pathbtf.read_from_file "$(grep -c 'no bpf_get_current_task_btf' "$OUT/loader-pathbtf.log")"
	umount /sys/kernel/btf/vmlinux
fi
log "loader cases done"
