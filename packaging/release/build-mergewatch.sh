#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# build-mergewatch.sh SRC BUILD PREFIX [MAKE-VARIABLE=VALUE...]   (runs inside the build root)
#
# mergewatchd and mergewatch from the tree at SRC with the project Makefile, objects in BUILD (which must
# hold vmlinux.h, mergewatch.bpf.o and mergewatch.skel.h as the host built them, modification times kept, so
# make finds them up to date: the root has no clang or bpftool), libraries from PREFIX (build-deps.sh) and
# the root.
# Debian's hardening flags (as the .deb), libstdc++ and libgcc linked statically, and every library
# statically but glibc's own and libp11-kit (below).
set -eu
[ $# -ge 3 ] || { echo "usage: $0 SRC BUILD PREFIX [VAR=VALUE...]" >&2; exit 2; }
src=$1 build=$2 prefix=$3; shift 3
for f in vmlinux.h mergewatch.bpf.o mergewatch.skel.h; do
	[ -f "$build/$f" ] || { echo "$0: no $build/$f (the host builds it)" >&2; exit 1; }
done

cd "$src"
eval "$(DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --export=sh)"
# PREFIX's headers come first, the root's after: libbpf's UAPI headers are newer than the root's kernel headers.
export CPPFLAGS="$CPPFLAGS -isystem $prefix/include"
export LDFLAGS="$LDFLAGS -static-libstdc++ -static-libgcc -L$prefix/lib -Wl,--as-needed"

# GnuTLS and what it needs, all from the root's static archives (libgnutls28-dev, nettle-dev, libgmp-dev,
# libtasn1-6-dev, libidn2-dev, libunistring-dev).
gnutls='-lgnutls -lhogweed -lnettle -ltasn1 -lidn2 -lunistring -lgmp'
# libp11-kit stays shared: Debian ships no libp11-kit.a (upstream builds it as a shared library only), and
# it is how GnuTLS finds the system's trusted CAs: it loads the trust module the host's own p11-kit
# configuration names, so a certificate check trusts what the host trusts on any distribution.
#   -Wl,-Bstatic -lp11-kit:  /usr/bin/ld: cannot find -lp11-kit
# glibc's libraries (libpthread, libdl, libc, libm) stay shared as well.
shared='-Wl,-Bdynamic -lp11-kit -lpthread -ldl'
daemon_libs="-Wl,-Bstatic -lprometheus-cpp-core -lbpf -lmicrohttpd -lyaml-cpp -lcrypt -lelf $gnutls -lz $shared"
cli_libs="-Wl,-Bstatic -lcurl -lyaml-cpp $gnutls -lz $shared"

# daemon and cli only (the Makefile's `all` would install packages). The BPF side must be up to date: `-q`
# asks make whether the skeleton needs remaking, without remaking it.
mkdir -p "$build/obj"
make -C "$src" -s -q --no-print-directory BUILD="$build" "$build/mergewatch.skel.h" || {
	echo "$0: make would rebuild $build/mergewatch.skel.h here (no clang, bpftool): the host's copies are out of date" >&2
	exit 1
}
exec make -C "$src" -j"$(nproc)" BUILD="$build" PKG_LIBS="$daemon_libs" CLI_PKG_LIBS="$cli_libs" "$@" daemon cli
