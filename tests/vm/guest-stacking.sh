#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Guest side, second part of the scenario boot (called at the end of guest-scenario.sh, same VM):
# stacking decided at run time, on the real 6.1 kernel.
#   1. block_bio_queue is attached only while a dm/md device is stacked on a disk, re-decided at
#      each rescan: two daemons start with no dm device active, an LV is created after they
#      started (attached 0 -> 1), read through, and removed (-> 0).
#   2. --collapse.require-upper=any with md: a RAID0 (4 KiB chunks) on the disk splits each
#      readahead bio into 4 KiB pieces (the 2019 pattern, md instead of dm-snapshot); with nomerges=2 the
#      daemon with require-upper=any raises collapse{upper=md0}, the one with the default (dm)
#      does not.
#   3. Several disks under one upper device (run-vm.sh --nvme-disks 2, serials mwnvme1/2): an LVM
#      snapshot (4 KiB chunks) over md RAID0 (4 KiB chunks) over both disks, then over a striped
#      LV (64 KiB stripes) over both. Batched direct 64 KiB reads of the snapshot, cut into 4 KiB
#      pieces by its chunks and spread over both disks, so each task's plug holds requests of two
#      queues (A0 B0 A1 ...). nomerges=0: quiet; nomerges=2: collapse{device=each disk,
#      upper=the snapshot}; counts of bounded reads against /sys/block/X/stat at both.
#   4. With run-vm.sh --multipath --path-removal: guest-multipath.sh (a path controller removed while its head lives).
# Destroys vg0 and the PV on the scenario's disk (MW_DISK; the scenario is done with them).
# Output in $MW_OUT/stacking/: results.txt (key=value), *.prom scrapes, daemon-{dm,any}.log.
set -euo pipefail

DAEMON=${MW_DAEMON:-}
[ -n "$DAEMON" ] || exit 0   # diskstats-only runs have no daemon to check
OUT=${MW_OUT:-/vmout}/stacking
DISK=${MW_DISK:?MW_DISK: guest-scenario.sh names its disk (serial mw0001)}
VG=vg0
mkdir -p "$OUT"
: > "$OUT/results.txt"

now() { cut -d' ' -f1 /proc/uptime; }
log() { printf '[%8s] stacking: %s\n' "$(now)" "$*"; }
res() { printf '%s=%s\n' "$1" "$2" >> "$OUT/results.txt"; }
die() { log "FAIL: $*"; res failed "$*"; exit 1; }
trap 'rc=$?; log "FAIL: line $LINENO: $BASH_COMMAND (exit $rc)"' ERR

export DM_DISABLE_UDEV=1 LVM_SUPPRESS_FD_WARNINGS=1 MDADM_NO_UDEV=1
LVM_CONFIG='activation { monitoring = 0 udev_sync = 0 udev_rules = 0 } devices { obtain_device_list_from_udev = 0 use_devicesfile = 0 }'
lvm_() { lvm "$1" --config "$LVM_CONFIG" "${@:2}"; }

pids=()
reader=
cleanup() {
	[ -n "$reader" ] && kill "$reader" 2>/dev/null || true
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

url() { echo "http://127.0.0.1:$1/metrics"; }
# The value of one series in a scrape, or "absent".
series() {	# series PORT 'name{labels}'
	curl -fsS --max-time 10 "$(url "$1")" | awk -v s="$2" '$1 == s { print $2; found = 1 } END { if (!found) print "absent" }'
}
# wait_series PORT SERIES VALUE SECONDS: poll until the series has VALUE; prints the seconds it took.
wait_series() {
	local t0 v
	t0=$(now)
	while :; do
		v=$(series "$1" "$2")
		[ "$v" = "$3" ] && { awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f\n", b - a }'; return 0; }
		awk -v a="$t0" -v b="$(now)" -v l="$4" 'BEGIN { exit !(b - a > l) }' && { echo "timeout($v)"; return 1; }
		sleep 0.5
	done
}
BIOQ='mergewatch_bpf_program_attached{tracepoint="block_bio_queue",mode="tp_btf"}'

start_daemon() {	# start_daemon NAME PORT ARGS...
	local name=$1 port=$2
	shift 2
	"$DAEMON" --web.listen-address=127.0.0.1:"$port" --topology.refresh-interval=1s "$@" \
		> "$OUT/daemon-$name.log" 2>&1 &
	pids+=($!)
}

# ---------------------------------------------------------------- 3 (run after 2, defined here)
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/guest-lib.sh"	# disk_by_serial
dm_of() {	# the kernel name (dm-N) of a dm device by its dm name
	local d
	for d in /sys/block/dm-*; do [ "$(cat "$d/dm/name")" = "$1" ] && { echo "${d##*/}"; return 0; }; done
	return 1
}
# Batched direct reads of the snapshot: 64 KiB bios (16 x its 4 KiB chunks), eight per io_submit, so
# each submission's plug holds the pieces of eight bios, over both disks. --thread: one process.
# Started as `fio "${READ_SNAP[@]}" ... &`, so that $! is fio itself and killing it ends the reads.
READ_SNAP=(--name=multi --readonly --thread --direct=1 --rw=read --bs=64k --ioengine=libaio
	--iodepth=8 --iodepth_batch_submit=8 --iodepth_batch_complete_min=8 --output=/dev/null)
# One stack: nomerges=0 quiet while reading, a bounded read counted, then nomerges=2 raised on both
# disks' (disk, snapshot) pairs, a bounded read counted. Files $OUT/multi-STACK-*.
multi_stack_cases() {	# multi_stack_cases STACK SNAPDEV
	local st=$1 dev=$2 snap q nm i t p
	snap=$(dm_of "${dev#/dev/mapper/}") || die "$st: no dm device for $dev"
	res "${st}_upper" "$snap"
	p="$OUT/multi-$st"
	for nm in 0 2; do
		for q in $MD1 $MD2; do
			echo none > /sys/block/$q/queue/scheduler
			echo $nm > /sys/block/$q/queue/nomerges
		done
		sleep 4	# a window with no reads: set-up I/O (lvcreate, mdadm) leaves it, a raise from before clears
		log "$st: nomerges=$nm on $MD1 $MD2, batched direct reads of $dev ($snap)"
		fio "${READ_SNAP[@]}" --filename="$dev" --time_based --runtime=60 --size=32m &
		reader=$!
		if [ $nm = 2 ]; then
			for q in $MD1 $MD2; do
				t=$(wait_series 19873 "mergewatch_merge_collapse{device=\"$q\",upper=\"$snap\"}" 1 40) ||
					{ curl -fsS "$(url 19873)" | grep collapse > "$p-nm2-timeout.prom" || true
					  die "$st: no collapse on ($q, $snap) ($t)"; }
				res "${st}_nm2_raised_${q}_seconds" "$t"
			done
			curl -fsS --max-time 10 -o "$p-nm2.prom" "$(url 19873)"
			curl -fsS --max-time 10 -o "$p-nm2-status.json" "http://127.0.0.1:19873/status"
		else
			# Quiet: every scrape over a window plus raise-after (and more: a scrape takes seconds under TCG
			# while fio runs) while the reads run.
			for i in $(seq 1 4); do
				sleep 1
				curl -fsS --max-time 10 -o "$p-nm0-poll-$i.prom" "$(url 19873)"
			done
		fi
		kill "$reader"; wait "$reader" 2>/dev/null || true
		reader=
		sleep 1.5
		# A bounded read, counted: 4 MiB = 64 bios at the snapshot.
		curl -fsS --max-time 10 -o "$p-nm$nm-before.prom" "$(url 19873)"
		for q in $MD1 $MD2; do cat /sys/block/$q/stat > "$p-nm$nm-$q-stat-before.txt"; done
		fio "${READ_SNAP[@]}" --filename="$dev" --size=4m
		for q in $MD1 $MD2; do cat /sys/block/$q/stat > "$p-nm$nm-$q-stat-after.txt"; done
		sleep 1.5
		curl -fsS --max-time 10 -o "$p-nm$nm-after.prom" "$(url 19873)"
	done
	for q in $MD1 $MD2; do echo 0 > /sys/block/$q/queue/nomerges; done
}
multi_disk_stacks() {
	modprobe -a dm-snapshot dm-mod raid0
	MD1=$(disk_by_serial mwnvme1) && MD2=$(disk_by_serial mwnvme2) ||
		die "no NVMe disks with serials mwnvme1/mwnvme2 (run-vm.sh --nvme-disks 2)"
	res multi_disks "$MD1,$MD2"
	res multi_devnos "$(cat /sys/block/$MD1/dev),$(cat /sys/block/$MD2/dev)"
	start_daemon multi 19873 "${POLICY[@]}"
	wait_series 19873 "$BIOQ" 0 60 > /dev/null || die "multi daemon not serving"

	# md RAID0, 4 KiB chunks, over both disks; an LVM snapshot (4 KiB chunks) of an LV on it.
	mdadm --create /dev/md1 --run --force --level=0 --chunk=4 --raid-devices=2 --metadata=1.2 /dev/$MD1 /dev/$MD2 2>&1
	res md1_level "$(cat /sys/block/md1/md/level)"
	res md1_chunk_bytes "$(cat /sys/block/md1/md/chunk_size)"
	res md1_members "$(cd /sys/block/md1/slaves && echo * | tr ' ' ,)"
	lvm_ pvcreate -q -y -ff /dev/md1
	lvm_ vgcreate -q vgmd /dev/md1
	lvm_ lvcreate -q -y -L 96M -n origin vgmd
	lvm_ lvcreate -q -y -s -c 4k -L 32M -n snap vgmd/origin
	multi_stack_cases md /dev/mapper/vgmd-snap
	lvm_ vgremove -q -f vgmd
	lvm_ pvremove -q -y -ff /dev/md1
	mdadm --stop /dev/md1 2>&1
	mdadm --zero-superblock /dev/$MD1 /dev/$MD2

	# A striped LV, 64 KiB stripes over both disks; an LVM snapshot (4 KiB chunks) of it.
	lvm_ pvcreate -q -y -ff /dev/$MD1 /dev/$MD2
	lvm_ vgcreate -q vgst /dev/$MD1 /dev/$MD2
	lvm_ lvcreate -q -y -i 2 -I 64k -L 96M -n origin vgst
	res striped_table "$(dmsetup table vgst-origin-real 2>/dev/null || dmsetup table vgst-origin)"
	lvm_ lvcreate -q -y -s -c 4k -L 32M -n snap vgst/origin
	multi_stack_cases striped /dev/mapper/vgst-snap
	lvm_ vgremove -q -f vgst
	lvm_ pvremove -q -y -ff /dev/$MD1 /dev/$MD2

	kill -TERM "${pids[-1]}"
	rc=0; wait "${pids[-1]}" || rc=$?
	res daemon_exit_multi "$rc"
	unset 'pids[-1]'
	log "multi-disk stacks done"
}

# ---------------------------------------------------------------- 1. LVM after the daemon started
modprobe -a md-mod raid0
lvm_ vgchange -q -an                          # every VG the scenario made (vg0, and vg1/vg2 on the multipath and partitioned disks): no dm device from here on
[ -z "$(ls /sys/block | grep '^dm-' || true)" ] || die "dm devices still present: $(ls /sys/block)"
# Short windows: the md part below must raise within seconds under TCG.
POLICY=(--collapse.window=3s --collapse.raise-after=1s --collapse.clear-after=2s)
start_daemon dm 19871 "${POLICY[@]}"
start_daemon any 19872 "${POLICY[@]}" --collapse.require-upper=any
for port in 19871 19872; do
	t=$(wait_series "$port" "$BIOQ" 0 60) || die "daemon on $port: block_bio_queue not 0 at start ($t)"
done
log "daemons up, no dm/md device: block_bio_queue 0"
res bio_queue_before_lvm "$(series 19871 "$BIOQ")"

lvm_ lvcreate -q -y -L 64M -n late $VG
late=
for d in /sys/block/dm-*; do [ "$(cat "$d/dm/name")" = $VG-late ] && late=${d##*/}; done
[ -n "$late" ] || die "no dm device named $VG-late in /sys/block"
res late_device "$late"
t=$(wait_series 19871 "$BIOQ" 1 15) || die "block_bio_queue not attached after lvcreate ($t)"
res bio_queue_after_lvcreate "$(series 19871 "$BIOQ")"
res bio_queue_after_lvcreate_seconds "$t"
log "$VG/late is $late: block_bio_queue attached after $t s"
# Both daemons count the LV's bios, so the other one's attach must not fall inside the counted read:
# a probe added to a tracepoint while the read runs is a change the count would have to survive
# (issue 24 measured programs missing events while tracepoints were switched on and off).
t=$(wait_series 19872 "$BIOQ" 1 15) || die "block_bio_queue not attached after lvcreate on 19872 ($t)"
# The kernel's run counts of each program (mergewatch_bpf_program_runs_total): a count that comes up
# short then says whether the kernel ran the program fewer times or the program did not count.
echo 1 > /proc/sys/kernel/bpf_stats_enabled
sleep 1.5   # lvcreate's own I/O (wipe, scan) lands in a tick before the baseline scrape
for port in 19871 19872; do curl -fsS --max-time 10 -o "$OUT/lvm-before-read-$port.prom" "$(url $port)"; done
cat "/sys/block/$DISK/stat" > "$OUT/diskstat-before-lv-read.txt"
# 256 KiB bios: below the disk's max_sectors_kb (512), so each is one request at the disk.
dd if=/dev/$VG/late of=/dev/null bs=256k count=64 iflag=direct status=none
cat "/sys/block/$DISK/stat" > "$OUT/diskstat-after-lv-read.txt"
sleep 1.5
for port in 19871 19872; do curl -fsS --max-time 10 -o "$OUT/lvm-after-read-$port.prom" "$(url $port)"; done
echo 0 > /proc/sys/kernel/bpf_stats_enabled

lvm_ lvremove -q -y $VG/late
t=$(wait_series 19871 "$BIOQ" 0 15) || die "block_bio_queue still attached after lvremove ($t)"
res bio_queue_after_lvremove "$(series 19871 "$BIOQ")"
res bio_queue_after_lvremove_seconds "$t"
log "$VG/late removed: block_bio_queue detached after $t s"

# ---------------------------------------------------------------- 2. md as the upper device
lvm_ vgremove -q -f $VG
lvm_ pvremove -q -y -ff /dev/$DISK
mdadm --create /dev/md0 --run --force --level=0 --chunk=4 --raid-devices=1 --metadata=1.2 /dev/$DISK 2>&1
res md_level "$(cat /sys/block/md0/md/level)"
res md_chunk_bytes "$(cat /sys/block/md0/md/chunk_size)"
echo none > /sys/block/$DISK/queue/scheduler
echo 2 > /sys/block/$DISK/queue/nomerges
t=$(wait_series 19872 "$BIOQ" 1 15) || die "block_bio_queue not attached with md0 ($t)"
sleep 3   # one collapse window: the I/O of pvremove and mdadm's superblock write leaves it before the reads
log "md0 (raid0, 4 KiB chunks) on $DISK, nomerges=2: buffered reads (readahead bios, split into 4 KiB)"
# Through the page cache as the incident's cat: readahead sends large bios, each a fresh region.
( for i in $(seq 0 31); do dd if=/dev/md0 of=/dev/null bs=1M count=32 skip=$((i * 32)) status=none; done ) &
reader=$!
t=$(wait_series 19872 "mergewatch_merge_collapse{device=\"$DISK\",upper=\"md0\"}" 1 40) ||
	{ curl -fsS "$(url 19872)" | grep collapse > "$OUT/md-any-timeout.prom" || true; die "no collapse with md0 ($t)"; }
res md_any_raised_seconds "$t"
curl -fsS --max-time 10 -o "$OUT/md-any.prom" "$(url 19872)"
curl -fsS --max-time 10 -o "$OUT/md-dm.prom" "$(url 19871)"
kill "$reader"; wait "$reader" 2>/dev/null || true
reader=
log "collapse{upper=md0} raised under require-upper=any after $t s"

echo 0 > /sys/block/$DISK/queue/nomerges
for i in "${!pids[@]}"; do
	kill -TERM "${pids[$i]}"
	rc=0; wait "${pids[$i]}" || rc=$?
	res "daemon_exit_$i" "$rc"
done
pids=()
mdadm --stop /dev/md0 2>&1

# ---------------------------------------------------------------- 3. several disks under one snapshot
if [ "${MW_NVME_DISKS:-0}" -ge 2 ]; then
	multi_disk_stacks
fi
res done 1
log "done"

# ---------------------------------------------------------------- 4. a multipath path deleted (last: one path stays)
# run-vm.sh --multipath --path-removal: the head's counters across a path controller's removal
# (guest-multipath.sh; the 6.1 boot only, as test_vm_multipath.py reads it there).
if [ "${MW_MULTIPATH:-0}" = 1 ] && [ "${MW_PATH_REMOVAL:-0}" = 1 ]; then
	"$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/guest-multipath.sh" ||
		log "multipath deletion checks failed: see mpdelete/results.txt"
fi
