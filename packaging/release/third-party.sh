#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# third-party.sh OUTDIR DEPS-WORKDIR PACKAGE...   (runs inside the build root)
#
# The copyright files of everything linked statically into the release binaries, as OUTDIR/SOURCE.copyright,
# and OUTDIR/SOURCES: one line per Debian source package and version (where its corresponding source is).
# PACKAGE...: the root's -dev packages whose static archives (or headers) were linked; DEPS-WORKDIR: the
# source trees build-deps.sh built (their debian/copyright and debian/changelog).
set -eu
[ $# -ge 2 ] || { echo "usage: $0 OUTDIR DEPS-WORKDIR PACKAGE..." >&2; exit 2; }
out=$1 work=$2; shift 2
rm -rf "$out"; mkdir -p "$out"
suite=$(. /etc/os-release && echo "Debian $VERSION_ID ($VERSION_CODENAME)")
{
	echo "Linked into mergewatchd and mergewatch (statically), by Debian source package and version."
	echo "The sources are Debian's: apt-get source NAME=VERSION, or https://snapshot.debian.org/package/NAME/VERSION/"
	echo
} > "$out/SOURCES"
for pkg; do
	src=$(dpkg-query -W -f '${source:Package}' "$pkg")
	version=$(dpkg-query -W -f '${source:Version}' "$pkg")
	cp -L "/usr/share/doc/$pkg/copyright" "$out/$src.copyright"
	echo "$src $version ($suite, binary package $pkg)" >> "$out/SOURCES"
done
for tree in "$work"/*/debian; do
	[ -f "$tree/copyright" ] || continue
	src=$(dpkg-parsechangelog -l "$tree/changelog" -S Source)
	version=$(dpkg-parsechangelog -l "$tree/changelog" -S Version)
	cp "$tree/copyright" "$out/$src.copyright"
	echo "$src $version (its source package, built statically in the $suite build root)" >> "$out/SOURCES"
done
