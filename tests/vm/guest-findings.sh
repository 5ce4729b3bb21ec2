#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Guest side, third part of the scenario boot (called at the end of guest-scenario.sh, same VM, after
# guest-stacking.sh): the queue findings on the real 6.1 kernel. md RAID1 over the two emulated 7200 rpm
# disks (run-vm.sh --rotational-disks 2: QEMU scsi-hd behind virtio-scsi with its default queues, one per
# vCPU), and one single-queue virtio-blk disk (run-vm.sh --virtio-blk-disks 1):
#   1. the kernel's own choice: none for the scsi disks (more than one hardware queue), and the virtio-blk
#      disk set to none: rotational_without_scheduler names both scsi disks, never the virtio-blk one
#      (virtio-blk cannot report rotation: its rotational=1 is the driver's default), md1 nor the NVMe disk;
#   2. nomerges=2 on one member: merging_disabled_under_stack names it;
#   3. mq-deadline and nomerges=0 again: no finding left (the virtio-blk disk still on none).
# Output in $MW_OUT/findings/: results.txt (key=value), *.prom scrapes, daemon.log.
set -euo pipefail

DAEMON=${MW_DAEMON:-}
[ -n "$DAEMON" ] || exit 0
OUT=${MW_OUT:-/vmout}/findings
PORT=19873
mkdir -p "$OUT"
: > "$OUT/results.txt"

now() { cut -d' ' -f1 /proc/uptime; }
log() { printf '[%8s] findings: %s\n' "$(now)" "$*"; }
res() { printf '%s=%s\n' "$1" "$2" >> "$OUT/results.txt"; }
die() { log "FAIL: $*"; res failed "$*"; exit 1; }
trap 'rc=$?; log "FAIL: line $LINENO: $BASH_COMMAND (exit $rc)"' ERR

pid=
cleanup() {
	[ -z "$pid" ] || kill -TERM "$pid" 2>/dev/null || true
	[ -e /dev/md1 ] && mdadm --stop /dev/md1 > /dev/null 2>&1 || true
}
trap cleanup EXIT

scrape() { curl -fsS --max-time 10 "http://127.0.0.1:$PORT/metrics" 2> /dev/null; }
# wait_for SECONDS WHAT COMMAND...: poll until COMMAND succeeds; prints the seconds it took.
wait_for() {
	local limit=$1 what=$2 t0
	shift 2
	t0=$(now)
	until "$@"; do
		awk -v a="$t0" -v b="$(now)" -v l="$limit" 'BEGIN { exit !(b - a > l) }' && { log "timeout: $what"; return 1; }
		sleep 0.5
	done
	awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f\n", b - a }'
}
# The findings in a scrape, "device:finding" sorted, comma-joined ("" for none).
findings() { scrape | sed -n 's/^mergewatch_queue_config_finding{device="\([^"]*\)",finding="\([^"]*\)"} 1$/\1:\2/p' | sort | paste -sd, -; }
findings_are() { [ "$(findings)" = "$1" ]; }

ip link set lo up	# the scenario did; a standalone run (--script) has to
modprobe -a nvme virtio_scsi sd_mod virtio_blk md-mod raid1	# no udev in the guest: nothing loads them on its own
rot=()
V=
disks_up() {
	rot=()
	local d
	for d in /sys/block/sd*; do
		[ -e "$d/device/model" ] && [[ "$(cat "$d/device/model")" == "QEMU HARDDISK"* ]] && rot+=("${d##*/}")	# sysfs pads the model with spaces
	done
	for d in /sys/block/vd*; do
		[ -e "$d/serial" ] && [ "$(cat "$d/serial")" = mwvblk1 ] && V=${d##*/}
	done
	[ "${#rot[@]}" = 2 ] && [ -n "$V" ]
}
wait_for 30 "two QEMU HARDDISK disks and the virtio-blk disk" disks_up > /dev/null ||
	die "no two emulated rotational disks and a virtio-blk disk: $(ls /sys/block)"
A=${rot[0]} B=${rot[1]}
res members "$A,$B"
res vblk "$V"
for d in "$A" "$B" "$V"; do
	res "${d}_rotational" "$(cat /sys/block/$d/queue/rotational)"
	res "${d}_hw_queues" "$(ls /sys/block/$d/mq | wc -l)"
	res "${d}_mq" "$(ls /sys/block/$d/mq | paste -sd, -)"
	res "${d}_scheduler" "$(cat /sys/block/$d/queue/scheduler)"
	res "${d}_driver" "$(basename "$(readlink -f /sys/block/$d/device/driver)")"
done
echo none > /sys/block/$V/queue/scheduler	# what cloud images set on purpose
res "${V}_scheduler_set" "$(cat /sys/block/$V/queue/scheduler)"
mdadm --create /dev/md1 --run --force --assume-clean --level=1 --raid-devices=2 --metadata=1.2 /dev/$A /dev/$B 2>&1
res md_level "$(cat /sys/block/md1/md/level)"
res md_slaves "$(ls /sys/block/md1/slaves | paste -sd, -)"

"$DAEMON" --web.listen-address=127.0.0.1:$PORT --topology.refresh-interval=1s > "$OUT/daemon.log" 2>&1 &
pid=$!
wait_for 240 "the daemon's first scrape" scrape > /dev/null || die "daemon not serving: $(tail -5 "$OUT/daemon.log")"
want="$A:rotational_without_scheduler,$B:rotational_without_scheduler"
t=$(wait_for 15 "both scsi disks named" findings_are "$want") || die "by default: '$(findings)', want '$want'"
sleep 2	# two refreshes more: the virtio-blk disk on none stays unnamed
res findings_default "$(findings)"
res findings_default_seconds "$t"
scrape > "$OUT/default.prom"

log "nomerges=2 on $A under md1"
echo 2 > /sys/block/$A/queue/nomerges
want="$A:merging_disabled_under_stack,$A:rotational_without_scheduler,$B:rotational_without_scheduler"
wait_for 15 "merging_disabled_under_stack on $A" findings_are "$want" > /dev/null || die "after nomerges: '$(findings)'"
res findings_nomerges "$(findings)"

log "mq-deadline and nomerges=0 again"
echo 0 > /sys/block/$A/queue/nomerges
for d in "$A" "$B"; do echo mq-deadline > /sys/block/$d/queue/scheduler; done
t=$(wait_for 15 "no finding left" findings_are "") || die "after mq-deadline: '$(findings)'"
res "${V}_scheduler_end" "$(cat /sys/block/$V/queue/scheduler)"
res findings_deadline "$(findings)"
res findings_deadline_seconds "$t"
scrape > "$OUT/deadline.prom"

kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
pid=
res daemon_exit "$rc"
mdadm --stop /dev/md1 2>&1
res done 1
log "done"
