#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Guest side of the "who" tests (test_vm_who.py): which service a collapsed pair's requests come from
# (mergewatch_collapse_service_request_ratio, /status "services") and the per-volume series
# (mergewatch_remapped_dispatched_*, mergewatch_remapped_request_latency_seconds). Run by
# guest-scenario.sh after guest-findings.sh (run-vm.sh --who PARTS), or alone:
#   run-vm.sh --nvme-disks 2 --script tests/vm/guest-who.sh --daemon build/mergewatchd --metrics-url x
# on the two single-path NVMe disks of run-vm.sh --nvme-disks 2 (serials mwnvme1, mwnvme2), with one
# daemon (port 19876, short detector windows) for every part. The parts (MW_WHO_PARTS, in this order):
#   backup  an LVM snapshot (4 KiB chunks) of an LV on mwnvme1 at nomerges=2: the backup's batched direct
#           reads of the snapshot from /backup.slice beside random 8 KiB direct reads of its origin from
#           /db.slice; the (disk, snapshot) pair pages.
#   luks    the same on LVM on LUKS2 on mwnvme2: the crypt hop's clones are remapped in the reader's task
#           on 6.1 (dm_submit_bio_remap since e5524e128f6f, v5.16); on 5.10 the chain stops at the crypt
#           device and nothing is waited for, four scrapes are taken while the reads run.
#   write   ext4 on the origin of a 4 KiB-chunk snapshot on mwnvme1, buffered writes from /writer.slice
#           written back by the flusher at nomerges=2: first with no controller enabled below the root
#           (the bios carry the root blkcg: "writeback"), then with +io +memory (cgroup writeback: the
#           bios carry /writer.slice's blkcg).
#   perlv   two LVs on mwnvme1 at nomerges=0, one read with 4 KiB direct random reads, the other with
#           256 KiB direct sequential reads at the same time for 20 s; scrapes before and after, idle.
# Output in $MW_OUT/who/: results.txt (key=value), *.prom scrapes, *-status.json, daemon.log.
set -euo pipefail

DAEMON=${MW_DAEMON:-}
[ -n "$DAEMON" ] || exit 0
OUT=${MW_OUT:-/vmout}/who
PORT=19876
CG=/sys/fs/cgroup
mkdir -p "$OUT"
: > "$OUT/results.txt"

now() { cut -d' ' -f1 /proc/uptime; }
log() { printf '[%8s] who: %s\n' "$(now)" "$*"; }
res() { printf '%s=%s\n' "$1" "$2" >> "$OUT/results.txt"; }
die() { log "FAIL: $*"; res failed "$*"; exit 1; }
trap 'rc=$?; log "FAIL: line $LINENO: $BASH_COMMAND (exit $rc)"' ERR

export DM_DISABLE_UDEV=1 LVM_SUPPRESS_FD_WARNINGS=1
LVM_CONFIG='activation { monitoring = 0 udev_sync = 0 udev_rules = 0 } devices { obtain_device_list_from_udev = 0 use_devicesfile = 0 }'
lvm_() { lvm "$1" --config "$LVM_CONFIG" "${@:2}"; }
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/guest-lib.sh"	# disk_by_serial

daemon=
loads=()
cleanup() {
	[ ${#loads[@]} = 0 ] || kill "${loads[@]}" 2>/dev/null || true
	[ -z "$daemon" ] || kill -TERM "$daemon" 2>/dev/null || true
}
trap cleanup EXIT

url() { echo "http://127.0.0.1:$PORT/$1"; }
scrape() { curl -fsS --max-time 10 -o "$OUT/$1.prom" "$(url metrics)"; }
status() { curl -fsS --max-time 10 -o "$OUT/$1-status.json" "$(url status)"; }
# The value of one series in a scrape, or "absent".
series() {
	curl -fsS --max-time 10 "$(url metrics)" | awk -v s="$1" '$1 == s { print $2; found = 1 } END { if (!found) print "absent" }'
}
# wait_series SERIES VALUE SECONDS: poll until the series has VALUE; prints the seconds it took.
wait_series() {
	local t0 v
	t0=$(now)
	while :; do
		v=$(series "$1")
		[ "$v" = "$2" ] && { awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f\n", b - a }'; return 0; }
		awk -v a="$t0" -v b="$(now)" -v l="$3" 'BEGIN { exit !(b - a > l) }' && { echo "timeout($v)"; return 1; }
		sleep 0.5
	done
}
dm_of() {	# the kernel name (dm-N) of a dm device by its dm name
	local d
	for d in /sys/block/dm-*; do [ "$(cat "$d/dm/name")" = "$1" ] && { echo "${d##*/}"; return 0; }; done
	return 1
}
# in_cgroup CGROUP COMMAND...: COMMAND as a process of /sys/fs/cgroup/CGROUP from its first instruction (the
# shell moves itself, then execs). Only as `in_cgroup ... &`: the background subshell execs too, so $! is the
# command's own pid (killing it ends the load).
in_cgroup() {
	local cg=$1
	shift
	exec bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG/$cg" "$@"
}
set_queue() {	# set_queue DISK NOMERGES
	echo none > /sys/block/$1/queue/scheduler
	echo "$2" > /sys/block/$1/queue/nomerges
}
stop_loads() {
	kill "${loads[@]}" 2>/dev/null || true
	wait "${loads[@]}" 2>/dev/null || true
	loads=()
}
# The backup: batched direct reads of a 4 KiB-chunk snapshot, 64 KiB bios (16 chunks), eight per
# io_submit (guest-stacking.sh's READ_SNAP): each submission's plug holds 128 contiguous 4 KiB pieces.
READ_SNAP=(--name=backup --readonly --thread --direct=1 --rw=read --bs=64k --ioengine=libaio
	--iodepth=8 --iodepth_batch_submit=8 --iodepth_batch_complete_min=8 --output=/dev/null)
# The service beside it: random 8 KiB direct reads of the origin, queue depth 32.
READ_DB=(--name=db --readonly --thread --direct=1 --rw=randread --bs=8k --ioengine=libaio --iodepth=32
	--output=/dev/null)
snapshot_lvs() {	# snapshot_lvs VG PV: a 256 MiB origin and its 4 KiB-chunk snapshot (64 MiB COW)
	lvm_ pvcreate -q -y -ff "$2"
	lvm_ vgcreate -q "$1" "$2"
	lvm_ lvcreate -q -y -L 256M -n origin "$1"
	lvm_ lvcreate -q -y -s -c 4k -L 64M -n snap "$1/origin"
}
drop_vg() { lvm_ vgremove -q -f "$1"; lvm_ pvremove -q -y -ff "$2"; }

# backup_beside_db NAME DISK VG WAIT: db.slice reads the origin, backup.slice the snapshot, nomerges=2 on
# DISK. WAIT=1: until the (DISK, snapshot) pair is raised (60 s), then one more window so the detector's
# last window holds only the steady state, then a scrape, /status and the daemon's log. WAIT=0 (a kernel
# whose chain stops above the disk): four scrapes 1.5 s apart, the last with /status. Files NAME.prom, NAME-status.json,
# NAME-daemon.log.
backup_beside_db() {
	local name=$1 disk=$2 vg=$3 wait=$4 snap origin t i
	snap=$(dm_of "$vg-snap") && origin=$(dm_of "$vg-origin") || die "$name: no dm device for $vg-snap or $vg-origin"
	res "${name}_disk" "$disk"
	res "${name}_snapshot" "$snap"
	res "${name}_origin" "$origin"
	res "${name}_stack" "$(cd /sys/block/$snap/slaves && echo *)>$(ls /sys/block/$disk/holders | paste -sd, -)"
	set_queue "$disk" 2
	sleep 4	# a window without the set-up's I/O (lvcreate, luksFormat)
	log "$name: nomerges=2 on $disk; db.slice reads $vg/origin ($origin), backup.slice reads $vg/snap ($snap)"
	in_cgroup db.slice fio "${READ_DB[@]}" --filename=/dev/$vg/origin --time_based --runtime=120 &
	loads+=($!)
	sleep 2	# the service first: the backup starts on a disk already busy with the origin's reads
	in_cgroup backup.slice fio "${READ_SNAP[@]}" --filename=/dev/$vg/snap --time_based --runtime=120 --size=64m &
	loads+=($!)
	sleep 1	# the shell has moved itself and exec'd fio
	res "${name}_db_cgroup" "$(cut -d: -f3 /proc/${loads[0]}/cgroup)"
	res "${name}_backup_cgroup" "$(cut -d: -f3 /proc/${loads[1]}/cgroup)"
	if [ "$wait" = 1 ]; then
		t=$(wait_series "mergewatch_merge_collapse{device=\"$disk\",upper=\"$snap\"}" 1 60) ||
			{ scrape "$name-timeout"; stop_loads; die "$name: no collapse on ($disk, $snap) ($t)"; }
		res "${name}_raised_seconds" "$t"
		sleep 4	# one more window (3 s): the shares are of the steady state
		scrape "$name"
		status "$name"
		cp "$OUT/daemon.log" "$OUT/$name-daemon.log"	# its last onset line is this part's (dm-N names are reused)
	else
		for i in 1 2 3 4; do sleep 1.5; scrape "$name-poll-$i"; done
		cp "$OUT/$name-poll-4.prom" "$OUT/$name.prom"
		status "$name"
	fi
	stop_loads
	set_queue "$disk" 0
}

part_backup() {
	snapshot_lvs vgwho "/dev/$D1"
	backup_beside_db backup "$D1" vgwho 1
	drop_vg vgwho "/dev/$D1"
}

# LUKS2 with a key file and a fast PBKDF (set-up time under TCG, not security), LVM on it.
part_luks() {
	local wait=1 crypt
	head -c 64 /dev/urandom > /run/who.key
	cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
		--key-file /run/who.key "/dev/$D2"
	cryptsetup open --key-file /run/who.key "/dev/$D2" whocrypt
	crypt=$(dm_of whocrypt) || die "luks: no dm device for whocrypt"
	res luks_crypt "$crypt"
	res luks_crypt_table "$(dmsetup table whocrypt | awk '{ print $3, $4 }')"	# target and cipher
	snapshot_lvs vgluks /dev/mapper/whocrypt
	# dm-crypt traces its clones' remap (dm_submit_bio_remap) since e5524e128f6f (v5.16).
	case "$(uname -r)" in 5.1[0-5].*|5.[0-9].*|4.*) wait=0 ;; esac
	res luks_waited "$wait"
	backup_beside_db luks "$D2" vgluks "$wait"
	drop_vg vgluks /dev/mapper/whocrypt
	cryptsetup close whocrypt
	rm -f /run/who.key
}

# One writeback variant: WRITER rewrites FILE through the page cache (64 KiB writes, no fsync) for up to
# 120 s; the flusher writes it back (dirty_background_bytes 1 MiB: it runs all the time) through the
# snapshot's origin, which cuts each write at the 4 KiB chunks. Until the (disk, origin) pair is raised,
# then one more window, a scrape, /status and the log. Files NAME.prom, NAME-status.json, NAME-daemon.log.
writeback_case() {	# writeback_case NAME FILE
	local name=$1 t
	sleep 4
	log "$name: buffered writes to $2 from writer.slice, nomerges=2 on $D1"
	in_cgroup writer.slice fio --name=writer --filename="$2" --rw=write --bs=64k --size=48m --ioengine=psync \
		--invalidate=0 --time_based --runtime=120 --output=/dev/null &
	loads+=($!)
	sleep 1
	res "${name}_writer_cgroup" "$(cut -d: -f3 /proc/${loads[0]}/cgroup)"
	t=$(wait_series "mergewatch_merge_collapse{device=\"$D1\",upper=\"$WORIGIN\"}" 1 60) ||
		{ scrape "$name-timeout"; stop_loads; die "$name: no collapse on ($D1, $WORIGIN) ($t)"; }
	res "${name}_raised_seconds" "$t"
	sleep 4
	scrape "$name"
	status "$name"
	cp "$OUT/daemon.log" "$OUT/$name-daemon.log"
	cp /proc/vmstat "$OUT/$name-vmstat.txt"
	stop_loads
	sync
}

direct_write() { fio --name="$1" --filename="$2" --size=48m --bs=1m --rw=write --direct=1 --output=/dev/null; }
part_write() {
	lvm_ pvcreate -q -y -ff "/dev/$D1"
	lvm_ vgcreate -q vgwb "/dev/$D1"
	lvm_ lvcreate -q -y -L 256M -n origin vgwb	# ext4 first, without copy-on-write; the snapshot after it
	mkfs.ext4 -q -b 4096 -E lazy_itable_init=0,lazy_journal_init=0,nodiscard /dev/vgwb/origin
	mkdir -p /mnt/who
	# lazytime: no journal commit per write for the mtime (jbd2's writes would be a service of their own).
	mount -o noatime,lazytime /dev/vgwb/origin /mnt/who
	for f in off on; do direct_write fill /mnt/who/$f.dat; done
	lvm_ lvcreate -q -y -s -c 4k -L 128M -n snap vgwb/origin
	WORIGIN=$(dm_of vgwb-origin) || die "write: no dm device for vgwb-origin"
	res write_disk "$D1"
	res write_origin "$WORIGIN"
	# Every block of both files copied to the snapshot once, directly: the measured writes go straight down
	# (a write to a chunk not yet copied waits for kcopyd and is submitted again from its completion).
	for f in off on; do direct_write cow /mnt/who/$f.dat; done
	sync
	echo 1048576 > /proc/sys/vm/dirty_background_bytes
	echo 8388608 > /proc/sys/vm/dirty_bytes
	set_queue "$D1" 2
	res write_off_subtree_control "$(cat $CG/cgroup.subtree_control)"
	writeback_case write-off /mnt/who/off.dat
	# Cgroup writeback needs both controllers (inode_cgwb_enabled()): the flusher's bios then carry the blkcg
	# of the memory cgroup that dirtied the pages (wbc_init_bio()).
	echo "+io +memory" > $CG/cgroup.subtree_control
	res write_on_subtree_control "$(cat $CG/cgroup.subtree_control)"
	res write_on_writer_controllers "$(cat $CG/writer.slice/cgroup.controllers)"
	writeback_case write-on /mnt/who/on.dat
	echo "-io -memory" > $CG/cgroup.subtree_control || log "write: io and memory stay enabled below the root"
	set_queue "$D1" 0
	echo 20 > /proc/sys/vm/dirty_ratio	# the defaults again (a ratio written clears its bytes twin)
	echo 10 > /proc/sys/vm/dirty_background_ratio
	umount /mnt/who
	drop_vg vgwb "/dev/$D1"
}

# Two LVs of one disk read at once, 4 KiB random and 256 KiB sequential (direct: one request per bio at
# nomerges=0, 256 KiB under max_sectors_kb 512), for 20 s. Scrapes and /sys/block/DISK/stat before and
# after, both idle (every request completed): per-volume deltas against the disk's.
part_perlv() {
	local i
	lvm_ pvcreate -q -y -ff "/dev/$D1"
	lvm_ vgcreate -q vgpv "/dev/$D1"
	lvm_ lvcreate -q -y -L 256M -n small vgpv
	lvm_ lvcreate -q -y -L 256M -n large vgpv
	res perlv_disk "$D1"
	res perlv_small "$(dm_of vgpv-small)"
	res perlv_large "$(dm_of vgpv-large)"
	set_queue "$D1" 0
	sleep 2	# lvcreate's own I/O completed
	cat /sys/block/$D1/stat > "$OUT/perlv-stat-before.txt"
	scrape perlv-before
	log "perlv: 4 KiB random reads of vgpv/small and 256 KiB sequential reads of vgpv/large, 20 s"
	fio --name=small --readonly --direct=1 --rw=randread --bs=4k --ioengine=libaio --iodepth=8 \
		--filename=/dev/vgpv/small --time_based --runtime=20 --output-format=json \
		--output="$OUT/perlv-small-fio.txt" &
	loads+=($!)
	fio --name=large --readonly --direct=1 --rw=read --bs=256k --ioengine=libaio --iodepth=8 \
		--filename=/dev/vgpv/large --time_based --runtime=20 --output-format=json \
		--output="$OUT/perlv-large-fio.txt" &
	loads+=($!)
	for i in "${loads[@]}"; do wait "$i"; done
	loads=()
	sleep 2	# idle: every request completed and counted
	cat /sys/block/$D1/stat > "$OUT/perlv-stat-after.txt"
	scrape perlv-after
	drop_vg vgpv "/dev/$D1"
}

PARTS_ALL="backup luks write perlv"
PARTS=${MW_WHO_PARTS:-$PARTS_ALL}
for part in $PARTS; do
	case " $PARTS_ALL " in *" $part "*) ;; *) die "MW_WHO_PARTS: unknown part $part (one of: $PARTS_ALL)" ;; esac
done

ip link set lo up	# the scenario did; a standalone run (--script) has to
# No udev and no /sbin/modprobe in the initramfs the kernel's request_module() would run: every module by hand.
modprobe -a nvme dm-mod dm-snapshot dm-crypt aes_generic ecb xts algif_skcipher ext4	# aes_generic, ecb: modules on 5.10
D1=$(disk_by_serial mwnvme1) && D2=$(disk_by_serial mwnvme2) ||
	die "no NVMe disks with serials mwnvme1/mwnvme2 (run-vm.sh --nvme-disks 2)"
for d in "$D1" "$D2"; do wipefs -q -a "/dev/$d"; done
res kernel "$(uname -r)"
res disks "$D1,$D2"
res parts "$PARTS"
mountpoint -q $CG || die "no cgroup2 at $CG"
for s in backup db writer; do mkdir -p $CG/$s.slice; res "${s}_cgroup_id" "$(stat -c %i $CG/$s.slice)"; done
res root_subtree_control "$(cat $CG/cgroup.subtree_control)"

"$DAEMON" --web.listen-address=127.0.0.1:$PORT --topology.refresh-interval=1s \
	--collapse.window=3s --collapse.raise-after=1s --collapse.clear-after=2s > "$OUT/daemon.log" 2>&1 &
daemon=$!
# Serving, with block_rq_issue attached in either mode (tp_btf, or raw_tp where BTF lacks it).
ready() {
	curl -fsS --max-time 10 "$(url metrics)" 2> /dev/null |
		grep -q '^mergewatch_bpf_program_attached{tracepoint="block_rq_issue",[^}]*} 1$'
}
for i in $(seq 480); do ready && break; sleep 0.5; done
ready || die "daemon not serving: $(tail -5 "$OUT/daemon.log")"
for part in $PARTS; do
	t0=$(now)
	"part_$part"
	res "${part}_seconds" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }')"
done
kill -TERM "$daemon"
rc=0; wait "$daemon" || rc=$?
daemon=
res daemon_exit "$rc"
for s in backup db writer; do rmdir $CG/$s.slice; done
res done 1
log "done"
