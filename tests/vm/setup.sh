#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-time (idempotent) host setup for the VM test (tests/vm/run-vm.sh).
#
#   tests/vm/setup.sh [--build-dir DIR] [--no-install] [--kernel 6.1|5.10|6.12]
#
# 1. apt-get installs the host packages the guest needs. The guest runs the
#    host's own userland over 9p, so lvm2, fio, bpftrace ... must be on the host.
# 2. apt-get downloads Debian's kernel package and unpacks it with dpkg -x into
#    DIR/kernel/<package>/ (never installed on the host), then runs depmod on that tree.
#    --kernel 6.1 (default): Debian 12's linux-image-6.1.0-*-amd64, from the host's apt lists.
#    --kernel 5.10: Debian 11's (bullseye) linux-image-5.10.0-*-amd64; --kernel 6.12: Debian
#    13's (trixie) linux-image-6.12.*-amd64. Each from an apt source list of its own in
#    DIR/apt/<suite>/ (apt-get -o Dir::Etc::sourcelist=... -o Dir::State::Lists=...): the
#    host's sources and lists are untouched.
# 3. Builds the initramfs: busybox-static + the virtio/9p/overlay modules (decompressed
#    when the package ships .ko.xz/.ko.zst) + tests/vm/guest-init.sh as /init.
# 4. Writes the env file (KVER, VMLINUZ, MODDIR, INITRD) for run-vm.sh: DIR/vm.env and
#    DIR/initramfs.cpio.gz for 6.1, DIR/vm-<K>.env and DIR/initramfs-<K>.cpio.gz otherwise.
#
# DIR defaults to $MW_VM_DIR or <repo>/build/vm. Nothing is written outside DIR except by apt
# installing the host packages of step 1.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
vmdir=${MW_VM_DIR:-"$repo/build/vm"}
install_pkgs=1
kernel=${MW_VM_KERNEL:-6.1}

while [ $# -gt 0 ]; do
	case "$1" in
	--build-dir) vmdir=$2; shift 2 ;;
	--no-install) install_pkgs=0; shift ;;
	--kernel) kernel=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
	*) echo "setup.sh: unknown argument: $1" >&2; exit 2 ;;
	esac
done

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

# The Debian suite each kernel comes from ("" = the host's own apt lists, Debian 12).
case "$kernel" in
6.1) suite= ;;
5.10) suite=bullseye ;;
6.12) suite=trixie ;;
*) die "--kernel '$kernel': one of 6.1, 5.10, 6.12" ;;
esac

[ "$(id -u)" -eq 0 ] || die "must run as root (apt-get, depmod, cpio of root-owned modules)"
mkdir -p "$vmdir"
vmdir=$(cd "$vmdir" && pwd)

# ---------------------------------------------------------------- packages
# Host packages. The guest sees the host's / read-only, so these are the
# guest's tools as well.
# cryptsetup-bin: LVM on LUKS in guest-who.sh.
pkgs=(qemu-system-x86 busybox-static kmod cpio lvm2 mdadm e2fsprogs fio curl iproute2
      util-linux procps bpftrace gzip xz-utils zstd cryptsetup-bin)

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
# apt options for the kernel's suite: its own source list, lists and archive cache under
# DIR/apt/<suite>/ (no package cache file, the host's sources.list.d ignored).
aptopts=()
if [ -n "$suite" ]; then
	aptdir="$vmdir/apt/$suite"
	mkdir -p "$aptdir/lists/partial"
	key=/usr/share/keyrings/debian-archive-keyring.gpg
	[ -f "$key" ] || die "$key missing (package debian-archive-keyring)"
	cat > "$aptdir/sources.list" <<-EOF
	deb [signed-by=$key] http://deb.debian.org/debian $suite main
	deb [signed-by=$key] http://deb.debian.org/debian-security $suite-security main
	EOF
	aptopts=(-o "Dir::Etc::sourcelist=$aptdir/sources.list" -o Dir::Etc::sourceparts=/dev/null
		-o "Dir::State::Lists=$aptdir/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
		-o APT::Get::List-Cleanup=false)
	# Refreshed at most once a day: the ABI package name moves with point releases only.
	if [ -z "$(find "$aptdir/lists" -maxdepth 1 -name '*_Packages' -mtime -1 2>/dev/null)" ]; then
		say "apt-get update for $suite (lists in $aptdir/lists)"
		apt-get -q "${aptopts[@]}" update > "$aptdir/update.log" 2>&1 ||
			{ cat "$aptdir/update.log" >&2; die "apt-get update for $suite failed"; }
	fi
fi
# linux-image-amd64 is the meta package; its dependency names the current ABI
# package (linux-image-6.1.0-NN-amd64), which changes with point releases.
kpkg=$(apt-cache "${aptopts[@]}" depends linux-image-amd64 2>/dev/null |
	awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
[ -n "$kpkg" ] || die "cannot resolve linux-image-amd64 to an ABI package (apt-get update?)"
case "$kpkg" in
"linux-image-$kernel."*) ;;
*) die "linux-image-amd64 of ${suite:-the host apt lists} is $kpkg, not a $kernel kernel" ;;
esac
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
		(cd "$dl" && apt-get -q "${aptopts[@]}" download "$kpkg")
		mv "$dl"/*.deb "$vmdir/cache/"
		rmdir "$dl"
		debs=("$vmdir/cache/${kpkg}_"*.deb)
	fi
	deb=${debs[0]}
	say "dpkg -x $(basename "$deb") -> $kroot"
	rm -rf "$kroot.tmp"
	mkdir -p "$kroot.tmp"
	dpkg -x "$deb" "$kroot.tmp"
	# Debian 13's packages are merged-/usr (usr/lib/modules): a lib -> usr/lib link, as on a
	# merged-/usr system, keeps one path (lib/modules/<kver>) for depmod, modprobe and the guest.
	if [ ! -e "$kroot.tmp/lib" ] && [ -d "$kroot.tmp/usr/lib/modules" ]; then
		ln -s usr/lib "$kroot.tmp/lib"
	fi
	say "depmod -b $kroot $kver"
	depmod -b "$kroot.tmp" "$kver"
	rm -rf "$kroot"
	mv "$kroot.tmp" "$kroot"
fi
# A point release brings a new ABI package: drop the old ones of this series (about 450 MB each).
for d in "$vmdir"/kernel/linux-image-"$kernel".* "$vmdir"/cache/linux-image-"$kernel".*.deb; do
	case "$d" in "$kroot"|"$vmdir/cache/${kpkg}_"*) continue ;; esac
	[ -e "$d" ] && { say "removing stale $d"; rm -rf "$d"; }
done
vmlinuz="$kroot/boot/vmlinuz-$kver"
moddir="$kroot/lib/modules/$kver"

# ---------------------------------------------------------------- initramfs
# Busybox + the modules needed to reach the host root: virtio-pci, 9p over
# virtio, overlayfs. Everything else is loaded later from $moddir inside the
# guest with the host's modprobe.
envfile="$vmdir/vm.env"
initrd="$vmdir/initramfs.cpio.gz"
if [ "$kernel" != 6.1 ]; then
	envfile="$vmdir/vm-$kernel.env"
	initrd="$vmdir/initramfs-$kernel.cpio.gz"
fi
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
		name=${name%.xz}; name=${name%.zst}  # busybox insmod takes plain .ko files only
		grep -qx "$name" "$stage/mods/order" && continue
		case "$path" in
		*.ko.xz) xz -dc "$path" > "$stage/mods/$name" ;;
		*.ko.zst) zstd -qdc "$path" > "$stage/mods/$name" ;;
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

cat > "$envfile.tmp" <<EOF
# written by tests/vm/setup.sh
KPKG=$kpkg
KVER=$kver
VMLINUZ=$vmlinuz
MODDIR=$moddir
INITRD=$initrd
EOF
mv "$envfile.tmp" "$envfile"
say "ready: $(tr '\n' ' ' < "$envfile" | sed 's/# written by tests\/vm\/setup.sh //')"
say "disk used by $vmdir: $(du -sh "$vmdir" | cut -f1)"
