#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# PID 1 of the VM test guest (busybox sh in the initramfs built by setup.sh).
#
# Root file system: the host's / (9p tag "hostroot", read-only) as the lower
# layer of an overlayfs whose upper layer is a tmpfs, so the guest runs the
# host's installed binaries (lvm2, fio, bpftrace, the project's daemon) at
# their host paths and may write anywhere without touching the host.
# 9p tag "mwout" is the host's run directory, mounted read-write at /vmout.
#
# Kernel command line parameters (set by run-vm.sh):
#   mw.script=PATH   guest script to run (host path, seen through the 9p root)
#   mw.moddir=PATH   host path of the unpacked kernel's lib/modules/<kver>
#   mw.init=systemd  systemd mode (run-vm.sh --systemd): copy /vmout/rootfs/ (the
#                    `make install` tree, test units and masks staged by run-vm.sh) into
#                    the overlay and switch_root to the host's /lib/systemd/systemd as PID 1.
#                    Its driver unit writes /vmout/exit-status and powers off.
# The script's exit status goes to /vmout/exit-status; then the VM powers off.

PATH=/bin
export PATH
/bin/busybox --install -s /bin

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

say() { echo "mw-init: $*"; }
fail() {
	say "FATAL: $*"
	[ -d /newroot/vmout ] && echo 125 > /newroot/vmout/exit-status
	sync
	poweroff -f
}

script=; moddir=; init=script
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	mw.init=*) init=${arg#mw.init=} ;;
	mw.script=*) script=${arg#mw.script=} ;;
	mw.moddir=*) moddir=${arg#mw.moddir=} ;;
	esac
done
kver=$(uname -r)
say "kernel $kver, uptime $(cut -d' ' -f1 /proc/uptime)s"

while read -r m; do
	insmod "/mods/$m" || fail "insmod $m"
done < /mods/order

# msize 256 KiB: fewer 9p round trips than the 8 KiB default (TCG makes each one slow).
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /lower ||
	fail "mount 9p hostroot"
mount -t tmpfs -o mode=0755 ovl /ovl || fail "mount tmpfs"
mkdir -p /ovl/upper /ovl/work
mount -t overlay -o lowerdir=/lower,upperdir=/ovl/upper,workdir=/ovl/work overlay /newroot ||
	fail "mount overlay"

# Fresh kernel file systems inside the new root. Moving the initramfs ones
# would leave the host's /proc (seen through 9p) visible in places.
r=/newroot
mount -t proc proc $r/proc
mount -t sysfs sys $r/sys
mount -t devtmpfs dev $r/dev
mkdir -p $r/dev/pts $r/dev/shm
mount -t devpts devpts $r/dev/pts
mount -t tmpfs shm $r/dev/shm
ln -sf /proc/self/fd $r/dev/fd          # bash process substitution needs /dev/fd
ln -sf /proc/self/fd/0 $r/dev/stdin
ln -sf /proc/self/fd/1 $r/dev/stdout
ln -sf /proc/self/fd/2 $r/dev/stderr
# /tmp stays the overlay's (writable, the host's files visible beneath): a checkout under /tmp,
# as CI makes one, must stay reachable for the scenario scripts and the daemon.
mount -t tmpfs run $r/run
mkdir -p $r/run/lock
mount -t tracefs tracefs $r/sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs $r/sys/kernel/debug 2>/dev/null
mount -t bpf bpf $r/sys/fs/bpf 2>/dev/null
mount -t cgroup2 cgroup2 $r/sys/fs/cgroup 2>/dev/null

# The guest kernel's modules, from the unpacked package on the host.
[ -n "$moddir" ] && [ -d "$r$moddir" ] || fail "module dir '$moddir' not visible in the guest"
mkdir -p "$r/lib/modules/$kver"
mount --bind "$r$moddir" "$r/lib/modules/$kver" || fail "bind modules"

mkdir -p $r/vmout
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 mwout $r/vmout || fail "mount 9p mwout"

if [ "$init" = systemd ]; then
	# systemd finds proc, sys, dev, run and cgroup2 already mounted (fresh ones,
	# as above) and keeps them, as after an initrd. The overlay's upper layer is
	# writable: the units staged by run-vm.sh go into it.
	[ -d $r/vmout/rootfs ] || fail "no /vmout/rootfs staged by run-vm.sh --systemd"
	cp -a $r/vmout/rootfs/. $r/ || fail "copy /vmout/rootfs into the new root"
	# The host is a container: its /.dockerenv, seen through 9p, would make systemd
	# believe it runs in docker (and skip units as in a container). This is a VM.
	rm -f $r/.dockerenv
	# /etc/machine-id stays the host's: an empty one would make this a "first boot"
	# (systemd-firstboot, preset-all over 9p), which costs time under TCG.
	say "root ready at $(cut -d' ' -f1 /proc/uptime)s, switch_root to systemd"
	umount /proc /sys 2>/dev/null
	umount -l /dev 2>/dev/null
	exec switch_root $r /lib/systemd/systemd systemd.unit=mergewatch-vmtest.target
	fail "switch_root"
fi

[ -n "$script" ] || fail "no mw.script= on the kernel command line"
say "root ready at $(cut -d' ' -f1 /proc/uptime)s, running $script"

# shellcheck disable=SC3040  # busybox ash has pipefail
set -o pipefail
chroot $r /usr/bin/env -i \
	PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	HOME=/root TERM=dumb LANG=C.UTF-8 MW_OUT=/vmout \
	/bin/bash -c 'set -a; [ -f /vmout/guest.env ] && . /vmout/guest.env; set +a; exec /bin/bash "$0"' \
	"$script" < /dev/null 2>&1 | tee $r/vmout/guest.log
rc=$?
say "script exit status $rc at $(cut -d' ' -f1 /proc/uptime)s"
echo $rc > $r/vmout/exit-status
sync
poweroff -f
