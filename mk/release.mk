# SPDX-License-Identifier: Apache-2.0
# The release tarball: binaries that run on any x86-64 Linux with glibc >= 2.31. Included by the main Makefile.
#
#   make release       $(RELEASE_TARBALL) and $(RELEASE_DIR)/sha256sums.txt
#   make test-release  tests/release: the binaries' NEEDED libraries and glibc symbol versions, and both
#                      run (and `ldd` resolves them) inside a pristine Debian 11 minbase root; the RPM's
#                      payload, scriptlets and rpmlint (builds both first)
#   make rpm           $(RPM): the same payload as an RPM (rpmbuild and rpmlint from Debian's rpm and rpmlint
#                      packages, packaging/mergewatch.spec.in), then rpmlint with Fedora's rules
#                      (packaging/rpmlint.toml; fails on any error)
#
# Built the way a distribution would, in a Debian 11 (bullseye, glibc 2.31) root made with debootstrap from
# Debian's archive and cached under $(RELEASE_DIR)/ (made once, reused; `rm -rf $(RELEASE_DIR)` starts over):
#   $(RELEASE_ROOT)        pristine minbase root, for the tests (nothing is installed into it)
#   $(RELEASE_BUILD_ROOT)  the same plus bullseye's compilers and -dev packages; the libraries bullseye lacks
#                          at the version the code needs are built there from bookworm's source packages
#                          (apt-get source, pinned below) as static archives under $(RELEASE_DEPS_PREFIX)
# The BPF object and its skeleton are built here on the host as for every build (clang, bpftool) and handed
# in with their modification times (vmlinux.h, the object, the skeleton: the root's make finds them up to date
# and recompiles what includes the skeleton when it is newer); the daemon and the CLI are compiled in the root from this tree (bound read-only at /src) with the
# project Makefile, linked with static libstdc++/libgcc and static archives for all but glibc and
# libp11-kit (no static archive exists; packaging/release/build-mergewatch.sh says why it stays shared).
# Never from elsewhere: no binary toolchain or library that is not Debian's.

RELEASE_SUITE        := bullseye
RELEASE_SOURCE_SUITE := bookworm
RELEASE_MIRROR       ?= http://deb.debian.org/debian
RELEASE_DIR          := $(BUILD)/release
RELEASE_ROOT         := $(RELEASE_DIR)/$(RELEASE_SUITE)
RELEASE_BUILD_ROOT   := $(RELEASE_DIR)/$(RELEASE_SUITE)-build
RELEASE_NAME         := mergewatch-$(DEB_VERSION).linux-amd64
RELEASE_TARBALL      := $(RELEASE_DIR)/$(RELEASE_NAME).tar.gz
CHROOT_RUN           := packaging/release/chroot-run.sh

# What the build root gets from bullseye itself.
RELEASE_ROOT_PACKAGES := g++ make pkg-config dpkg-dev xz-utils cmake binutils \
	libelf-dev zlib1g-dev libgnutls28-dev libunistring-dev libyaml-cpp-dev libcrypt-dev nlohmann-json3-dev

# The roots: remade when their facts (suite, mirror, package list) change, else reused.
RELEASE_ROOT_FACTS := $(RELEASE_SUITE)|$(RELEASE_SOURCE_SUITE)|$(RELEASE_MIRROR)|$(RELEASE_ROOT_PACKAGES)
RELEASE_ROOT_STAMP := $(RELEASE_DIR)/roots.stamp

.PHONY: release release-build test-release test-release-run test-privileged-release deps-release release-root release-deps rpm rpm-build deps-rpm

deps-release:
	$(call install_debian_packages,make release,$(RUN_PACKAGES) $(RELEASE_PACKAGES))

release-root:
	@if [ "$$(cat $(RELEASE_ROOT_STAMP) 2>/dev/null)" != '$(RELEASE_ROOT_FACTS)' ]; then \
		rm -f $(RELEASE_ROOT_STAMP); \
		packaging/release/make-root.sh $(RELEASE_DIR) $(RELEASE_SUITE) $(RELEASE_MIRROR) $(RELEASE_SOURCE_SUITE) \
			'$(RELEASE_ROOT_PACKAGES)' && printf '%s\n' '$(RELEASE_ROOT_FACTS)' > $(RELEASE_ROOT_STAMP); \
	else echo 'make release: reusing $(RELEASE_ROOT) and $(RELEASE_BUILD_ROOT)'; fi

# Built in the build root from bookworm's source packages, exact versions: libbpf 1.x (bullseye has 0.3),
# prometheus-cpp (not in bullseye), libmicrohttpd 0.9.75 (bullseye's 0.9.72 lacks MHD_run_wait and
# MHD_create_response_from_buffer_with_free_callback_cls), zlib 1.2.13 (bullseye's 1.2.11 has the slower
# crc32 of before 1.2.12: gzip scrapes cost more), curl 7.88 (static, HTTP(S) only; bullseye's 7.74 lacks
# CURLOPT_PROTOCOLS_STR; built after zlib, against it) and CLI11 2.x (headers; not in bullseye). When the archive has moved
# on from a pin (a security update), the build says which versions it has: update the pin here.
RELEASE_DEPS := libbpf=1.1.2-0+deb12u1 prometheus-cpp=1.0.1-1 libmicrohttpd=0.9.75-6 zlib=1:1.2.13.dfsg-1 \
	curl=7.88.1-10+deb12u15 cli11=2.1.2+ds-1
RELEASE_DEPS_PREFIX := /opt/mergewatch-deps
RELEASE_DEPS_FACTS  = $(RELEASE_DEPS)|$(shell cat $(RELEASE_ROOT_STAMP) 2>/dev/null)|$(shell sha256sum < packaging/release/build-deps.sh)
RELEASE_DEPS_STAMP  := $(RELEASE_DIR)/deps.stamp

release-deps: release-root
	@if [ "$$(cat $(RELEASE_DEPS_STAMP) 2>/dev/null)" != '$(RELEASE_DEPS_FACTS)' ]; then \
		rm -f $(RELEASE_DEPS_STAMP); rm -rf $(RELEASE_BUILD_ROOT)$(RELEASE_DEPS_PREFIX); \
		$(CHROOT_RUN) $(RELEASE_BUILD_ROOT) -b $(CURDIR)/packaging/release:/mnt/release:ro -- \
			/bin/sh /mnt/release/build-deps.sh $(RELEASE_DEPS_PREFIX) /var/tmp/mergewatch-deps $(RELEASE_DEPS) \
			&& printf '%s\n' '$(RELEASE_DEPS_FACTS)' > $(RELEASE_DEPS_STAMP); \
	else echo 'make release: reusing the libraries in $(RELEASE_BUILD_ROOT)$(RELEASE_DEPS_PREFIX)'; fi

# The build root's packages whose static archives or headers go into the binaries (their copyright files and
# versions are shipped in LICENSES/third-party/), besides the libraries build-deps.sh builds.
RELEASE_LINKED_PACKAGES := libgnutls28-dev nettle-dev libgmp-dev libtasn1-6-dev libidn2-dev libunistring-dev \
	libyaml-cpp-dev libcrypt-dev libelf-dev nlohmann-json3-dev libstdc++-10-dev libgcc-10-dev

# The objects and binaries, inside the build root (kept between runs: a rebuild compiles what changed).
RELEASE_OBJ       := /build/mergewatch
RELEASE_STAGE     := $(RELEASE_DIR)/$(RELEASE_NAME)
# The date --version prints: the changelog's, so a release build of one commit is the same bytes each time.
RELEASE_EPOCH     = $(shell dpkg-parsechangelog -l debian/changelog -S Timestamp)
RELEASE_MAKE_VARS = VERSION=$(DEB_VERSION) GIT_BRANCH='$(GIT_BRANCH)' GIT_REVISION='$(GIT_REVISION)' \
	BUILD_DATE=$(shell date -u -d @$(RELEASE_EPOCH) +%Y%m%d-%H:%M:%S) V=$(V)

release: deps-release
	@$(MAKE) --no-print-directory release-build

# The unit in the tarball names mergewatchd without a directory: systemd (>= 239) looks it up in its fixed
# search path, /usr/local/sbin before /usr/sbin, so the same file works with the binary in either.
release-build: release-deps $(SKEL)
	@[ -n "$(DEB_VERSION)" ] || { echo 'make release: no version in debian/changelog' >&2; exit 1; }
	$(call msg,BUILD,$(RELEASE_BUILD_ROOT)$(RELEASE_OBJ))
	$(Q)mkdir -p $(RELEASE_BUILD_ROOT)$(RELEASE_OBJ)
	$(Q)cp -p $(VMLINUX_H) $(RELEASE_BUILD_ROOT)$(RELEASE_OBJ)/vmlinux.h
	$(Q)cp -p $(BPF_OBJ) $(SKEL) $(RELEASE_BUILD_ROOT)$(RELEASE_OBJ)/
	$(Q)$(CHROOT_RUN) $(RELEASE_BUILD_ROOT) -b $(CURDIR):/src:ro -- /bin/sh /src/packaging/release/build-mergewatch.sh \
		/src $(RELEASE_OBJ) $(RELEASE_DEPS_PREFIX) $(RELEASE_MAKE_VARS)
	$(Q)$(CHROOT_RUN) $(RELEASE_BUILD_ROOT) -b $(CURDIR)/packaging/release:/mnt/release:ro -- /bin/sh \
		/mnt/release/third-party.sh $(RELEASE_OBJ)/third-party /var/tmp/mergewatch-deps $(RELEASE_LINKED_PACKAGES)
	$(call msg,STAGE,$(RELEASE_STAGE))
	$(Q)rm -rf $(RELEASE_STAGE) $(RELEASE_STAGE).debug $(RELEASE_TARBALL) $(RELEASE_DIR)/sha256sums.txt
	$(Q)mkdir -p $(RELEASE_STAGE).debug
	$(Q)for b in mergewatchd mergewatch; do \
		objcopy --only-keep-debug $(RELEASE_BUILD_ROOT)$(RELEASE_OBJ)/$$b $(RELEASE_STAGE).debug/$$b.debug && \
		install -D -m 0755 -s --strip-program=strip $(RELEASE_BUILD_ROOT)$(RELEASE_OBJ)/$$b $(RELEASE_STAGE)/$$b || exit 1; \
	done
	$(Q)install -d -m 0755 $(RELEASE_STAGE)/systemd/examples
	$(Q)sed -e 's|^ExecStart=@SBINDIR@/mergewatchd |ExecStart=mergewatchd |' -e '/^Documentation=file:@DOCDIR@/d' \
		-e '/^# `make install` substitutes/,/^# (the Debian package:/c\
# The release tarball'"'"'s copy: ExecStart= names mergewatchd without a directory, which systemd (>= 239)\
# looks up in its fixed search path, /usr/local/sbin before /usr/sbin: the binary may be in either.\
# Install it as /etc/systemd/system/mergewatchd.service (README.md, "Release tarball").' \
		deploy/systemd/mergewatchd.service.in > $(RELEASE_STAGE)/systemd/mergewatchd.service
	$(Q)! grep -n '@[A-Z]*@' $(RELEASE_STAGE)/systemd/mergewatchd.service || \
		{ echo 'make release: a placeholder is left in the unit' >&2; exit 1; }
	$(Q)install -m 0644 deploy/systemd/mergewatchd.socket $(RELEASE_STAGE)/systemd/
	$(Q)install -m 0644 deploy/systemd/examples/*.conf $(RELEASE_STAGE)/systemd/examples/
	$(Q)install -D -m 0644 deploy/default/mergewatchd $(RELEASE_STAGE)/default/mergewatchd
	$(Q)install -D -m 0644 -t $(RELEASE_STAGE)/prometheus deploy/prometheus/*.yml
	$(Q)install -D -m 0644 -t $(RELEASE_STAGE)/prometheus/file_sd deploy/prometheus/file_sd/*.yml
	$(Q)install -D -m 0644 -t $(RELEASE_STAGE)/grafana deploy/grafana/*.json
	$(Q)install -D -m 0644 -t $(RELEASE_STAGE)/mixin deploy/mixin/*.libsonnet deploy/mixin/*.jsonnet
	$(Q)install -D -m 0644 -t $(RELEASE_STAGE)/man docs/mergewatchd.8 docs/mergewatch.8
	$(Q)install -m 0644 deploy/web-config.example.yml docs/runbook.md README.md LICENSE $(RELEASE_STAGE)/
	$(Q)install -D -m 0644 -t $(RELEASE_STAGE)/LICENSES LICENSES/*
	$(Q)install -D -m 0644 -t $(RELEASE_STAGE)/LICENSES/third-party $(RELEASE_BUILD_ROOT)$(RELEASE_OBJ)/third-party/*
	$(call msg,TAR,$(RELEASE_TARBALL))
	$(Q)tar -C $(RELEASE_DIR) --sort=name --owner=0 --group=0 --numeric-owner --mtime=@$(RELEASE_EPOCH) \
		-cf - $(RELEASE_NAME) | gzip -9n > $(RELEASE_TARBALL)
	$(Q)cd $(RELEASE_DIR) && sha256sum $(RELEASE_NAME).tar.gz > sha256sums.txt
	@echo "make release: $(RELEASE_TARBALL) ($$(du -k $(RELEASE_TARBALL) | cut -f1) KiB), sha256sums.txt beside it"

# The RPM: the release tarball as Source0, the spec's @...@ from debian/changelog. Version: is the changelog's
# with '-' (a Debian revision) as '_', which RPM versions may not hold.
RPM_DIR     := $(BUILD)/rpm
RPM_VERSION := $(subst -,_,$(DEB_VERSION))
RPM         := $(RPM_DIR)/RPMS/x86_64/mergewatch-$(RPM_VERSION)-1.x86_64.rpm
RPMLINT_ARGS ?=

deps-rpm:
	$(call install_debian_packages,make rpm,$(RPM_PACKAGES))

rpm: deps-release deps-rpm
	@$(MAKE) --no-print-directory rpm-build

rpm-build: release-build
	$(call msg,RPM,$(RPM))
	$(Q)rm -rf $(RPM_DIR) && mkdir -p $(RPM_DIR)/SOURCES $(RPM_DIR)/SPECS
	$(Q)cp $(RELEASE_TARBALL) $(RPM_DIR)/SOURCES/
	$(Q)sed -e 's|@VERSION@|$(RPM_VERSION)|g' -e 's|@TARBALL_VERSION@|$(DEB_VERSION)|g' \
		-e "s|@CHANGELOG_DATE@|$$(date -u -d @$(RELEASE_EPOCH) '+%a %b %d %Y')|" \
		-e "s|@CHANGELOG_MAINTAINER@|$$(dpkg-parsechangelog -l debian/changelog -S Maintainer)|" \
		packaging/mergewatch.spec.in > $(RPM_DIR)/SPECS/mergewatch.spec
	$(Q)SOURCE_DATE_EPOCH=$(RELEASE_EPOCH) rpmbuild --define '_topdir $(abspath $(RPM_DIR))' -bb \
		$(RPM_DIR)/SPECS/mergewatch.spec > $(RPM_DIR)/rpmbuild.log 2>&1 \
		|| { tail -n 40 $(RPM_DIR)/rpmbuild.log >&2; echo 'make rpm: rpmbuild failed, log in $(RPM_DIR)/rpmbuild.log' >&2; exit 1; }
	$(Q)rpm -qlp $(RPM)
	$(Q)rpmlint -c packaging/rpmlint.toml $(RPMLINT_ARGS) $(RPM_DIR)/SPECS/mergewatch.spec $(RPM) > $(RPM_DIR)/rpmlint.txt 2>&1; rc=$$?; \
		cat $(RPM_DIR)/rpmlint.txt; [ $$rc = 0 ] || ! grep -q ' E: ' $(RPM_DIR)/rpmlint.txt || \
		{ echo 'make rpm: rpmlint found errors' >&2; exit 1; }
	@echo 'make rpm: $(RPM) (rpmlint: no errors; its warnings above are explained in docs/building.md, "RPM package")'

# tests/release against the tarball and the RPM (both built first): MERGEWATCH_RELEASE_TARBALL,
# MERGEWATCH_RELEASE_ROOT (the pristine root) and MERGEWATCH_RELEASE_RPM. As root none may skip
# (MERGEWATCH_NO_SKIP=1), as for the other suites.
test-release: deps-release deps-rpm
	@$(MAKE) --no-print-directory rpm-build
	@$(MAKE) --no-print-directory test-release-run

# The suite alone, against what rpm-build made (make test builds it beside the fast tier first).
test-release-run:
	@mkdir -p $(REPORTS)
	MERGEWATCH_RELEASE_TARBALL=$(abspath $(RELEASE_TARBALL)) MERGEWATCH_RELEASE_ROOT=$(abspath $(RELEASE_ROOT)) \
		MERGEWATCH_RELEASE_RPM=$(abspath $(RPM)) MERGEWATCH_NO_SKIP=$$( [ "$$(id -u)" = 0 ] && echo 1 || echo 0 ) \
		$(PYTHON) -m pytest -v -rs -p no:cacheprovider --junitxml=$(REPORTS)/release.xml tests/release

# The host suite on the release's binaries (unpacked from the tarball) instead of the build's: the same tests
# must pass on either. Not part of make test, which runs the suite once, on the build's binaries (10 minutes).
RELEASE_UNPACKED := $(RELEASE_DIR)/unpacked
test-privileged-release: deps-release
	@$(MAKE) --no-print-directory release-build $(ASAN_DAEMON)
	$(Q)rm -rf $(RELEASE_UNPACKED) && mkdir -p $(RELEASE_UNPACKED) && tar -xzf $(RELEASE_TARBALL) -C $(RELEASE_UNPACKED)
	@$(MAKE) --no-print-directory test-privileged TEST_DAEMON=$(abspath $(RELEASE_UNPACKED)/$(RELEASE_NAME)/mergewatchd) \
		TEST_CLI=$(abspath $(RELEASE_UNPACKED)/$(RELEASE_NAME)/mergewatch)
