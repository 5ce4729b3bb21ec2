#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# chroot-run.sh ROOT [-b HOSTDIR:DIR[:ro]]... -- COMMAND [ARG...]
#
# Runs COMMAND inside the root file system ROOT (a debootstrap root) with fresh proc and sysfs, a bind of
# /dev and the binds given with -b (DIR is a path inside ROOT, made if missing). Everything runs in a
# private mount namespace (unshare --mount): the mounts are never seen outside and die with the command
# even if it is killed; they are also unmounted explicitly on every exit path. Root only.
# The environment inside is clean: PATH, HOME, LANG=C.UTF-8 and DEBIAN_FRONTEND (pass more with env VAR=...).
set -eu

if [ -z "${MW_CHROOT_NAMESPACE:-}" ]; then
	MW_CHROOT_NAMESPACE=1 exec unshare --mount --propagation private -- /bin/sh "$0" "$@"
fi

usage() { echo "usage: $0 ROOT [-b HOSTDIR:DIR[:ro]]... -- COMMAND [ARG...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
root=$(realpath "$1"); shift
[ -x "$root/bin/sh" ] || { echo "$0: $root is not a root file system (no /bin/sh)" >&2; exit 2; }

mounted=''
cleanup() {
	for m in $mounted; do umount "$m" 2>/dev/null || umount -l "$m" || true; done
	mounted=''
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# Mounted in order; $mounted lists them newest first, the order to unmount.
mount_at() {  # mount_at TARGET MOUNT-ARGS...
	target=$1; shift
	mkdir -p "$target"
	mount "$@" "$target"
	mounted="$target $mounted"
}

mount_at "$root/proc" -t proc proc
mount_at "$root/sys" -t sysfs sysfs
mount_at "$root/dev" --bind /dev

while [ $# -gt 0 ]; do
	case $1 in
	-b)
		[ $# -ge 2 ] || usage
		spec=$2; shift 2
		src=${spec%%:*}; rest=${spec#*:}; dst=${rest%%:*}; opt=''
		[ "$rest" = "$dst" ] || opt=${rest#*:}
		mount_at "$root$dst" --bind "$src"
		[ "$opt" != ro ] || mount -o remount,bind,ro "$root$dst"
		;;
	--) shift; break ;;
	*) usage ;;
	esac
done
[ $# -ge 1 ] || usage

# Names resolve inside as they do here (apt needs the mirror).
if [ -f /etc/resolv.conf ] && [ ! -L "$root/etc/resolv.conf" ]; then cp /etc/resolv.conf "$root/etc/resolv.conf"; fi

status=0
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
	DEBIAN_FRONTEND=noninteractive chroot "$root" "$@" || status=$?
exit $status
