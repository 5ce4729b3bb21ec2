#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# make-root.sh DIR SUITE MIRROR SOURCE-SUITE PACKAGES
#
# The roots `make release` builds in and tests with, made with debootstrap from Debian's archive:
#   DIR/SUITE        a pristine `--variant=minbase` root: what a minimal install of SUITE has (the release
#                    binaries are run and `ldd`-checked there; nothing is ever installed into it)
#   DIR/SUITE-build  a copy of it with PACKAGES (the compilers and -dev packages) installed and a deb-src
#                    line for SOURCE-SUITE, whose source packages the libraries SUITE lacks are built from
# Both are made under temporary names and renamed when complete. The minbase root is reused while SUITE and
# MIRROR stay (DIR/SUITE.facts); the build root is remade from it on every call. Root only.
set -eu
[ $# -eq 5 ] || { echo "usage: $0 DIR SUITE MIRROR SOURCE-SUITE PACKAGES" >&2; exit 2; }
dir=$1 suite=$2 mirror=$3 source_suite=$4 packages=$5
here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" = 0 ] || { echo "$0: debootstrap and chroot need root" >&2; exit 1; }

# Never delete a tree something is mounted under (a bind of /dev there would take the host's /dev).
remove_tree() {
	[ -e "$1" ] || return 0
	abs=$(realpath "$1")
	if awk -v p="$abs/" '{ if (index($5 "/", p) == 1) found = 1 } END { exit !found }' /proc/self/mountinfo; then
		echo "$0: something is mounted under $abs; not removing it (umount it first)" >&2
		exit 1
	fi
	rm -rf "$abs"
}

mkdir -p "$dir"
minbase=$dir/$suite build=$dir/$suite-build
remove_tree "$minbase.tmp"; remove_tree "$build.tmp"

# The minbase root is made once per suite and mirror (its facts file), whatever the package list.
if [ "$(cat "$minbase.facts" 2>/dev/null)" = "$suite $mirror" ] && [ -x "$minbase/bin/sh" ]; then
	echo "make-root: reusing $minbase"
else
	# debootstrap mounts proc and sys in the target itself: in a private mount namespace they cannot
	# outlive it.
	echo "make-root: debootstrap --variant=minbase $suite from $mirror (log: $dir/debootstrap.log)"
	rm -f "$minbase.facts"
	if ! unshare --mount --propagation private -- \
		debootstrap --variant=minbase "$suite" "$minbase.tmp" "$mirror" > "$dir/debootstrap.log" 2>&1; then
		tail -n 30 "$dir/debootstrap.log" >&2
		echo "$0: debootstrap failed; log in $dir/debootstrap.log" >&2
		exit 1
	fi
	rm -rf "$minbase.tmp/var/cache/apt/archives/"*.deb
	remove_tree "$minbase"
	mv "$minbase.tmp" "$minbase"
	echo "$suite $mirror" > "$minbase.facts"
fi
cp -a "$minbase" "$build.tmp"

# The build root: no services start in it; the source suite's sources, never its binaries.
printf '#!/bin/sh\nexit 101\n' > "$build.tmp/usr/sbin/policy-rc.d"
chmod 0755 "$build.tmp/usr/sbin/policy-rc.d"
printf 'deb-src %s %s main\n' "$mirror" "$source_suite" > "$build.tmp/etc/apt/sources.list.d/$source_suite-src.list"
echo "make-root: installing the build packages in $build (log: $dir/apt.log)"
if ! "$here/chroot-run.sh" "$build.tmp" -- sh -ec "
	apt-get update -q
	apt-get install -y -q --no-install-recommends $packages
	apt-get clean" > "$dir/apt.log" 2>&1; then
	tail -n 30 "$dir/apt.log" >&2
	echo "$0: installing the build packages failed; log in $dir/apt.log" >&2
	exit 1
fi
remove_tree "$build"
mv "$build.tmp" "$build"
echo "make-root: $minbase ($(du -sm "$minbase" | cut -f1) MB) and $build ($(du -sm "$build" | cut -f1) MB)"
