#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Guest side: a native NVMe multipath path controller goes away while its head lives (
# point 4). Called at the end of guest-stacking.sh in the scenario boot (run-vm.sh --multipath --path-removal), or
# alone: run-vm.sh --multipath --script tests/vm/guest-multipath.sh --daemon ... --metrics-url ...
#   The head (serial mwmp01) reads with the round-robin I/O policy, so both path disks count requests;
#   a scrape; one path's controller is deleted (delete_controller where the transport has it, which
#   fabrics do; PCIe has none, so the controller's PCI function is removed, as a hot-unplug); scrapes
#   every half second while the daemon notices and forgets the path's keys; the head reads more through
#   the remaining path; a scrape. test_vm_multipath.py: every counter of every device is monotonic over
#   the scrapes, and the head's request count after the deletion grew by what the remaining path's
#   /sys/block stat added.
# Output in $MW_OUT/mpdelete/: results.txt (key=value), scrape-NN-WHEN.prom in order, stat files,
# daemon.log. Leaves the subsystem with one path (the scenario is done with it).
set -euo pipefail

DAEMON=${MW_DAEMON:-}
[ -n "$DAEMON" ] || exit 0   # diskstats-only runs have no daemon to check
[ "${MW_MULTIPATH:-0}" = 1 ] || exit 0
OUT=${MW_OUT:-/vmout}/mpdelete
PORT=19875
mkdir -p "$OUT"
: > "$OUT/results.txt"

now() { cut -d' ' -f1 /proc/uptime; }
log() { printf '[%8s] mpdelete: %s\n' "$(now)" "$*"; }
res() { printf '%s=%s\n' "$1" "$2" >> "$OUT/results.txt"; }
die() { log "FAIL: $*"; res failed "$*"; exit 1; }
trap 'rc=$?; log "FAIL: line $LINENO: $BASH_COMMAND (exit $rc)"' ERR

pid=
cleanup() { [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true; }
trap cleanup EXIT

. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/guest-lib.sh"	# disk_by_serial
url="http://127.0.0.1:$PORT/metrics"
n=0
scrape() {	# scrape WHEN: the next numbered scrape
	n=$((n + 1))
	curl -fsS --max-time 10 -o "$OUT/scrape-$(printf %02d $n)-$1.prom" "$url"
}
# The head's completed read requests in the last scrape.
head_reads() {
	awk -v s="mergewatch_request_size_bytes_count{device=\"$HEAD\",op=\"read\"}" '$1 == s { print $2 }' \
		"$(ls "$OUT"/scrape-*.prom | tail -1)"
}

ip link set lo up	# the scenario did; alone (--script) this script must
modprobe nvme	# loaded already in the scenario; alone, nothing else loads it (no udev in the guest)
[ "$(cat /sys/module/nvme_core/parameters/multipath)" = Y ] || die "nvme_core.multipath is off"
HEAD=
for _ in $(seq 1 150); do HEAD=$(disk_by_serial mwmp01) && break; sleep 0.2; done
[ -n "$HEAD" ] || die "no multipath head with serial mwmp01 (run-vm.sh --multipath)"
paths_of_head() {
	local d p
	for d in /sys/block/nvme*c*n*; do
		p=${d##*/}
		[ "${p%%c*}n${p##*n}" = "$HEAD" ] && printf '%s ' "$p"
	done
	return 0
}
# Controllers probe one after the other: the head comes with the first path.
for _ in $(seq 1 150); do PATHS=$(paths_of_head); [ "$(wc -w <<< "$PATHS")" -ge 2 ] && break; sleep 0.2; done
read -r VICTIM SURVIVOR rest <<< "$PATHS"
[ -n "$SURVIVOR" ] && [ -z "$rest" ] || die "head $HEAD has paths '$PATHS', expected two"
ctrl_of() { basename "$(readlink -f "/sys/block/$1/device")"; }
VCTRL=$(ctrl_of "$VICTIM")
res head "$HEAD"
res victim "$VICTIM"
res survivor "$SURVIVOR"
res victim_controller "$VCTRL"
for p in $PATHS; do
	echo none > /sys/block/$p/queue/scheduler
	echo 0 > /sys/block/$p/queue/nomerges
done
# Round robin: each bio takes the next path (the default numa policy sends all of them down one).
echo round-robin > "/sys/block/$HEAD/device/iopolicy"
res iopolicy "$(cat "/sys/block/$HEAD/device/iopolicy")"

"$DAEMON" --web.listen-address=127.0.0.1:$PORT --topology.refresh-interval=1s --log.level=debug > "$OUT/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
	curl -fsS --max-time 5 -o /dev/null "$url" 2>/dev/null && break
	kill -0 "$pid" 2>/dev/null || die "daemon exited during start-up: $(tail -5 "$OUT/daemon.log")"
	sleep 0.2
done
log "daemon up; head $HEAD, paths $VICTIM ($VCTRL) and $SURVIVOR: 8 MiB direct reads, round robin"
dd if=/dev/$HEAD of=/dev/null bs=64k count=128 iflag=direct status=none
sleep 1.5
for p in $PATHS; do cat /sys/block/$p/stat > "$OUT/stat-$p-before-delete.txt"; done
scrape before-delete
res head_reads_before_delete "$(head_reads)"

# The path goes: a fabrics controller has delete_controller (nvme_sysfs_delete); a PCIe one does not
# (the attribute shows only where the transport has a delete_ctrl op), so its PCI function is removed.
if [ -e "/sys/class/nvme/$VCTRL/delete_controller" ]; then
	res method delete_controller
	echo 1 > "/sys/class/nvme/$VCTRL/delete_controller"
else
	pci=$(readlink -f "/sys/class/nvme/$VCTRL/device")
	res method "pci_remove ${pci##*/}"
	echo 1 > "$pci/remove"
fi
for _ in $(seq 1 100); do [ -e "/sys/block/$VICTIM" ] || break; sleep 0.1; done
[ ! -e "/sys/block/$VICTIM" ] || die "path disk $VICTIM still present after its controller went"
[ -e "/sys/block/$HEAD/dev" ] || die "head $HEAD went with one of its two paths"
log "$VICTIM gone with $VCTRL; $HEAD lives on $SURVIVOR"
for i in 1 2 3 4 5 6; do
	sleep 0.5
	scrape "during-$i"
done
for _ in $(seq 1 100); do grep -q 'multipath path disk went away' "$OUT/daemon.log" && break; sleep 0.2; done
res carried "$(grep -c 'multipath path disk went away' "$OUT/daemon.log" || true)"
res dropped "$(grep -c 'dropped the data of removed devices' "$OUT/daemon.log" || true)"
scrape after-forget
res head_reads_after_forget "$(head_reads)"

# More reads, through the one path left: the head counts exactly what its stat adds.
cat /sys/block/$SURVIVOR/stat > "$OUT/stat-survivor-before-read.txt"
dd if=/dev/$HEAD of=/dev/null bs=64k count=64 skip=128 iflag=direct status=none
cat /sys/block/$SURVIVOR/stat > "$OUT/stat-survivor-after-read.txt"
sleep 1.5
scrape after-read
res head_reads_after_read "$(head_reads)"

kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
pid=
res daemon_exit "$rc"
res scrapes "$n"
res done 1
log "done"
