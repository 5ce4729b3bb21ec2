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
#      upper=the snapshot}; counts of bounded reads against /sys/block/X/stat at both. Then, raise
#      and quiet only: md RAID0 with 64 KiB chunks, a striped LV with 4 KiB stripes, and md RAID10 and
#      RAID1 writes cut by a snapshot's origin (upper=the origin); reads of a snapshot on RAID10, which
#      the kernel spreads so that no merge is missed, not raised. A backup reading the 64 KiB-stripe
#      snapshot while four random 8 KiB readers hammer its origin: upper=the snapshot raised, the
#      origin's pairs not. Small direct writes beside an fstrim loop on ext4 on an LV: never raised.
#   split (after 1; run-vm.sh --stack-parts picks among late, split, md): the I/O split ticket. Direct 1 MiB
#      reads of LVM snapshots with 4 KiB and 64 KiB chunks, buffered reads of the 4 KiB one, by a daemon with
#      the unit's capabilities only (test_vm_split.py).
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
# Four scrapes of the multi daemon a second apart while a load runs, into PREFIX-poll-1..4.prom: over a
# window plus raise-after (and more: a scrape takes seconds under TCG while fio runs).
poll_scrapes() {	# poll_scrapes PREFIX
	local i
	for i in 1 2 3 4; do
		sleep 1
		curl -fsS --max-time 10 -o "$1-poll-$i.prom" "$(url 19873)"
	done
}
completed_ios() { awk '{print $1 + $5}' /sys/block/$1/stat; }	# completed_ios DISK: reads + writes
# True once every disk named has completed I/O since the call (the read or write count in its
# /sys/block/X/stat grew: the origin-write loads issue only writes), false after 60 s.
io_running() {	# io_running DISK...
	local q end ok i before=()
	for q; do before+=("$(completed_ios $q)"); done
	end=$(( $(date +%s) + 60 ))
	while [ "$(date +%s)" -lt "$end" ]; do
		ok=1 i=0
		for q; do
			[ "$(completed_ios $q)" -gt "${before[$i]}" ] || ok=0
			i=$((i + 1))
		done
		[ $ok = 1 ] && return 0
		sleep 0.2
	done
	return 1
}
dm_of() {	# the kernel name (dm-N) of a dm device by its dm name
	local d
	for d in /sys/block/dm-*; do [ "$(cat "$d/dm/name")" = "$1" ] && { echo "${d##*/}"; return 0; }; done
	return 1
}
# Batched direct reads of the snapshot: 64 KiB bios (16 x its 4 KiB chunks), eight per io_submit, so
# each submission's plug holds the pieces of eight bios, over both disks. --thread: one process.
# Started as `fio "${READ_SNAP[@]}" ... &`, so that $! is fio itself and killing it ends the reads.
LOAD=()	# multi_stack_cases' load when not READ_SNAP
READ_SNAP=(--name=multi --readonly --thread --direct=1 --rw=read --bs=64k --ioengine=libaio
	--iodepth=8 --iodepth_batch_submit=8 --iodepth_batch_complete_min=8 --output=/dev/null)
# One stack: nomerges=0 quiet while its load runs, then nomerges=2 raised on each disk's (disk, upper)
# pair; with COUNT=1 (the default) a bounded read counted after each. The load is "${LOAD[@]}" when set
# (writes to an origin), else the batched snapshot reads.
# Files $OUT/multi-STACK-*.
multi_stack_cases() {	# multi_stack_cases STACK DEV [COUNT]
	local st=$1 dev=$2 count=${3:-1} snap q nm i t p load
	snap=$(dm_of "${dev#/dev/mapper/}") || die "$st: no dm device for $dev"
	res "${st}_upper" "$snap"
	p="$OUT/multi-$st"
	if [ ${#LOAD[@]} -gt 0 ]; then load=("${LOAD[@]}"); else load=("${READ_SNAP[@]}"); fi
	for nm in 0 2; do
		for q in $MD1 $MD2; do
			echo none > /sys/block/$q/queue/scheduler
			echo $nm > /sys/block/$q/queue/nomerges
		done
		sleep 4	# a window with no reads: set-up I/O (lvcreate, mdadm) leaves it, a raise from before clears
		log "$st: nomerges=$nm on $MD1 $MD2, fio ${load[0]#--name=} on $dev ($snap)"
		# --runtime bounds a hang only: the reads are stopped once the waits and polls below are done. They
		# must outlast them, 40 s per disk at worst (a starved guest took 32 s to see a raise once).
		fio --filename="$dev" --time_based --runtime=180 --size=32m "${load[@]}" &	# LOAD may set its own size
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
			# Quiet: no scrape while the reads run has a pair raised (poll_scrapes). The polls start once
			# both disks complete I/O: under TCG on a loaded host fio took longer than the four polls to
			# issue its first read (a clean-clone make test of 2026-11-27 polled an idle stack on 5.10).
			io_running $MD1 $MD2 || die "$st: fio completed no I/O on $MD1 $MD2 within 60 s"
			poll_scrapes "$p-nm0"
		fi
		kill "$reader"; wait "$reader" 2>/dev/null || true
		reader=
		[ "$count" = 1 ] || continue
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
# A backup reading the snapshot while a live service hammers its origin with random 8 KiB reads (four
# jobs at queue depth 32, direct), nomerges=2 on both disks: each disk's (disk, snapshot) pair is raised,
# the (disk, origin) pairs are judged on their own requests and stay quiet (measured: one
# disk-wide judgement picked the origin, with the most requests, as the upper device and never paged).
# Files $OUT/live-*.
backup_while_live() {	# backup_while_live SNAPDEV ORIGINDEV
	local snap origin q t live p=$OUT/live
	snap=$(dm_of "${1#/dev/mapper/}") && origin=$(dm_of "${2#/dev/mapper/}") || die "live: no dm device for $1 or $2"
	res live_snapshot "$snap"
	res live_origin "$origin"
	for q in $MD1 $MD2; do echo 2 > /sys/block/$q/queue/nomerges; done
	sleep 4
	log "live: nomerges=2, random 8 KiB readers on $2 ($origin) and the backup reading $1 ($snap)"
	fio --name=live --readonly --thread --direct=1 --rw=randread --bs=8k --ioengine=libaio --iodepth=32 \
		--numjobs=4 --group_reporting --time_based --runtime=180 --filename="$2" --output="$p-fio.txt" &
	live=$!
	sleep 2	# the live load first: the backup starts on a disk already busy with the origin's requests
	curl -fsS --max-time 10 -o "$p-origin-only.prom" "$(url 19873)"
	fio "${READ_SNAP[@]}" --filename="$1" --time_based --runtime=180 --size=32m &	# stopped below
	reader=$!
	for q in $MD1 $MD2; do
		# 60 s: five fio threads keep TCG's two CPUs busy, a scrape can take seconds (the page came
		# 15-20 s after the backup started, the wait for it took up to 40 s in one exploration boot).
		t=$(wait_series 19873 "mergewatch_merge_collapse{device=\"$q\",upper=\"$snap\"}" 1 60) ||
			{ curl -fsS "$(url 19873)" | grep collapse > "$p-timeout.prom" || true
			  kill "$live" || true; die "live: no collapse on ($q, $snap) ($t)"; }
		res "live_raised_${q}_seconds" "$t"
	done
	curl -fsS --max-time 10 -o "$p.prom" "$(url 19873)"
	curl -fsS --max-time 10 -o "$p-status.json" "http://127.0.0.1:19873/status"
	kill "$reader" "$live"; wait "$reader" "$live" 2>/dev/null || true
	reader=
	for q in $MD1 $MD2; do echo 0 > /sys/block/$q/queue/nomerges; done
}
# Small direct writes beside fstrim on a mounted ext4 on an LV over one disk: 4 KiB sequential direct
# writes in batches of eight, while a loop allocates 192 MiB (fallocate: no data written), deletes it and
# runs fstrim (ext4 trims again only the groups freed since: discards of up to 128 MiB each). Four scrapes
# with nomerges=0 (the default: the writes merge) and four with nomerges=2 (they cannot: missed merges,
# 4 KiB requests under 4 KiB bios). Neither pages: the LV's bios are as small as its requests, as long
# as the discards stay out of its mean bio size. Files $OUT/trim-*.
writes_beside_fstrim() {
	local lv nm i q=$MD1 trimmer writer p=$OUT/trim
	lvm_ pvcreate -q -y -ff /dev/$q
	lvm_ vgcreate -q vgtrim /dev/$q
	lvm_ lvcreate -q -y -L 512M -n fs vgtrim
	lv=$(dm_of vgtrim-fs) || die "trim: no dm device for vgtrim-fs"
	res trim_disk "$q"
	res trim_upper "$lv"
	res trim_discard_max_bytes "$(cat /sys/block/$q/queue/discard_max_bytes)"
	mkfs.ext4 -q -E nodiscard /dev/mapper/vgtrim-fs
	mkdir -p /mnt/trim
	mount /dev/mapper/vgtrim-fs /mnt/trim
	fio --name=w --filename=/mnt/trim/data --size=32m --bs=1m --rw=write --direct=1 --fallocate=none --output=/dev/null
	echo none > /sys/block/$q/queue/scheduler
	for nm in 0 2; do
		echo $nm > /sys/block/$q/queue/nomerges
		sleep 4
		log "trim: nomerges=$nm on $q, 4 KiB direct writes on $lv beside an fstrim loop"
		fio --name=w --filename=/mnt/trim/data --size=32m --bs=4k --rw=write --direct=1 --ioengine=libaio \
			--iodepth=8 --iodepth_batch_submit=8 --iodepth_batch_complete_min=8 --fallocate=none \
			--time_based --runtime=60 --output=/dev/null &
		writer=$!
		( while :; do fallocate -l 192M /mnt/trim/junk; rm /mnt/trim/junk; fstrim /mnt/trim; done ) &
		trimmer=$!
		cat /sys/block/$q/stat > "$p-nm$nm-stat-before.txt"
		poll_scrapes "$p-nm$nm"
		cat /sys/block/$q/stat > "$p-nm$nm-stat-after.txt"
		kill "$trimmer" "$writer"; wait "$trimmer" "$writer" 2>/dev/null || true
	done
	echo 0 > /sys/block/$q/queue/nomerges
	umount /mnt/trim
	lvm_ vgremove -q -f vgtrim
	lvm_ pvremove -q -y -ff /dev/$q
}
# An LV origin (96 MiB, LVOPTS) on the PVs and an LVM snapshot of it with 4 KiB chunks (SNAPSIZE, 32 MiB):
# /dev/mapper/VG-snap.
snapshot_vg() {	# snapshot_vg VG PV...
	local vg=$1
	shift
	lvm_ pvcreate -q -y -ff "$@"
	lvm_ vgcreate -q "$vg" "$@"
	# shellcheck disable=SC2086
	lvm_ lvcreate -q -y ${LVOPTS:-} -L 96M -n origin "$vg"
	lvm_ lvcreate -q -y -s -c 4k -L "${SNAPSIZE:-32M}" -n snap "$vg/origin"
}
drop_vg() {	# drop_vg VG PV...
	lvm_ vgremove -q -f "$1"
	lvm_ pvremove -q -y -ff "${@:2}"
}
# md over both disks: LEVEL, CHUNK in KiB (0: none, RAID1), extra mdadm arguments; /dev/NAME.
make_md() {	# make_md NAME LEVEL CHUNK [ARGS...]
	local name=$1 level=$2 chunk=$3 opts
	shift 3
	opts=(--level=$level)
	[ "$chunk" = 0 ] || opts+=(--chunk=$chunk)
	mdadm --create /dev/$name --run --force "${opts[@]}" --raid-devices=2 --metadata=1.2 "$@" \
		/dev/$MD1 /dev/$MD2 2>&1
	res ${name}_level "$(cat /sys/block/$name/md/level)"
	res ${name}_chunk_bytes "$(cat /sys/block/$name/md/chunk_size)"
	res ${name}_members "$(cd /sys/block/$name/slaves && echo * | tr ' ' ,)"
}
stop_md() {	# stop_md NAME
	mdadm --stop /dev/$1 2>&1
	mdadm --zero-superblock /dev/$MD1 /dev/$MD2
}
# md RAID0, 4 KiB chunks, over both disks; an LVM snapshot (4 KiB chunks) of an LV on it.
stack_md() {
	make_md md1 0 4
	snapshot_vg vgmd /dev/md1
	multi_stack_cases md /dev/mapper/vgmd-snap
	drop_vg vgmd /dev/md1
	stop_md md1
}
# md RAID0, 64 KiB chunks: raise and quiet only.
stack_md64k() {
	make_md md2 0 64
	snapshot_vg vgmd64 /dev/md2
	multi_stack_cases md64k /dev/mapper/vgmd64-snap 0
	drop_vg vgmd64 /dev/md2
	stop_md md2
}
# A striped LV, 64 KiB stripes over both disks; an LVM snapshot (4 KiB chunks) of it. Then the backup
# of that snapshot while random readers hammer its origin.
stack_striped() {
	LVOPTS="-i 2 -I 64k" snapshot_vg vgst /dev/$MD1 /dev/$MD2
	res striped_table "$(dmsetup table vgst-origin-real)"
	multi_stack_cases striped /dev/mapper/vgst-snap
	backup_while_live /dev/mapper/vgst-snap /dev/mapper/vgst-origin
	drop_vg vgst /dev/$MD1 /dev/$MD2
}
# 4 KiB stripes: raise and quiet only.
stack_striped4k() {
	LVOPTS="-i 2 -I 4k" snapshot_vg vgst4 /dev/$MD1 /dev/$MD2
	res striped4k_table "$(dmsetup table vgst4-origin-real)"
	multi_stack_cases striped4k /dev/mapper/vgst4-snap 0
	drop_vg vgst4 /dev/$MD1 /dev/$MD2
}
# Batched direct 64 KiB writes to the origin of a snapshot with 4 KiB chunks (multi_stack_cases' LOAD). The
# origin target cuts each write at its snapshots' chunk size (origin_map, dm_accept_partial_bio); md RAID1
# and RAID10 send each 4 KiB piece to both legs from their plug callback (raid1_unplug, raid10_unplug),
# inside the writer's plug: A0 B0 A1 B1 ...
ORIGIN_WRITES=(--name=originw --thread --direct=1 --rw=write --bs=64k --size=16m --ioengine=libaio
	--iodepth=8 --iodepth_batch_submit=8 --iodepth_batch_complete_min=8 --output=/dev/null)
# A first pass over the region the writes cover makes its exceptions (copy-on-write, through kcopyd), so
# the measured writes go straight down in the writer's context.
cow_pass() { fio --name=cow --direct=1 --rw=write --bs=1m --size=16m --filename="$1" --output=/dev/null; }
# md RAID10 and RAID1 over both disks (--assume-clean: no resync I/O). The writes must raise on both
# members under the origin: md clones each write to both, each clone's block_bio_remap starts from the
# same md hop, and the chain leaves that hop's entry for the other clone (bpf/mergewatch.bpf.c,
# fresh_remap_link). Before it did, the first leg took the entry and the second member's requests
# counted under md (exploration boot: nvme2n1's writes all under upper="", 3,239 requests/s).
stack_raid10() {
	local q snap p=$OUT/multi-raid10r
	# md RAID10 (near 2, 64 KiB chunks), a snapshot on it. Reads of the snapshot cannot page by the
	# kernel's rule: over non-rotational mirrors read_balance() takes the copy with the fewest pending
	# requests, so consecutive 4 KiB pieces alternate disks and neither disk holds two contiguous ones: no
	# merge is there to miss (exploration boot: nomerges=0 merged 16 and 128 of 2,867 requests/s, the far 2
	# layout the same). nomerges=2: four scrapes, no pair raised. Then writes to its origin: both copies of
	# each piece, in the writer's plug: raised with nomerges=2, quiet with nomerges=0.
	make_md md3 10 64 --assume-clean --bitmap=none
	res md3_layout "$(cat /sys/block/md3/md/layout)"
	SNAPSIZE=32M snapshot_vg vgr10 /dev/md3	# room for the 16 MiB of exceptions and their metadata
	snap=$(dm_of vgr10-snap) || die "raid10: no dm device for vgr10-snap"
	res raid10r_upper "$snap"
	for q in $MD1 $MD2; do echo none > /sys/block/$q/queue/scheduler; echo 2 > /sys/block/$q/queue/nomerges; done
	sleep 4
	log "raid10r: nomerges=2, batched direct reads of vgr10-snap ($snap)"
	fio "${READ_SNAP[@]}" --filename=/dev/mapper/vgr10-snap --time_based --runtime=180 --size=32m &	# stopped below
	reader=$!
	poll_scrapes "$p-nm2"
	kill "$reader"; wait "$reader" 2>/dev/null || true
	reader=
	for q in $MD1 $MD2; do echo 0 > /sys/block/$q/queue/nomerges; done
	cow_pass /dev/mapper/vgr10-origin
	LOAD=("${ORIGIN_WRITES[@]}")
	multi_stack_cases raid10w /dev/mapper/vgr10-origin 0
	LOAD=()
	drop_vg vgr10 /dev/md3
	stop_md md3
}
# md RAID1: writes to the origin of a snapshot on it.
stack_raid1w() {
	make_md md4 1 0 --assume-clean --bitmap=none
	SNAPSIZE=32M snapshot_vg vgr1 /dev/md4
	cow_pass /dev/mapper/vgr1-origin
	LOAD=("${ORIGIN_WRITES[@]}")
	multi_stack_cases raid1w /dev/mapper/vgr1-origin 0
	LOAD=()
	drop_vg vgr1 /dev/md4
	stop_md md4
}
# MW_MULTI_PARTS: which stacks, in order (run-vm.sh --multi-parts; the kernels' boots run a subset, make
# test's budget); all by default. Each writes multi_PART_seconds.
MULTI_PARTS_ALL="md md64k striped striped4k raid10 raid1w trim"
multi_disk_stacks() {
	local part t0
	modprobe -a dm-snapshot dm-mod raid0 raid1 raid10 ext4
	MD1=$(disk_by_serial mwnvme1) && MD2=$(disk_by_serial mwnvme2) ||
		die "no NVMe disks with serials mwnvme1/mwnvme2 (run-vm.sh --nvme-disks 2)"
	res multi_disks "$MD1,$MD2"
	res multi_devnos "$(cat /sys/block/$MD1/dev),$(cat /sys/block/$MD2/dev)"
	start_daemon multi 19873 "${POLICY[@]}"
	wait_series 19873 "$BIOQ" 0 60 > /dev/null || die "multi daemon not serving"
	for part in ${MW_MULTI_PARTS:-$MULTI_PARTS_ALL}; do
		t0=$(now)
		case " $MULTI_PARTS_ALL " in
		*" $part "*) ;;
		*) die "MW_MULTI_PARTS: unknown part $part (one of: $MULTI_PARTS_ALL)" ;;
		esac
		if [ "$part" = trim ]; then writes_beside_fstrim; else "stack_$part"; fi
		res "multi_${part}_seconds" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }')"
	done

	kill -TERM "${pids[-1]}"
	rc=0; wait "${pids[-1]}" || rc=$?
	res daemon_exit_multi "$rc"
	unset 'pids[-1]'
	log "multi-disk stacks done"
}

# ---------------------------------------------------------------- split (defined here, run after 1)
# The split ticket (mergewatch_io_split_finding): direct 1 MiB reads of an LVM snapshot with 4 KiB chunks
# reach the disk as 4 KiB requests that no setting merges (the block device's direct I/O path has no plug:
# each piece is issued before the next exists), so nomerges 0 and 2 both get the ticket and no collapse page;
# buffered reads of the same snapshot with nomerges=2 page (readahead plugs, merges are missed) and get no
# ticket; a 64 KiB-chunk snapshot read directly gets neither. Its daemon runs with the shipped unit's
# capabilities only (CAP_BPF, CAP_PERFMON: setpriv). Each case records its scrapes, /status and its results;
# test_vm_split.py asserts on them.
SPLIT_PORT=19874
split_polls() {	# split_polls PREFIX: four scrapes (and /status) 1.5 s apart while the reads run
	local i
	for i in 1 2 3 4; do
		sleep 1.5
		curl -fsS --max-time 10 -o "$1-poll-$i.prom" "$(url $SPLIT_PORT)" || true
	done
	curl -fsS --max-time 10 -o "$1-status.json" "http://127.0.0.1:$SPLIT_PORT/status" || true
}
# split_case NAME SNAPDEV DM NOMERGES direct|buffered WAIT_SERIES: reads until its polls are taken; with
# WAIT_SERIES (the series that must rise) the seconds it took are recorded, then the polls; without, only the
# polls. fio's --runtime only bounds a hang: with 20 s, a guest starved beside another guest and the host's
# privileged suite saw the ticket rise after 31.9 s, and its polls found the reads over (clean-clone make
# test of 2026-11-28).
split_case() {
	local name=$1 dev=$2 dm=$3 nm=$4 how=$5 want=$6 p="$OUT/split-$1" t i
	echo none > /sys/block/$DISK/queue/scheduler
	echo "$nm" > /sys/block/$DISK/queue/nomerges
	# Nothing left raised from the case before (clear-after 2 s after a 3 s window).
	wait_series $SPLIT_PORT "mergewatch_io_split_finding{device=\"$DISK\",upper=\"$dm\"}" absent 30 > /dev/null ||
		log "split $name: the ticket of the case before did not clear"
	wait_series $SPLIT_PORT "mergewatch_merge_collapse{device=\"$DISK\",upper=\"$dm\"}" 0 30 > /dev/null || true
	sync; echo 3 > /proc/sys/vm/drop_caches
	log "split $name: nomerges=$nm, $how 1 MiB reads of $dev ($dm)"
	if [ "$how" = direct ]; then
		fio --name=split --filename="$dev" --readonly --direct=1 --rw=read --bs=1m --ioengine=psync \
			--size=128m --time_based --runtime=150 --output=/dev/null &
	else
		# Through the page cache (readahead), each pass a fresh region.
		( for i in $(seq 0 15); do dd if="$dev" of=/dev/null bs=1M count=16 skip=$((i * 16)) status=none; done ) &
	fi
	reader=$!
	io_running "$DISK" || log "split $name: no reads completed on $DISK"
	if [ -n "$want" ]; then
		t=$(wait_series $SPLIT_PORT "$want{device=\"$DISK\",upper=\"$dm\"}" 1 90) || t="timeout"
		res "split_${name}_raised_seconds" "$t"
	fi
	split_polls "$p"
	kill "$reader" 2>/dev/null || true; wait "$reader" 2>/dev/null || true
	reader=
	cp "$OUT/daemon-split.log" "$p-daemon.log"
}
split_cases() {
	local snap4 snap64 dm4 dm64
	modprobe dm-snapshot
	lvm_ lvchange -q -ay $VG/origin
	lvm_ lvcreate -q -y -s -c 4k -L 32M -n split4k $VG/origin
	lvm_ lvcreate -q -y -s -c 64k -L 32M -n split64k $VG/origin
	dm4=$(dm_of $VG-split4k) && dm64=$(dm_of $VG-split64k) || die "split: no dm devices for the snapshots"
	res split_disk "$DISK"
	res split4k_upper "$dm4"
	res split64k_upper "$dm64"
	res split4k_chunk_sectors "$(cat /sys/block/$dm4/queue/chunk_sectors 2>/dev/null || echo absent)"
	res split64k_chunk_sectors "$(cat /sys/block/$dm64/queue/chunk_sectors 2>/dev/null || echo absent)"
	# The shipped unit's capabilities and no others (root, so the bounding set decides what exec keeps).
	setpriv --bounding-set=-all,+bpf,+perfmon --inh-caps=-all \
		"$DAEMON" --web.listen-address=127.0.0.1:$SPLIT_PORT --topology.refresh-interval=1s "${POLICY[@]}" \
		> "$OUT/daemon-split.log" 2>&1 &
	pids+=($!)
	wait_series $SPLIT_PORT "$BIOQ" 1 60 > /dev/null || die "split daemon not serving"
	grep '^Cap' /proc/"${pids[-1]}"/status > "$OUT/split-daemon-caps.txt"
	split_case snap4k-nm0 /dev/$VG/split4k "$dm4" 0 direct mergewatch_io_split_finding
	split_case snap4k-nm2 /dev/$VG/split4k "$dm4" 2 direct mergewatch_io_split_finding
	split_case snap4k-buffered-nm2 /dev/$VG/split4k "$dm4" 2 buffered mergewatch_merge_collapse
	split_case snap64k-nm2 /dev/$VG/split64k "$dm64" 2 direct ""
	echo 0 > /sys/block/$DISK/queue/nomerges
	kill -TERM "${pids[-1]}"
	rc=0; wait "${pids[-1]}" || rc=$?
	res daemon_exit_split "$rc"
	unset 'pids[-1]'
	lvm_ lvremove -q -y $VG/split4k $VG/split64k
	log "split cases done"
}

# MW_STACK_PARTS (run-vm.sh --stack-parts): which single-disk parts run, in this order; all by default.
STACK_PARTS_ALL="late split md"
for part in ${MW_STACK_PARTS:-$STACK_PARTS_ALL}; do
	case " $STACK_PARTS_ALL " in *" $part "*) ;; *) die "MW_STACK_PARTS: unknown part $part (one of: $STACK_PARTS_ALL)" ;; esac
done
stack_part() { case " ${MW_STACK_PARTS:-$STACK_PARTS_ALL} " in *" $1 "*) return 0 ;; esac; return 1; }

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

if stack_part late; then
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
# (measured: programs missed events while tracepoints were switched on and off).
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
fi

stack_part split && split_cases

# ---------------------------------------------------------------- 2. md as the upper device
if stack_part md; then
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
fi
for i in "${!pids[@]}"; do
	kill -TERM "${pids[$i]}"
	rc=0; wait "${pids[$i]}" || rc=$?
	res "daemon_exit_$i" "$rc"
done
pids=()
stack_part md && mdadm --stop /dev/md0 2>&1

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
