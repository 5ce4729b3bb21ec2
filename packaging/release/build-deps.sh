#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# build-deps.sh PREFIX WORKDIR SOURCE=VERSION...   (runs inside the build root, made by make-root.sh)
#
# Builds the libraries the build root's suite lacks at the version the code needs, from the source
# packages of the suite named by its deb-src line (apt-get source, the exact versions given), as static
# archives (and headers) under PREFIX. One function per source package; each logs to WORKDIR/NAME.log.
set -eu
[ $# -ge 3 ] || { echo "usage: $0 PREFIX WORKDIR SOURCE=VERSION..." >&2; exit 2; }
prefix=$1 work=$2; shift 2
jobs=$(nproc)
export CFLAGS='-O2 -g -fPIC' CXXFLAGS='-O2 -g -fPIC'
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig

# The source tree of NAME=VERSION in $work/NAME, downloaded and unpacked (Debian's patches applied).
unpack() {
	name=$1 version=$2
	rm -rf "$work/$name" "$work/$name.dl"
	mkdir -p "$work/$name.dl"
	if ! (cd "$work/$name.dl" && apt-get source -q --download-only --only-source "$name=$version"); then
		echo "build-deps: $name $version is not in the archive's sources any more;" \
			"versions there: $(apt-cache showsrc "$name" | sed -n 's/^Version: //p' | tr '\n' ' ')" \
			"(update the pin in mk/release.mk)" >&2
		exit 1
	fi
	dpkg-source -x "$work/$name.dl/"*.dsc "$work/$name" > /dev/null
	rm -rf "$work/$name.dl"
}

build_libbpf() {
	# BUILD_STATIC_ONLY: libbpf.a alone. The UAPI headers it was written against go beside it
	# (include/linux/bpf.h etc.): the root's kernel headers are older. OBJDIR made first: with -j its
	# libbpf.pc rule can run before the rule that makes the directory.
	mkdir -p "$work/libbpf/obj"
	make -C "$work/libbpf/src" -j"$jobs" BUILD_STATIC_ONLY=y OBJDIR="$work/libbpf/obj" \
		PREFIX="$prefix" LIBDIR="$prefix/lib" install install_uapi_headers
}

build_prometheus_cpp() {
	# The core library only (the daemon serves HTTP itself; no civetweb, no push, no zlib).
	cmake -S "$work/prometheus-cpp" -B "$work/prometheus-cpp/obj" -DCMAKE_BUILD_TYPE=Release \
		-DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib -DBUILD_SHARED_LIBS=OFF \
		-DCMAKE_POSITION_INDEPENDENT_CODE=ON -DENABLE_PULL=OFF -DENABLE_PUSH=OFF -DENABLE_COMPRESSION=OFF \
		-DENABLE_TESTING=OFF -DUSE_THIRDPARTY_LIBRARIES=OFF -DGENERATE_PKGCONFIG=ON
	cmake --build "$work/prometheus-cpp/obj" -j"$jobs"
	cmake --install "$work/prometheus-cpp/obj"
}

build_libmicrohttpd() {
	# HTTPS through GnuTLS (the root's static libgnutls); no documentation, examples or tests.
	cd "$work/libmicrohttpd"
	./configure -q --prefix="$prefix" --libdir="$prefix/lib" --disable-shared --enable-static --enable-https \
		--with-gnutls --disable-doc --disable-examples --disable-curl --disable-nls
	make -j"$jobs"
	make install
}

build_zlib() {
	# Static only. bullseye's 1.2.11 would do, but 1.2.12 rewrote crc32 (braided): with it a gzip scrape of
	# the static daemon cost 6-17% more CPU than the .deb's (bookworm's 1.2.13) in A/B runs (BENCHMARKS.md).
	cd "$work/zlib"
	./configure --static --prefix="$prefix" --libdir="$prefix/lib"
	make -j"$jobs" libz.a
	make install
}

build_curl() {
	# The CLI's client: HTTP and HTTPS (GnuTLS) only, gzip through zlib; no other protocol, no IDN, PSL,
	# HTTP/2, brotli, zstd or SSH. Trust: GnuTLS's system trust (p11-kit's trust module of the host it
	# runs on), not a CA bundle path of the build root.
	cd "$work/curl"
	./configure -q --prefix="$prefix" --libdir="$prefix/lib" --disable-shared --enable-static \
		--with-gnutls --without-openssl --with-zlib --without-ca-bundle --without-ca-path --with-ca-fallback \
		--disable-ftp --disable-file --disable-ldap --disable-ldaps --disable-rtsp --disable-dict \
		--disable-telnet --disable-tftp --disable-pop3 --disable-imap --disable-smb --disable-smtp \
		--disable-gopher --disable-mqtt --disable-manual --disable-docs --disable-ntlm --disable-alt-svc \
		--without-libpsl --without-libidn2 --without-nghttp2 --without-nghttp3 --without-ngtcp2 \
		--without-brotli --without-zstd --without-librtmp --without-libssh2 --without-libgsasl
	make -C lib -j"$jobs"
	make -C lib install
	make -C include install
	make install-pkgconfigDATA
}

build_cli11() {
	# Header-only.
	mkdir -p "$prefix/include"
	cp -r "$work/cli11/include/CLI" "$prefix/include/"
}

mkdir -p "$work" "$prefix/lib"
for spec; do
	name=${spec%%=*} version=${spec#*=}
	echo "build-deps: $name $version (log in the build root: $work/$name.log)"
	( unpack "$name" "$version" ) > "$work/$name.log" 2>&1 || { tail -n 20 "$work/$name.log" >&2; exit 1; }
	if ! ( "build_$(echo "$name" | tr - _)" ) >> "$work/$name.log" 2>&1; then
		tail -n 40 "$work/$name.log" >&2
		echo "build-deps: building $name failed; log in the build root: $work/$name.log" >&2
		exit 1
	fi
done
rm -f "$prefix"/lib/*.la
