#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The capture of `mergewatch status` in docs/operations.md ("On call") during the 2019 incident, as a guest script for the VM harness:
#   tests/vm/run-vm.sh --out build/vm/status-capture --script docs/status_capture_vm.sh   (root; about 10 min under TCG)
# It runs build/mergewatchd and build/mergewatch of the checkout it lives in, and writes
# status-collapse.txt/.json/.err (the exit status), daemon.log and capture.log to the run dir.
set -u
OUT=${MW_OUT:-/vmout}
REPO=${MW_REPO:-$(cd "$(dirname "$0")/.." && pwd)}	# the guest sees the host's paths
CLI=$REPO/build/mergewatch
DAEMON=$REPO/build/mergewatchd
log() { printf '[%8s] %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$*" | tee -a $OUT/capture.log; }
ip link set lo up
modprobe -a nvme dm-mod dm-snapshot ext4
for i in $(seq 150); do [ -b /dev/nvme0n1 ] && break; sleep 0.2; done
export DM_DISABLE_UDEV=1 LVM_SUPPRESS_FD_WARNINGS=1
C='activation { monitoring = 0 udev_sync = 0 udev_rules = 0 } devices { obtain_device_list_from_udev = 0 use_devicesfile = 0 }'
lvm pvcreate --config "$C" -q -y -ff /dev/nvme0n1
lvm vgcreate --config "$C" -q vg0 /dev/nvme0n1
lvm lvcreate --config "$C" -q -y -L 200M -n origin vg0
mkfs.ext4 -q -F -b 4096 /dev/vg0/origin
mkdir -p /mnt/origin /mnt/snap
mount /dev/vg0/origin /mnt/origin
dd if=/dev/zero of=/mnt/origin/data bs=1M count=96 conv=fsync status=none
umount /mnt/origin
lvm lvcreate --config "$C" -q -y -s -n snap -l 100%ORIGIN vg0/origin
mount -o ro /dev/vg0/snap /mnt/snap
echo 2 > /sys/block/nvme0n1/queue/nomerges
log "stack: $(lsblk -no NAME /dev/nvme0n1 | tr '\n' ' ')"
$DAEMON --web.listen-address=127.0.0.1:9863 > $OUT/daemon.log 2>&1 &
dpid=$!
for i in $(seq 300); do grep -q 'msg="ready:' $OUT/daemon.log && break; sleep 0.2; done
( while :; do echo 3 > /proc/sys/vm/drop_caches; cat /mnt/snap/data > /dev/null; done ) &
rpid=$!
for i in $(seq 120); do
	curl -fsS http://127.0.0.1:9863/metrics | grep -q '^mergewatch_merge_collapse{.*} 1$' && break
	sleep 1
done
log "raised after $i polls"
$CLI status > $OUT/status-collapse.txt 2> $OUT/status-collapse.err; echo "rc=$?" >> $OUT/status-collapse.err
$CLI status --json > $OUT/status-collapse.json 2>/dev/null
kill $rpid; wait $rpid 2>/dev/null
kill $dpid; wait $dpid
echo 0 > /sys/block/nvme0n1/queue/nomerges
log "done"
