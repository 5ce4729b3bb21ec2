#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Guest side of the VM test: the 2019 "LVM snapshot on NVMe, nomerges=2" incident.
# Run by guest-init.sh inside the VM (never on the host: it pvcreates the NVMe disk with serial mw0001).
#
# Builds: the disk with serial mw0001 (DISK: results.txt names it, disk=nvmeXn1) -> PV -> VG vg0
# -> LV origin (ext4, 4 KiB blocks, one file of MW_FILE_MB MiB per case) -> snapshot LV snap (default 4 KiB chunk),
# snap mounted ro on /mnt/snap, origin mounted ro on /mnt/origin.
# Then, per case: set the disk's nomerges, drop caches, read, and record
#   case-<name>.stat.before/.after  every /sys/block/*/stat (name maj:min fields...)
#   case-<name>.diskstats           per-device read/write deltas
#   case-<name>.topology.txt        dm names, maj:min, slaves/holders, dm tables
#   case-<name>.{before,after,settled}.prom   /metrics scrapes (with a daemon)
#   case-<name>.bt.txt              bpftrace event census (MW_BPFTRACE=1)
#   case-<name>.fio.txt             fio output (random-read cases)
# and a "RESULT ..." line per case and device in results.txt and on the console.
#
# Environment (from /vmout/guest.env, written by run-vm.sh):
#   MW_OUT            output dir (9p share to the host), default /vmout
#   MW_CASES          space-separated name:nomerges:kind:mount[:scheduler], kind seq|rand,
#                     mount snap|origin, scheduler of the disk (default none)
#   MW_FILE_MB        size of each file on vg0 (64)
#   MW_EXTRA_FILE_MB  size of each file on vg1/vg2 (32)
#   MW_READER         seq reader: cat (default, like the incident) or dd (bs=1M)
#   MW_FIO_IO_SIZE    bytes of random 4 KiB reads per rand case (16m)
#   MW_DAEMON         daemon binary (host path); empty = no daemon, diskstats only
#   MW_DAEMON_ARGS    extra daemon arguments (word-split)
#   MW_METRICS_URL    daemon's /metrics URL on the guest loopback
#   MW_DAEMON_READY_TIMEOUT  seconds to wait for the first scrape (60)
#   MW_DETECT_WAIT    seconds to wait after each read before the last scrape (12; 0 without daemon)
#   MW_BPFTRACE       1 = run blk-events.bt around every case
#   MW_RELEASE_TARBALL, MW_RELEASE_ROOT  run-vm.sh --release, --release-root: the release tarball and the
#                     Debian 11 root its rel-* cases run it in (guest-release.sh)
#   MW_IO_TIMEOUT     bound on each case's I/O command, seconds (120)
#   MW_PART_DISK      1 = run-vm.sh --part-disk gave a second NVMe disk (serial mwpart01):
#                     it gets an MBR partition, VG vg2 on it, snapshots snap8 (-c 8k) and
#                     snap16 (-c 16k) of vg2/origin2 on /mnt/snap8, /mnt/snap16
#   MW_MULTIPATH      1 = run-vm.sh --multipath gave a two-controller NVMe subsystem: VG vg1
#                     on its head namespace, snapshot mpsnap (4 KiB chunks) on /mnt/mpsnap
#   With both, the default cases add snap8/snap16 (nomerges 2 and 0), mp-nm2 (nomerges=2 on
#   both path disks) and requeue (scsi_debug reporting host busy every 7th command, so the
#   block layer requeues; direct 16 KiB reads of the scsi_debug disk).
# Case mounts: snap origin (vg0 on the disk), snap8 snap16 (vg2 on the partition),
# mpsnap (vg1 on the multipath head), sdebug (the scsi_debug disk itself, kind direct);
# "a+b" reads the case's file from mount a, then from mount b (same disk).
set -euo pipefail

OUT=${MW_OUT:-/vmout}
HERE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
PART=${MW_PART_DISK:-0}
MULTIPATH=${MW_MULTIPATH:-0}
DEFAULT_CASES="snap-nm2:2:seq:snap snap-nm0:0:seq:snap snap-rand-nm2:2:rand:snap origin-nm2:2:seq:origin"
if [ "$PART" = 1 ] && [ "$MULTIPATH" = 1 ]; then
	# One nomerges=0 case reads both snapshots (one daemon start less: about 30 s under TCG).
	DEFAULT_CASES+=" snap8-nm2:2:seq:snap8 snap16-nm2:2:seq:snap16 snap8-16-nm0:0:seq:snap8+snap16"
	DEFAULT_CASES+=" mp-nm2:2:seq:mpsnap requeue:0:direct:sdebug"
fi
CASES=${MW_CASES:-$DEFAULT_CASES}
FILE_MB=${MW_FILE_MB:-64}
# Files on the extra stacks (part disk, multipath): half the size keeps the VM run short; a
# 32 MiB read still gives thousands of requests in the detector's window.
EXTRA_FILE_MB=${MW_EXTRA_FILE_MB:-32}
READER=${MW_READER:-cat}
FIO_IO_SIZE=${MW_FIO_IO_SIZE:-16m}
DAEMON=${MW_DAEMON:-}
DAEMON_ARGS=${MW_DAEMON_ARGS:-}
METRICS_URL=${MW_METRICS_URL:-}
READY_TIMEOUT=${MW_DAEMON_READY_TIMEOUT:-60}
DETECT_WAIT=${MW_DETECT_WAIT:-12}
BPFTRACE=${MW_BPFTRACE:-0}
IO_TIMEOUT=${MW_IO_TIMEOUT:-120}
DISK=	# the scenario's disk, serial mw0001: found by serial once the NVMe driver is loaded
VG=vg0

[ -n "$DAEMON" ] || DETECT_WAIT=0

now() { cut -d' ' -f1 /proc/uptime; }
log() { printf '[%8s] %s\n' "$(now)" "$*"; }
die() { log "FAIL: $*"; exit 1; }
trap 'rc=$?; log "FAIL: line $LINENO: $BASH_COMMAND (exit $rc)"' ERR

daemon_pid=
bt_pid=
cleanup() {
	[ -n "$bt_pid" ] && kill -INT "$bt_pid" 2>/dev/null || true
	[ -n "$daemon_pid" ] && kill -TERM "$daemon_pid" 2>/dev/null || true
}
trap cleanup EXIT

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.2 s.
wait_for() {
	local limit=$1 what=$2 end
	shift 2
	end=$(( $(date +%s) + limit ))
	until "$@"; do
		[ "$(date +%s)" -lt "$end" ] || { log "timed out after ${limit}s waiting for $what"; return 1; }
		sleep 0.2
	done
}

# ------------------------------------------------------------------ helpers
scrape() {	# scrape FILE
	curl -fsS --max-time 10 -o "$1" "$METRICS_URL"
}

# settle FILE: the case's last scrape, once the detector has raised (a merge_collapse series at 1) or
# DETECT_WAIT seconds after the read, whichever comes first. A case that must not raise waits the whole
# time (a wrong raise ends the wait and shows in FILE); one that raises stops waiting at the raise, the
# only change its scrape can still see (a second raise needs a second upper series, and the tests
# assert the set of series; a clear takes --collapse.clear-after, 30 s).
settle() {
	local end=$(( $(date +%s) + DETECT_WAIT + 1 ))	# + 1: date's whole seconds never shorten the wait
	while :; do
		sleep 1
		scrape "$1"
		grep -q '^mergewatch_merge_collapse{.*} 1$' "$1" && { log "raised: $(grep '^mergewatch_merge_collapse{.*} 1$' "$1")"; return 0; }
		[ "$(date +%s)" -lt "$end" ] || return 0
	done
}

# Shell builtins only in the per-case helpers: every fork costs ~10 ms under TCG.
stat_snapshot() {	# every block device: name maj:min <stat fields> (maj:min - for a hidden disk)
	local d devno st
	for d in /sys/block/*; do
		devno=-
		[ -r "$d/dev" ] && read -r devno < "$d/dev"
		read -r st < "$d/stat"
		printf '%s %s %s\n' "${d##*/}" "$devno" "$st"
	done
}

dm_name() {	# dm name of a /sys/block entry, or -
	local n=-
	[ -r "/sys/block/$1/dm/name" ] && read -r n < "/sys/block/$1/dm/name"
	printf '%s\n' "$n"
}

# diskstats_delta BEFORE AFTER CASE: one line per device whose counters moved.
diskstats_delta() {
	local name devno rest dm
	awk -v c="$3" '
	NR == FNR { for (i = 3; i <= NF; i++) b[$1, i] = $i; next }
	{
		r = $3 - b[$1, 3]; rm = $4 - b[$1, 4]; rs = $5 - b[$1, 5]
		w = $7 - b[$1, 7]; ws = $9 - b[$1, 9]
		if (r == 0 && w == 0) next
		printf "%s %s reads=%d rd_merges=%d rd_sectors=%d avg_rd_sectors=%.1f writes=%d wr_sectors=%d\n",
			$1, $2, r, rm, rs, (r ? rs / r : 0), w, ws
	}' "$1" "$2" |
	while read -r name devno rest; do
		dm=$(dm_name "$name")
		printf 'RESULT case=%s dev=%s devno=%s dm=%s %s\n' "$3" "$name" "$devno" "$dm" "$rest"
	done
}

topology() {
	local d n devno sl ho
	echo "# name maj:min dm-name slaves holders"
	for d in /sys/block/*; do
		n=${d##*/}
		devno=-
		[ -r "$d/dev" ] && read -r devno < "$d/dev"
		sl=$(cd "$d/slaves" && echo *); ho=$(cd "$d/holders" && echo *)
		[ "$sl" = '*' ] && sl=; [ "$ho" = '*' ] && ho=
		printf '%s %s %s slaves=%s holders=%s\n' "$n" "$devno" "$(dm_name "$n")" "${sl// /,}" "${ho// /,}"
	done
	echo "# ls -l /sys/block/*/holders"
	ls -l /sys/block/*/holders
	echo "# dmsetup table"
	dmsetup table
	echo "# queue/$DISK"
	grep . /sys/block/$DISK/queue/{nomerges,scheduler,max_sectors_kb,max_hw_sectors_kb,max_segments,read_ahead_kb}
}

bt_start() {	# bt_start OUTFILE
	log "starting bpftrace"
	bpftrace "$HERE/blk-events.bt" > "$1" 2> "${1%.txt}.err" &
	bt_pid=$!
	wait_for 120 "bpftrace READY" grep -q MW-BT-READY "$1" ||
		{ cat "${1%.txt}.err"; die "bpftrace did not start"; }
	log "bpftrace ready"
}

bt_stop() {	# bt_stop OUTFILE
	kill -INT "$bt_pid"
	wait_for 60 "bpftrace exit" bash -c "! kill -0 $bt_pid 2>/dev/null" || die "bpftrace did not stop"
	wait "$bt_pid" || true
	bt_pid=
	grep -q MW-BT-END "$1" || { cat "${1%.txt}.err"; die "bpftrace output incomplete"; }
}

# One daemon per case, so that a verdict raised in one case (it clears only after
# --collapse.clear-after) cannot leak into the next; its log is the case's daemon log.
daemon_log=$OUT/daemon.log
# A case named nocap-* runs its daemon stripped of CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (setpriv, as a
# security policy would): --source=auto must fall back to diskstats and still page.
daemon_start() {	# daemon_start LOGFILE [CASE]
	daemon_log=$1
	local wrap=() daemon=$DAEMON args=$DAEMON_ARGS
	[[ "${2:-}" == nocap-* ]] && wrap=(setpriv --inh-caps=-bpf,-perfmon,-sys_admin --bounding-set=-bpf,-perfmon,-sys_admin)
	# A rel-* case: the release's daemon inside the Debian 11 root, with default flags (guest-release.sh).
	if [[ "${2:-}" == rel-* ]]; then
		[ -n "$RELEASE_BIN" ] || die "case $2 needs run-vm.sh --release and --release-root"
		wrap=("${RELEASE_RUN[@]}") daemon=$RELEASE_BIN/mergewatchd args=
		[ -x "$RELEASE_ROOT$daemon" ] || die "release daemon $RELEASE_ROOT$daemon is not executable"
	else
		[ -x "$daemon" ] || die "daemon $daemon is not executable in the guest"
	fi
	[ -n "$METRICS_URL" ] || die "MW_METRICS_URL is empty"
	log "starting daemon: ${wrap[*]} $daemon $args"
	# shellcheck disable=SC2086  # MW_DAEMON_ARGS is a word list on purpose
	"${wrap[@]}" "$daemon" $args > "$daemon_log" 2>&1 &
	daemon_pid=$!
	daemon_up() {
		kill -0 "$daemon_pid" 2>/dev/null || { tail -n 40 "$daemon_log"; die "daemon exited during start-up"; }
		grep -q 'msg="ready:' "$daemon_log" && scrape "$OUT/daemon.ready.prom" 2>/dev/null
	}
	wait_for "$READY_TIMEOUT" "daemon /metrics at $METRICS_URL" daemon_up ||
		{ tail -n 40 "$daemon_log"; die "daemon not serving /metrics"; }
	log "daemon serving $METRICS_URL"
}

daemon_stop() {
	local rc=0
	log "stopping daemon (SIGTERM)"
	kill -TERM "$daemon_pid"
	if ! wait_for 20 "daemon exit" bash -c "! kill -0 $daemon_pid 2>/dev/null"; then
		kill -KILL "$daemon_pid" 2>/dev/null || true
		die "daemon ignored SIGTERM for 20 s"
	fi
	wait "$daemon_pid" || rc=$?
	daemon_pid=
	echo "$rc" > "$OUT/daemon.exit"
	[ "$rc" -eq 0 ] || { tail -n 40 "$daemon_log"; die "daemon exit status $rc"; }
}

# Lines saying which attach mode the daemon chose (log or metrics), for the run summary.
attach_mode() {
	{
		grep -i 'attach' "$daemon_log" | sed 's/^/log: /' || true
		grep -hi 'attach' "$OUT"/daemon.ready.prom | grep -v '^#' | sed 's/^/metric: /' || true
	} | sed "s/^/ATTACH kernel=$(uname -r) /" | tee "$OUT/attach-mode.txt"
	[ -s "$OUT/attach-mode.txt" ] || log "WARNING: daemon reported no attach mode (no 'attach' in its log or metrics)"
}

# ------------------------------------------------------------------ start
log "guest $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo); cases: $CASES"
# The lockdown mode the guest booted with (run-vm.sh --append lockdown=...): "[none] integrity confidentiality".
mountpoint -q /sys/kernel/security || mount -t securityfs securityfs /sys/kernel/security 2>/dev/null || true
cat /sys/kernel/security/lockdown > "$OUT/lockdown.txt" 2>/dev/null || echo "no lockdown LSM" > "$OUT/lockdown.txt"
: > "$OUT/results.txt"

# Loopback: the daemon listens on 127.0.0.1 and we scrape it there.
ip link set lo up
mkdir -p /tmp/lo-check && echo loopback-ok > /tmp/lo-check/probe
busybox httpd -f -p 127.0.0.1:18099 -h /tmp/lo-check &
lo_pid=$!
wait_for 10 "loopback http" curl -fsS --max-time 2 -o /tmp/lo-check/got http://127.0.0.1:18099/probe ||
	die "loopback HTTP check failed"
kill "$lo_pid"; wait "$lo_pid" 2>/dev/null || true
grep -q loopback-ok /tmp/lo-check/got || die "loopback HTTP returned the wrong body"
log "loopback ok (curl -> busybox httpd on 127.0.0.1)"

. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/guest-lib.sh"	# disk_by_serial
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/guest-release.sh"	# rel-* cases
[ -z "$RELEASE_TARBALL" ] || release_prepare

modprobe -a nvme dm-mod dm-snapshot ext4
wait_for 30 "the NVMe disk with serial mw0001" disk_by_serial mw0001 > /dev/null || die "no NVMe disk with serial mw0001"
DISK=$(disk_by_serial mw0001)
wait_for 30 "/dev/$DISK" test -b /dev/$DISK || die "no /dev/$DISK"
log "modules loaded: $(lsmod | awk 'NR > 1 && $1 ~ /^(nvme|dm_mod|dm_snapshot|ext4)$/ { printf "%s ", $1 }')"

# ------------------------------------------------------------------ LVM + ext4
# No udev in the guest: lvm creates /dev nodes itself; no dmeventd.
export DM_DISABLE_UDEV=1 LVM_SUPPRESS_FD_WARNINGS=1
LVM_CONFIG='activation { monitoring = 0 udev_sync = 0 udev_rules = 0 } devices { obtain_device_list_from_udev = 0 use_devicesfile = 0 }'
lvm_() { lvm "$1" --config "$LVM_CONFIG" "${@:2}"; }

ncases=0
for c in $CASES; do
	IFS=: read -r _ _ _ m _ <<< "$c"
	case "$m" in snap|origin) ncases=$((ncases + 1)) ;; esac
done
origin_mb=$(( ncases * FILE_MB + 128 ))

lvm_ pvcreate -q -y -ff /dev/$DISK
lvm_ vgcreate -q $VG /dev/$DISK
lvm_ lvcreate -q -y -L "${origin_mb}M" -n origin $VG
mkfs.ext4 -q -F -b 4096 -E lazy_itable_init=0,lazy_journal_init=0 /dev/$VG/origin
mkdir -p /mnt/origin /mnt/snap
mount /dev/$VG/origin /mnt/origin
for c in $CASES; do
	IFS=: read -r _ _ _ m _ <<< "$c"
	case "$m" in snap|origin) ;; *) continue ;; esac
	dd if=/dev/zero of="/mnt/origin/${c%%:*}.dat" bs=1M count="$FILE_MB" conv=fsync status=none
done
umount /mnt/origin
log "origin LV ${origin_mb} MiB, ext4 4 KiB blocks, $ncases x ${FILE_MB} MiB files written"

lvm_ lvcreate -q -y -s -n snap -l 100%ORIGIN $VG/origin     # default chunk size
chunk=$(dmsetup table $VG-snap | awk '$3 == "snapshot" { print $NF }')
[ "$chunk" = 8 ] || die "snapshot chunk is '$chunk' sectors, expected the 4 KiB default (8)"
mount -o ro /dev/$VG/snap /mnt/snap
mount -o ro /dev/$VG/origin /mnt/origin
log "snapshot $VG/snap (chunk $chunk sectors) on /mnt/snap, origin on /mnt/origin, both ro"

# ------------------------------------------------------------------ more stacks

# vg_with_snapshots VG PV MOUNTS: an origin LV with one file per case reading from any of
# MOUNTS (a snapshot per mount "snapN" with N KiB chunks, "mpsnap" with the default 4 KiB).
vg_with_snapshots() {
	local vg=$1 pv=$2 mounts=$3 c m n=0 chunk
	for c in $CASES; do
		IFS=: read -r _ _ _ m _ <<< "$c"
		case " $mounts " in *" ${m%%+*} "*) n=$((n + 1)) ;; esac
	done
	lvm_ pvcreate -q -y -ff "$pv"
	lvm_ vgcreate -q "$vg" "$pv"
	lvm_ lvcreate -q -y -L "$(( n * EXTRA_FILE_MB + 64 ))M" -n origin "$vg"
	mkfs.ext4 -q -F -b 4096 -E lazy_itable_init=0,lazy_journal_init=0 "/dev/$vg/origin"
	mkdir -p "/mnt/$vg-origin"
	mount "/dev/$vg/origin" "/mnt/$vg-origin"
	for c in $CASES; do
		IFS=: read -r _ _ _ m _ <<< "$c"
		case " $mounts " in *" ${m%%+*} "*) ;; *) continue ;; esac
		dd if=/dev/zero of="/mnt/$vg-origin/${c%%:*}.dat" bs=1M count="$EXTRA_FILE_MB" conv=fsync status=none
	done
	umount "/mnt/$vg-origin"
	for m in $mounts; do
		chunk=4
		case "$m" in snap[0-9]*) chunk=${m#snap} ;; esac
		# Each snapshot gets a third of the origin's size: read-only, it never fills.
		lvm_ lvcreate -q -y -s -n "$m" -c "${chunk}k" -l 30%ORIGIN "$vg/origin"
		[ "$(dmsetup table "$vg-$m" | awk '$3 == "snapshot" { print $NF }')" = $((chunk * 2)) ] ||
			die "snapshot $vg/$m chunk is not ${chunk} KiB"
		mkdir -p "/mnt/$m"
		mount -o ro "/dev/$vg/$m" "/mnt/$m"
	done
	log "$vg on $pv: origin with $n x ${EXTRA_FILE_MB} MiB files, snapshots $mounts"
}

PART_DISK= MP_HEAD= MP_PATHS= SD_DISK=
if [ "$PART" = 1 ]; then
	PART_DISK=$(disk_by_serial mwpart01) || die "no NVMe disk with serial mwpart01 (run-vm.sh --part-disk)"
	# One MBR partition from sector 2048 to the end (no sfdisk in the host's userland): the
	# 16-byte entry at 446 (status, CHS, type 0x83, CHS, LBA start, sectors), then 0x55AA.
	le32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)); }
	sectors=$(cat /sys/block/$PART_DISK/size)
	# shellcheck disable=SC2059  # the format is the escaped bytes
	printf "\\x00\\xfe\\xff\\xff\\x83\\xfe\\xff\\xff$(le32 2048)$(le32 $((sectors - 2048)))" |
		dd of=/dev/$PART_DISK bs=1 seek=446 conv=notrunc status=none
	printf '\x55\xaa' | dd of=/dev/$PART_DISK bs=1 seek=510 conv=notrunc status=none
	blockdev --rereadpt /dev/$PART_DISK
	wait_for 10 "/dev/${PART_DISK}p1" test -b /dev/${PART_DISK}p1 || die "partition ${PART_DISK}p1 did not appear"
	vg_with_snapshots vg2 /dev/${PART_DISK}p1 "snap8 snap16"
fi
if [ "$MULTIPATH" = 1 ]; then
	[ "$(cat /sys/module/nvme_core/parameters/multipath)" = Y ] || die "nvme_core.multipath is off"
	MP_HEAD=$(disk_by_serial mwmp01) || die "no multipath head with serial mwmp01 (run-vm.sh --multipath)"
	# Path disks nvme<S>c<C>n<N> of head nvme<S>n<N>: hidden, no dev file.
	for d in /sys/block/nvme*c*n*; do
		n=${d##*/}
		[ "${n%%c*}n${n##*n}" = "$MP_HEAD" ] && MP_PATHS+="$n "
	done
	MP_PATHS=${MP_PATHS% }
	[ "$(wc -w <<< "$MP_PATHS")" = 2 ] || die "head $MP_HEAD has paths '$MP_PATHS', expected two"
	vg_with_snapshots vg1 /dev/$MP_HEAD mpsnap
	echo "$MP_HEAD $MP_PATHS" > "$OUT/multipath.txt"
fi
if [[ " $CASES " == *:sdebug* ]]; then
	modprobe -a sd_mod	# no udev in the guest: nothing loads the disk driver on its own
	modprobe scsi_debug dev_size_mb=64 delay=0
	wait_for 30 "scsi_debug disk" bash -c 'ls /sys/bus/pseudo/drivers/scsi_debug/adapter*/host*/target*/*/block/ 2>/dev/null | grep -q .' ||
		die "scsi_debug made no disk"
	SD_DISK=$(ls /sys/bus/pseudo/drivers/scsi_debug/adapter*/host*/target*/*/block/ | head -1)
	echo "$SD_DISK" > "$OUT/scsi_debug.txt"
	log "scsi_debug disk $SD_DISK"
fi
printf 'disk=%s part_disk=%s mp_head=%s mp_paths=%s sd_disk=%s\n' "$DISK" "$PART_DISK" "$MP_HEAD" \
	"${MP_PATHS// /,}" "$SD_DISK" > "$OUT/disks.txt"
# The same names in results.txt, one key a line (vmtest.disks() reads them: the tests never assume a name).
tr ' ' '\n' < "$OUT/disks.txt" >> "$OUT/results.txt"

# The queues whose nomerges/scheduler a case sets: where its requests are made.
queues_of() {
	case "${1%%+*}" in
	snap|origin) echo "$DISK" ;;
	snap8|snap16) echo "$PART_DISK" ;;
	mpsnap) echo "$MP_PATHS" ;;
	sdebug) echo "$SD_DISK" ;;
	*) die "unknown case mount $1" ;;
	esac
}

topology > "$OUT/topology.txt"


# ------------------------------------------------------------------ cases
run_case() {	# run_case NAME NOMERGES KIND MOUNT SCHEDULER
	local name=$1 nm=$2 kind=$3 where=$4 sched=${5:-none} p="$OUT/case-$1" file files=() m t0 t1 q tracing
	for m in ${where//+/ }; do files+=("/mnt/$m/$name.dat"); done
	[ "$where" = sdebug ] && files=("/dev/$SD_DISK")
	for file in "${files[@]}"; do [ -e "$file" ] || die "case $name: no file $file"; done
	file=${files[0]}
	log "case $name: nomerges=$nm scheduler=$sched $kind read of ${files[*]} on $(queues_of "$where")"

	for q in $(queues_of "$where"); do
		echo "$nm" > /sys/block/$q/queue/nomerges
		[ "$(cat /sys/block/$q/queue/nomerges)" = "$nm" ] || die "nomerges did not stick on $q"
		echo "$sched" > /sys/block/$q/queue/scheduler
		grep -q "\[$sched\]" /sys/block/$q/queue/scheduler || die "scheduler $sched did not stick on $q"
	done
	topology > "$p.topology.txt"

	# The daemon starts before the caches are dropped: drop_caches keeps the pages a running process maps,
	# so its binary and libraries stay cached from one case's daemon to the next. Dropped first, each start
	# read them again over 9p: 55-70 s of every case on 5.10 under a load average of 9.
	if [ -n "$DAEMON" ]; then
		daemon_start "$p.daemon.log" "$name"
		[ -s "$OUT/attach-mode.txt" ] || attach_mode
	fi
	sync
	echo 3 > /proc/sys/vm/drop_caches
	[ -z "$DAEMON" ] || scrape "$p.before.prom"
	[ "$BPFTRACE" = 1 ] && bt_start "$p.bt.txt"
	stat_snapshot > "$p.stat.before"
	t0=$(now)
	case "$kind" in
	seq)
		for file in "${files[@]}"; do
			if [ "$READER" = dd ]; then
				timeout "$IO_TIMEOUT" dd if="$file" of=/dev/null bs=1M status=none
			else
				timeout "$IO_TIMEOUT" cat "$file" > /dev/null
			fi
		done ;;
	direct)
		# The block layer requeues every command scsi_debug answers "host busy" (every 7th):
		# block_rq_requeue, then the same request is issued again. Counted by tracefs.
		tracing=/sys/kernel/tracing
		[ -d $tracing/events ] || tracing=/sys/kernel/debug/tracing
		echo > $tracing/trace
		echo 1 > $tracing/events/block/block_rq_requeue/enable
		echo 0x8000 > /sys/bus/pseudo/drivers/scsi_debug/opts   # SDEBUG_OPT_HOST_BUSY
		echo 7 > /sys/bus/pseudo/drivers/scsi_debug/every_nth
		timeout "$IO_TIMEOUT" dd if="$file" of=/dev/null bs=16k count=512 iflag=direct status=none
		echo 0 > /sys/bus/pseudo/drivers/scsi_debug/every_nth
		echo 0 > /sys/bus/pseudo/drivers/scsi_debug/opts
		echo 0 > $tracing/events/block/block_rq_requeue/enable
		grep 'block_rq_requeue:' $tracing/trace > "$p.requeue-trace" || true
		grep -c . "$p.requeue-trace" > "$p.requeues" || true
		echo > $tracing/trace ;;
	rand)
		timeout "$IO_TIMEOUT" fio --name="$name" --filename="$file" --readonly --thread \
			--direct=1 --rw=randread --bs=4k --ioengine=libaio --iodepth=32 \
			--size="${FILE_MB}m" --io_size="$FIO_IO_SIZE" --randseed=4242 \
			--output="$p.fio.txt" ;;
	*) die "case $name: unknown kind $kind" ;;
	esac
	t1=$(now)
	stat_snapshot > "$p.stat.after"
	[ "$BPFTRACE" = 1 ] && bt_stop "$p.bt.txt"
	[ -n "$DAEMON" ] && scrape "$p.after.prom"
	# A direct case only compares counts: nothing for the detector to wait for.
	if [ "$DETECT_WAIT" != 0 ] && [ "$kind" != direct ]; then
		settle "$p.settled.prom"
	fi
	[[ "$name" != rel-* ]] || release_status "$p"
	diskstats_delta "$p.stat.before" "$p.stat.after" "$name" > "$p.diskstats"
	awk -v t="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" \
		'{ print $0 " io_seconds=" t }' "$p.diskstats" | tee -a "$OUT/results.txt"
	if [ -n "$DAEMON" ]; then
		kill -0 "$daemon_pid" 2>/dev/null || die "daemon died during case $name"
		daemon_stop
	fi
	return 0
}

for c in $CASES; do
	IFS=: read -r cname cnm ckind cwhere csched <<< "$c"
	run_case "$cname" "$cnm" "$ckind" "$cwhere" "$csched"
done

[ -z "$RELEASE_TARBALL" ] || release_tls
for m in snap8 snap16 mpsnap; do mountpoint -q /mnt/$m && umount /mnt/$m; done
echo 0 > /sys/block/$DISK/queue/nomerges
umount /mnt/snap /mnt/origin
export MW_DISK=$DISK	# guest-stacking.sh and guest-loader.sh use the scenario's disk
[ -z "$DAEMON" ] || [ "${MW_STACKING:-1}" = 0 ] || "$HERE/guest-stacking.sh" || log "stacking checks failed: see stacking/results.txt"
# The queue findings need the rotational disks (run-vm.sh --rotational-disks 2: the 6.1 boot only).
[ -z "$DAEMON" ] || [ "${MW_STACKING:-1}" = 0 ] || [ "${MW_ROTATIONAL_DISKS:-0}" -lt 2 ] || "$HERE/guest-findings.sh" || log "queue findings checks failed: see findings/results.txt"
# run-vm.sh --who PARTS: the "who" parts on the two extra NVMe disks (guest-who.sh, test_vm_who.py).
[ -z "$DAEMON" ] || [ -z "${MW_WHO_PARTS:-}" ] || "$HERE/guest-who.sh" || log "who checks failed: see who/results.txt"
# run-vm.sh --loader-cases: the loader cases in the same boot (one boot per kernel).
[ -z "$DAEMON" ] || [ "${MW_LOADER_CASES:-0}" != 1 ] || "$HERE/guest-loader.sh" ||
	log "loader cases failed: see loader-results.txt"
log "scenario done"
