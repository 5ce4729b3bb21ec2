# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by guest-scenario.sh when run-vm.sh --release TARBALL --release-root ROOT gave a release: the
# tarball's binaries run inside a Debian 11 userland, never the guest's (the host's) own. Defines functions
# only; they use guest-scenario.sh's log, die, wait_for, scrape and daemon_start.
#
# ROOT is the pristine bullseye minbase root `make release` made with debootstrap, a host path the guest sees
# through its overlay root: what the guest writes there (the unpacked tarball, the web config, the mounts)
# lands in the guest's tmpfs, the host's copy stays pristine. Inside it the binaries find bullseye's glibc
# (2.31) and nothing of the guest's: ldd in the root proves which libraries they load.
#
# Cases named rel-* run their daemon as `chroot ROOT /opt/RELEASE/mergewatchd` with default flags (it listens
# on :9863, MW_METRICS_URL must be http://127.0.0.1:9863/metrics); a rel-* case that raises also runs the
# release's `mergewatch status` inside the root. release_tls then serves TLS with basic auth from a web config.
# Everything lands in $OUT/release/: facts.txt (key=value, read by test_vm_release.py) and the logs.

RELEASE_TARBALL=${MW_RELEASE_TARBALL:-}
RELEASE_ROOT=${MW_RELEASE_ROOT:-}
RELEASE_BIN=	# the unpacked release's folder, a path inside RELEASE_ROOT
RELEASE_OUT=$OUT/release

release_fact() { printf '%s=%s\n' "$1" "$2" >> "$RELEASE_OUT/facts.txt"; }

# The command prefix that runs a program inside the root: a clean environment, like a unit's.
RELEASE_RUN=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 chroot "$RELEASE_ROOT")

release_prepare() {
	local top b
	mkdir -p "$RELEASE_OUT"; : > "$RELEASE_OUT/facts.txt"
	[ -f "$RELEASE_TARBALL" ] || die "release tarball $RELEASE_TARBALL missing"
	[ -f "$RELEASE_ROOT/etc/debian_version" ] || die "release root $RELEASE_ROOT has no /etc/debian_version"
	top=$(basename "$RELEASE_TARBALL" .tar.gz)	# its one top folder (tests/release checks the layout)
	mkdir -p "$RELEASE_ROOT/opt"
	tar -xzf "$RELEASE_TARBALL" -C "$RELEASE_ROOT/opt" || die "cannot unpack $RELEASE_TARBALL"
	[ -x "$RELEASE_ROOT/opt/$top/mergewatchd" ] || die "$RELEASE_TARBALL has no $top/mergewatchd"
	RELEASE_BIN=/opt/$top
	mountpoint -q "$RELEASE_ROOT/proc" || mount -t proc proc "$RELEASE_ROOT/proc"
	mountpoint -q "$RELEASE_ROOT/sys" || mount -t sysfs sysfs "$RELEASE_ROOT/sys"
	mountpoint -q "$RELEASE_ROOT/dev" || mount --bind /dev "$RELEASE_ROOT/dev"
	release_fact top "$top"
	release_fact debian_version "$(cat "$RELEASE_ROOT/etc/debian_version")"
	release_fact root_glibc "$("${RELEASE_RUN[@]}" ldd --version | sed -n 1p)"
	# The guest's own libbpf (the host's Debian 12 libbpf1) must not be reachable from inside the root.
	release_fact root_has_libbpf "$(find "$RELEASE_ROOT/lib" "$RELEASE_ROOT/usr/lib" -name 'libbpf.so*' 2>/dev/null | wc -l)"
	for b in mergewatchd mergewatch; do
		"${RELEASE_RUN[@]}" ldd "$RELEASE_BIN/$b" > "$RELEASE_OUT/ldd-$b.txt" 2>&1 || die "ldd $b in the release root failed"
		"${RELEASE_RUN[@]}" "$RELEASE_BIN/$b" --version > "$RELEASE_OUT/version-$b.txt" 2>&1 ||
			die "$b --version in the release root failed"
	done
	log "release $top unpacked in $RELEASE_ROOT (Debian $(cat "$RELEASE_ROOT/etc/debian_version"))"
}

# release_status P: the release's `mergewatch status` (default --url, http://localhost:9863) in the root while
# the case's verdict stands: P.status.txt and P.status.exit.
release_status() {
	local rc=0
	"${RELEASE_RUN[@]}" "$RELEASE_BIN/mergewatch" status > "$1.status.txt" 2>&1 || rc=$?
	echo "$rc" > "$1.status.exit"
	log "release mergewatch status: exit $rc"
}

# TLS with basic auth from a web config: a certificate for localhost, user prometheus with a bcrypt hash. The
# release's daemon serves it in the root; curl (the guest's) reads /metrics with the right password, a wrong
# one and none; the release's `mergewatch status` reads /status through a client config (TLS, basic auth).
release_tls() {
	local etc=$RELEASE_ROOT/etc/mergewatch pid code who rc=0
	mkdir -p "$etc"
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=localhost \
		-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout "$etc/tls.key" -out "$etc/tls.crt" \
		> "$RELEASE_OUT/openssl.log" 2>&1 || die "openssl req failed"
	python3 -c 'import bcrypt, sys; print(bcrypt.hashpw(b"s3cret", bcrypt.gensalt(10)).decode())' > "$etc/hash" ||
		die "bcrypt hash failed"
	cat > "$etc/web.yml" <<-EOF
	tls_server_config:
	  cert_file: tls.crt
	  key_file: tls.key
	basic_auth_users:
	  prometheus: $(cat "$etc/hash")
	EOF
	cat > "$etc/client.yml" <<-EOF
	url: https://localhost:9863
	tls_config:
	  ca_file: tls.crt
	basic_auth:
	  username: prometheus
	  password: s3cret
	EOF
	"${RELEASE_RUN[@]}" "$RELEASE_BIN/mergewatchd" --web.config.file=/etc/mergewatch/web.yml \
		> "$RELEASE_OUT/tls-daemon.log" 2>&1 &
	pid=$!
	wait_for 60 "the release's daemon serving TLS" grep -q 'msg="ready:' "$RELEASE_OUT/tls-daemon.log" ||
		{ kill "$pid" 2>/dev/null; tail -n 20 "$RELEASE_OUT/tls-daemon.log"; die "release daemon with TLS not ready"; }
	for who in right:prometheus:s3cret wrong:prometheus:nope none; do
		IFS=: read -r name user pass <<< "$who"
		local auth=()
		[ "$name" = none ] || auth=(-u "$user:$pass")
		code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 --cacert "$etc/tls.crt" "${auth[@]}" \
			https://localhost:9863/metrics) || true
		release_fact "tls_$name" "$code"
	done
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 http://127.0.0.1:9863/metrics) || true
	release_fact tls_plain_http "$code"
	"${RELEASE_RUN[@]}" "$RELEASE_BIN/mergewatch" status --config /etc/mergewatch/client.yml \
		> "$RELEASE_OUT/tls-status.txt" 2>&1 || rc=$?
	release_fact tls_status_exit "$rc"
	kill -TERM "$pid"
	rc=0; wait "$pid" || rc=$?
	release_fact tls_daemon_exit "$rc"
	log "release TLS checks: $(grep '^tls_' "$RELEASE_OUT/facts.txt" | tr '\n' ' ')"
}
