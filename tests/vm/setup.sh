#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-time (idempotent) host setup for the VM test (tests/vm/run-vm.sh).
#
#   tests/vm/setup.sh [--build-dir DIR] [--no-install]
#
# 1. apt-get installs the host packages the guest needs. The guest runs the
#    host's own userland over 9p, so lvm2, fio, bpftrace ... must be on the host.
# 2. apt-get downloads Debian's linux-image-6.1 package and unpacks it with
#    dpkg -x into DIR/kernel/<package>/ (never installed on the host), then runs
#    depmod on that tree.
# 3. Builds DIR/initramfs.cpio.gz: busybox-static + the virtio/9p/overlay
#    modules + tests/vm/guest-init.sh as /init.
# 4. Writes DIR/vm.env (KVER, VMLINUZ, MODDIR, INITRD) for run-vm.sh.
#
# DIR defaults to $MW_VM_DIR or <repo>/build/vm. Nothing is written outside DIR except by apt.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
vmdir=${MW_VM_DIR:-"$repo/build/vm"}
install_pkgs=1

while [ $# -gt 0 ]; do
	case "$1" in
	--build-dir) vmdir=$2; shift 2 ;;
	--no-install) install_pkgs=0; shift ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
	*) echo "setup.sh: unknown argument: $1" >&2; exit 2 ;;
	esac
done

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (apt-get, depmod, cpio of root-owned modules)"
mkdir -p "$vmdir"
vmdir=$(cd "$vmdir" && pwd)

# ---------------------------------------------------------------- packages
# Host packages. The guest sees the host's / read-only, so these are the
# guest's tools as well.
pkgs=(qemu-system-x86 busybox-static kmod cpio lvm2 mdadm e2fsprogs fio curl iproute2
      util-linux procps bpftrace gzip)

missing=()
for p in "${pkgs[@]}"; do
	st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$st" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	[ "$install_pkgs" -eq 1 ] || die "missing packages: ${missing[*]} (rerun without --no-install)"
	say "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}"
else
	say "packages present: ${pkgs[*]}"
fi

# ---------------------------------------------------------------- kernel
# linux-image-amd64 is the meta package; its dependency names the current ABI
# package (linux-image-6.1.0-NN-amd64), which changes with point releases.
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
	awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
[ -n "$kpkg" ] || die "cannot resolve linux-image-amd64 to an ABI package (apt-get update?)"
kver=${kpkg#linux-image-}
kroot="$vmdir/kernel/$kpkg"

if [ -f "$kroot/boot/vmlinuz-$kver" ] && [ -f "$kroot/lib/modules/$kver/modules.dep" ]; then
	say "kernel $kpkg already unpacked in $kroot"
else
	mkdir -p "$vmdir/cache"
	debs=("$vmdir/cache/${kpkg}_"*.deb)
	if [ ! -f "${debs[0]}" ]; then
		say "apt-get download $kpkg (not installed; unpacked only)"
		# apt drops privileges to _apt for downloads; give it a directory it may write.
		dl=$(mktemp -d "$vmdir/cache/dl.XXXXXX")
		chown _apt "$dl" 2>/dev/null || true
		(cd "$dl" && apt-get download -q "$kpkg")
		mv "$dl"/*.deb "$vmdir/cache/"
		rmdir "$dl"
		debs=("$vmdir/cache/${kpkg}_"*.deb)
	fi
	deb=${debs[0]}
	say "dpkg -x $(basename "$deb") -> $kroot"
	rm -rf "$kroot.tmp"
	mkdir -p "$kroot.tmp"
	dpkg -x "$deb" "$kroot.tmp"
	say "depmod -b $kroot $kver"
	depmod -b "$kroot.tmp" "$kver"
	rm -rf "$kroot"
	mv "$kroot.tmp" "$kroot"
fi
# A point release brings a new ABI package: drop the old ones (about 450 MB each).
for d in "$vmdir"/kernel/linux-image-* "$vmdir"/cache/linux-image-*.deb; do
	case "$d" in "$kroot"|"$vmdir/cache/${kpkg}_"*) continue ;; esac
	[ -e "$d" ] && { say "removing stale $d"; rm -rf "$d"; }
done
vmlinuz="$kroot/boot/vmlinuz-$kver"
moddir="$kroot/lib/modules/$kver"

# ---------------------------------------------------------------- initramfs
# Busybox + the modules needed to reach the host root: virtio-pci, 9p over
# virtio, overlayfs. Everything else is loaded later from $moddir inside the
# guest with the host's modprobe.
initrd="$vmdir/initramfs.cpio.gz"
# Rebuilt when missing, when the kernel package changed, or when init/busybox is newer.
need_initrd=1
if [ -f "$initrd" ] && [ "$(cat "$initrd.kpkg" 2>/dev/null)" = "$kpkg" ] &&
   [ ! "$here/guest-init.sh" -nt "$initrd" ] && [ ! /usr/bin/busybox -nt "$initrd" ]; then
	need_initrd=0
fi
if [ "$need_initrd" -eq 1 ]; then
	say "building $initrd"
	stage=$(mktemp -d "$vmdir/initramfs.XXXXXX")
	trap 'rm -rf "$stage"' EXIT
	mkdir -p "$stage"/{bin,dev,proc,sys,mods,lower,ovl,newroot}
	cp /usr/bin/busybox "$stage/bin/busybox"
	ln -s busybox "$stage/bin/sh"
	install -m 0755 "$here/guest-init.sh" "$stage/init"
	: > "$stage/mods/order"
	# --show-depends prints "insmod /path/x.ko" in load order (deps first),
	# or "builtin x" for built-in ones.
	modprobe -d "$kroot" -S "$kver" -a --show-depends \
		virtio_pci 9pnet_virtio 9p overlay |
	while read -r kind path _; do
		[ "$kind" = insmod ] || continue
		name=$(basename "$path")
		grep -qx "$name" "$stage/mods/order" && continue
		case "$name" in
		*.ko.xz) xz -dc "$path" > "$stage/mods/${name%.xz}"; name=${name%.xz} ;;
		*.ko.zst) zstd -qdc "$path" > "$stage/mods/${name%.zst}"; name=${name%.zst} ;;
		*) cp "$path" "$stage/mods/$name" ;;
		esac
		echo "$name" >> "$stage/mods/order"
	done
	[ -s "$stage/mods/order" ] || die "no initramfs modules resolved (is virtio_pci built in?)"
	say "initramfs modules: $(tr '\n' ' ' < "$stage/mods/order")"
	(cd "$stage" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$initrd.tmp"
	mv "$initrd.tmp" "$initrd"
	echo "$kpkg" > "$initrd.kpkg"
	rm -rf "$stage"
	trap - EXIT
else
	say "initramfs up to date: $initrd"
fi

cat > "$vmdir/vm.env.tmp" <<EOF
# written by tests/vm/setup.sh
KPKG=$kpkg
KVER=$kver
VMLINUZ=$vmlinuz
MODDIR=$moddir
INITRD=$initrd
EOF
mv "$vmdir/vm.env.tmp" "$vmdir/vm.env"
say "ready: $(tr '\n' ' ' < "$vmdir/vm.env" | sed 's/# written by tests\/vm\/setup.sh //')"
say "disk used by $vmdir: $(du -sh "$vmdir" | cut -f1)"
