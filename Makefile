# SPDX-License-Identifier: Apache-2.0
# mergewatch: build, run and test. Every output goes to $(BUILD)/.
# `make help` lists the targets; `make V=1` shows the commands.

BUILD       ?= build
PREFIX      ?= /usr/local
DESTDIR     ?=
CLANG       ?= clang
BPFTOOL     ?= bpftool
CXX         ?= g++
PYTHON      ?= /usr/bin/python3
# The BTF the BPF side is compiled against (CO-RE relocates at load time, so any recent
# kernel's BTF works); VMLINUX_H may point at a pinned copy instead.
VMLINUX_BTF ?= /sys/kernel/btf/vmlinux
VMLINUX_H   ?= $(BUILD)/vmlinux.h
RUN_ARGS    ?=
NPROC       := $(shell nproc 2>/dev/null || echo 2)
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)

ARCH := $(shell uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/' -e 's/ppc64le/powerpc/' -e 's/s390x/s390/')

# Debian packages, by what needs them. `make run`/`make all` install only RUN_PACKAGES (build the
# daemon and run it); `make deps` (and so `make test`) installs all of them; `make deb` RUN and PACKAGING.
# Run-time libraries (libbpf1, libprometheus-cpp-core1.0, libmicrohttpd12, libgnutls30, libyaml-cpp0.7,
# libcrypt1, libelf1) come with the -dev packages.
RUN_PACKAGES := clang llvm bpftool libbpf-dev libelf-dev zlib1g-dev pkg-config g++ make \
	prometheus-cpp-dev libmicrohttpd-dev libgnutls28-dev libyaml-cpp-dev libcrypt-dev libcli11-dev \
	nlohmann-json3-dev libcurl4-openssl-dev
# The .deb (tests/vm installs it) and the generated monitoring mixin and man page checks.
PACKAGING_PACKAGES := debhelper dpkg-dev fakeroot lintian jsonnet groff man-db
TEST_PACKAGES := libgtest-dev \
	fio curl util-linux python3 python3-pytest python3-prometheus-client prometheus \
	qemu-system-x86 busybox-static kmod cpio lvm2 mdadm e2fsprogs iproute2 procps gzip xz-utils zstd cryptsetup-bin \
	prometheus-alertmanager systemd strace openssl python3-bcrypt tmux $(PACKAGING_PACKAGES)
# `make release` (mk/release.mk): the Debian 11 root it builds in is made with debootstrap.
RELEASE_PACKAGES := debootstrap
# `make rpm`: rpmbuild and rpmlint (Debian's builds of them).
RPM_PACKAGES := rpm rpmlint
DEB_PACKAGES := $(RUN_PACKAGES) $(TEST_PACKAGES) $(RELEASE_PACKAGES) $(RPM_PACKAGES)

ifeq ($(V),1)
Q :=
msg :=
else
Q := @
msg = @printf '  %-8s %s\n' "$(1)" "$(2)";
endif

.DELETE_ON_ERROR:
.SECONDARY:
.DEFAULT_GOAL := all

# The daemon as a library: one folder per part (source/, topology/, detector/, metrics/, http/) and
# the process's own glue at the top; main.cpp alone stays out of the library.
LIB_SRCS  := $(filter-out daemon/main.cpp,$(wildcard daemon/*.cpp daemon/*/*.cpp))
LIB_OBJS  := $(patsubst daemon/%.cpp,$(BUILD)/obj/%.o,$(LIB_SRCS))
MAIN_OBJ  := $(BUILD)/obj/main.o
UNIT_SRCS := $(wildcard tests/unit/*.cpp tests/unit/*/*.cpp)
UNIT_OBJS := $(patsubst tests/unit/%.cpp,$(BUILD)/obj/unit/%.o,$(UNIT_SRCS))
LIB       := $(BUILD)/libmergewatch.a
DAEMON    := $(BUILD)/mergewatchd
UNIT_BIN  := $(BUILD)/mergewatch_unit_tests
BPF_OBJ   := $(BUILD)/mergewatch.bpf.o
SKEL      := $(BUILD)/mergewatch.skel.h
# The `mergewatch` command: its pure parts as a library (the unit tests link it too) and a thin main.
# It shares the daemon's headers only (metrics/metric_names.h, http/status_path.h), no object.
CLI_SRCS  := $(filter-out cli/main.cpp,$(wildcard cli/*.cpp))
CLI_OBJS  := $(patsubst cli/%.cpp,$(BUILD)/cliobj/%.o,$(CLI_SRCS))
CLI_LIB   := $(BUILD)/libmergewatch-cli.a
CLI       := $(BUILD)/mergewatch

# make deb, make mixin, make dashboard-picture; defines $(DEB), which test-vm needs.
include mk/package.mk
# make release: the tarball of binaries for any x86-64 Linux with glibc >= 2.31 (uses $(DEB_VERSION)).
include mk/release.mk

# pkg-config runs in the sub-make started after `deps`, when the packages are there.
PKG_LIBS  = $(shell pkg-config --libs prometheus-cpp-core libbpf libmicrohttpd gnutls yaml-cpp libxcrypt) -lelf -lz -lpthread
CLI_PKG_LIBS = $(shell pkg-config --libs libcurl yaml-cpp)
CXXFLAGS  ?= -O2 -g
CXXFLAGS  += -std=c++17 -Wall -Wextra -Werror -MMD -MP
CPPFLAGS  += -I. -Iinclude -Idaemon -I$(BUILD) -DMERGEWATCH_VERSION='"$(VERSION)"' \
	-DMERGEWATCH_FIXTURE_DIR='"$(CURDIR)/tests/fixtures"'
BPF_CFLAGS := -g -O2 -target bpf -D__TARGET_ARCH_$(ARCH) -Wall -Werror \
	-I$(dir $(VMLINUX_H)) -Iinclude -Ibpf -MMD -MP
# clang -target bpf does not see the host's arch-specific system headers on its own.
CLANG_BPF_SYS_INCLUDES = $(shell $(CLANG) -v -E - </dev/null 2>&1 \
	| sed -n '/<...> search starts here:/,/End of search list./{ s| \(/.*\)|-idirafter \1|p }')

.PHONY: all build daemon cli run test check test-unit test-privileged test-deploy test-vm install uninstall clean deps \
	deps-run help test-sanitize test-fuzz deps-reliability

help:
	@echo 'mergewatch targets:'
	@echo '  make run             install the run deps, build and run mergewatchd as root (RUN_ARGS="--flag=value ...")'
	@echo '  make test            install all deps, build, run every test: unit, sanitizers, fuzz, privileged, deploy, VM'
	@echo '  make check           the fast tier (no VM, no loop devices): unit, sanitizers, fuzz, deploy; about 6 minutes'
	@echo '  make all             install the run deps and build $(DAEMON) and $(CLI)'
	@echo '  make build           build $(DAEMON), $(CLI) and the unit tests (no package installs)'
	@echo '  make cli             build $(CLI), the on-call command (mergewatch status, mergewatch top)'
	@echo '  make deb             the Debian package: $(BUILD)/deb/mergewatch_<version>_<arch>.deb, then lintian'
	@echo '  make release         $(BUILD)/release/mergewatch-<version>.linux-amd64.tar.gz + sha256sums.txt: static binaries for glibc >= 2.31, built in a Debian 11 root (debootstrap, cached in $(BUILD)/release/; root)'
	@echo '  make test-release    tests/release on the tarball and the RPM: NEEDED libraries, glibc symbol versions, run and ldd in a pristine Debian 11 root, rpm -qlp, rpmlint (root)'
	@echo '  make test-privileged-release  the host suite (tests/integration) on the release tarball'"'"'s static binaries instead of the build'"'"'s (root; not in make test)'
	@echo '  make rpm             $(BUILD)/rpm/RPMS/x86_64/mergewatch-<version>-1.x86_64.rpm: the release payload as an RPM (rpmbuild), then rpmlint (root)'
	@echo '  make mixin           regenerate deploy/prometheus/mergewatch.rules.yml and the Grafana dashboard from deploy/mixin/'
	@echo '  make dashboard-picture  docs/dashboard.png: the dashboard panels queried from a real Prometheus (root)'
	@echo '  make test-unit       GoogleTest unit tests only (no root needed)'
	@echo '  make test-sanitize   unit tests under ASan+UBSan+LeakSanitizer (g++, objects in $(BUILD)/asan/)'
	@echo '  make test-fuzz       libFuzzer on the sysfs topology reader, 30 s (FUZZ_TIME=); clang++, $(BUILD)/fuzz/'
	@echo '  make test-privileged tests on real tracepoints and loop devices (root); builds an ASan daemon too'
	@echo '  make test-deploy     systemd unit (verify, security, sandbox), Prometheus rules, alert path end to end'
	@echo '  make test-vm         qemu VM, Debian 6.1 (root): the 2019 incident (NVMe, LVM snapshot), the unit under systemd, the .deb (built first) installed and purged with apt; the incident, partition, multipath, single-disk stacking and loader cases also on Debian 11'"'"'s 5.10 and Debian 13'"'"'s 6.12, one boot each; on 5.10 also the release tarball (built first) inside a Debian 11 root (MW_VM_KERNELS="6.1": only 6.1)'
	@echo '  make bench           overhead next to bpftrace and biolatency (BENCH_QUICK=1, BENCH_SECONDS=, BENCH_REPEATS=); see BENCHMARKS.md'
	@echo '  make install         install to $$(DESTDIR)$$(PREFIX) (PREFIX=$(PREFIX))'
	@echo '  make uninstall       remove what install put there'
	@echo '  make deps-run        install the Debian packages building and running need (RUN_PACKAGES, idempotent)'
	@echo '  make deps            install those plus what the tests and `make deb` need (idempotent)'
	@echo '  make clean           remove $(BUILD)/'
	@echo 'variables: VMLINUX_BTF=$(VMLINUX_BTF) VMLINUX_H=$(VMLINUX_H) CLANG=$(CLANG) BPFTOOL=$(BPFTOOL) V=1'

# $(call install_debian_packages,WHO,PACKAGES): install those not installed yet (as root), or name them.
define install_debian_packages
@missing=''; for p in $(2); do \
	dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
done; \
if [ -n "$$missing" ]; then \
	if [ "$$(id -u)" != 0 ]; then echo "$(1): missing Debian packages:$$missing; run as root to install them" >&2; exit 1; fi; \
	echo "$(1): installing$$missing"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
fi
endef

deps-run:
	$(call install_debian_packages,make deps-run,$(RUN_PACKAGES))

deps:
	$(call install_debian_packages,make deps,$(DEB_PACKAGES))

# Only the daemon: the unit tests need libgtest-dev, a test dependency.
all: deps-run
	@$(MAKE) --no-print-directory daemon cli

daemon: $(DAEMON)

cli: $(CLI)

build: $(DAEMON) $(CLI) $(UNIT_BIN)

run: all
	@if [ "$$(id -u)" != 0 ]; then echo 'make run: mergewatchd loads BPF programs; run as root' >&2; exit 1; fi
	$(DAEMON) $(RUN_ARGS)

# Every suite runs even when an earlier one fails; the summary line decides the exit code.
# The deploy suite (promtool, a real Prometheus and Alertmanager: mostly waiting for rule evaluations
# and alert timers) runs beside the sanitizer and fuzz builds, which keep both CPUs busy compiling; it
# uses only the daemon and the CLI, built before.
# The privileged suite (host tracepoints and loop devices, mostly waiting on fio and detector windows)
# runs beside the VM suite (qemu guests, about one host CPU each): neither touches what the other
# uses. One after the other they took 8 and 24 minutes of the 46 (CI, 2026-11-25). The suite's
# endpoint bounds (a scrape under 1 s, the median under 0.1 s under attack) held with two guests
# running beside it: 142 passed in 510 s (2026-11-25, session 10).
REPORTS := $(BUILD)/reports
# Golden update mode compares nothing: a test run in it must not be taken for a pass. Any value
# counts (the tests check that the variable exists, not what it says).
ifneq ($(filter test check,$(MAKECMDGOALS)),)
ifneq ($(origin MERGEWATCH_UPDATE_GOLDEN),undefined)
$(error make $(filter test check,$(MAKECMDGOALS)): MERGEWATCH_UPDATE_GOLDEN is set, which rewrites the golden files instead of checking them; unset it (rewrite goldens with MERGEWATCH_UPDATE_GOLDEN=1 $(BUILD)/mergewatch_unit_tests, review the diff, then run make test))
endif
endif
# The suites that need no VM and no loop device: make check runs them alone (the fast tier, under
# 10 minutes here), make test first. The deploy suite runs beside the sanitizer and fuzz builds.
define run_fast_suites
$(MAKE) --no-print-directory test-unit || status=1; \
echo "make $@: the deploy suite runs beside the sanitizer and fuzz builds; its output follows theirs" \
	"($(REPORTS)/deploy.log)"; \
$(MAKE) --no-print-directory test-deploy > $(REPORTS)/deploy.log 2>&1 & deploy=$$!; \
$(MAKE) --no-print-directory -j$(NPROC) test-sanitize || status=1; \
$(MAKE) --no-print-directory -j$(NPROC) test-fuzz || status=1; \
wait $$deploy || status=1; \
cat $(REPORTS)/deploy.log
endef
FAST_REPORTS := $(REPORTS)/unit.json $(REPORTS)/sanitize.json $(REPORTS)/fuzz.xml $(REPORTS)/deploy.xml

check: deps deps-reliability
	@$(MAKE) --no-print-directory -j$(NPROC) build
	@rm -rf $(REPORTS); mkdir -p $(REPORTS); status=0; \
	$(run_fast_suites); \
	$(PYTHON) tests/summary.py $(FAST_REPORTS) || status=1; \
	exit $$status

# The release (the Debian 11 roots, the libraries built there, the static binaries, the RPM) builds beside the
# fast tier: debootstrap mostly waits on the archive and on the disk, the fast tier's builds on the CPUs.
# Made once per clean clone (cached under $(RELEASE_DIR)/), then tests/release and the 5.10 boot use it.
test: deps deps-reliability
	@$(MAKE) --no-print-directory -j$(NPROC) build
	@rm -rf $(REPORTS); mkdir -p $(REPORTS); status=0; \
	echo "make test: the release builds beside the fast tier ($(REPORTS)/release-build.log)"; \
	$(MAKE) --no-print-directory rpm-build > $(REPORTS)/release-build.log 2>&1 & release=$$!; \
	$(run_fast_suites); \
	wait $$release || { status=1; tail -n 40 $(REPORTS)/release-build.log; }; \
	$(MAKE) --no-print-directory test-release-run || status=1; \
	$(MAKE) --no-print-directory -j$(NPROC) deb-build || status=1; \
	echo "make test: the privileged suite runs beside the VM suite; its output follows the VM suite's" \
		"($(REPORTS)/privileged.log)"; \
	$(MAKE) --no-print-directory test-privileged > $(REPORTS)/privileged.log 2>&1 & privileged=$$!; \
	$(MAKE) --no-print-directory -j$(NPROC) test-vm TEST_VM_DEB= TEST_VM_RELEASE= || status=1; \
	wait $$privileged || status=1; \
	cat $(REPORTS)/privileged.log; \
	$(PYTHON) tests/summary.py $(FAST_REPORTS) $(REPORTS)/release.xml $(REPORTS)/privileged.xml $(REPORTS)/vm.xml \
		|| status=1; \
	exit $$status

test-unit: $(UNIT_BIN)
	@mkdir -p $(REPORTS)
	$(UNIT_BIN) --gtest_brief=1 --gtest_output=json:$(REPORTS)/unit.json

# As root on a machine with BTF none of these may skip: MERGEWATCH_NO_SKIP turns a skip into a failure.
# TEST_DAEMON and TEST_CLI point the suite at other binaries (make test-privileged-release: the release's).
TEST_DAEMON ?= $(CURDIR)/$(DAEMON)
TEST_CLI    ?= $(CURDIR)/$(CLI)
test-privileged: $(DAEMON) $(CLI)
	@mkdir -p $(REPORTS)
	MERGEWATCHD=$(TEST_DAEMON) MERGEWATCH_CLI=$(TEST_CLI) MERGEWATCHD_ASAN=$(CURDIR)/$(ASAN_DAEMON) \
		MERGEWATCH_BPF_OBJECT=$(CURDIR)/$(BPF_OBJ) MERGEWATCH_NO_SKIP=$$( [ "$$(id -u)" = 0 ] && echo 1 || echo 0 ) \
		$(PYTHON) -m pytest -v -rs -p no:cacheprovider --junitxml=$(REPORTS)/privileged.xml tests/integration

# The shipped deploy/ files against the real tools: systemd-analyze, promtool, Prometheus, Alertmanager.
test-deploy: $(DAEMON)
	@mkdir -p $(REPORTS)
	MERGEWATCHD=$(CURDIR)/$(DAEMON) MERGEWATCH_NO_SKIP=$$( [ "$$(id -u)" = 0 ] && echo 1 || echo 0 ) \
		$(PYTHON) -m pytest -v -rs -p no:cacheprovider --junitxml=$(REPORTS)/deploy.xml tests/deploy

# Debian's 6.1 kernel under qemu (TCG) with an emulated NVMe disk and an LVM snapshot:
# the 2019 incident for real (tests/vm/README.md). deb-build is phony (always rebuilt): `make test`
# builds the package before starting the privileged suite beside this one, then passes
# TEST_VM_DEB= so it is not built twice; the same for the release (its tarball and Debian 11 root go to
# the 5.10 boot, tests/vm/test_vm_release.py).
TEST_VM_DEB ?= deb-build
TEST_VM_RELEASE ?= release-build
test-vm: $(DAEMON) $(TEST_VM_DEB) $(TEST_VM_RELEASE)
	@mkdir -p $(REPORTS)
	MERGEWATCHD=$(CURDIR)/$(DAEMON) MERGEWATCH_DEB=$(CURDIR)/$(DEB) \
		MERGEWATCH_RELEASE_TARBALL=$(abspath $(RELEASE_TARBALL)) MERGEWATCH_RELEASE_ROOT=$(abspath $(RELEASE_ROOT)) \
		$(PYTHON) -m pytest -v -s -p no:cacheprovider --junitxml=$(REPORTS)/vm.xml tests/vm

$(BUILD)/obj $(BUILD)/obj/unit:
	$(Q)mkdir -p $@

$(VMLINUX_H): | $(BUILD)/obj
	$(call msg,BTF,$@)
	$(Q)$(BPFTOOL) btf dump file $(VMLINUX_BTF) format c > $@

$(BPF_OBJ): bpf/mergewatch.bpf.c $(VMLINUX_H) | $(BUILD)/obj
	$(call msg,BPF,$@)
	$(Q)$(CLANG) $(BPF_CFLAGS) $(CLANG_BPF_SYS_INCLUDES) -MF $(BUILD)/mergewatch.bpf.d -MT $@ -c $< -o $(@:.o=.tmp.o)
	$(Q)$(BPFTOOL) gen object $@ $(@:.o=.tmp.o)

$(SKEL): $(BPF_OBJ)
	$(call msg,GEN-SKEL,$@)
	$(Q)$(BPFTOOL) gen skeleton $< name mergewatch_bpf > $@

# --version's build facts, like node_exporter's (branch, revision, build date, toolchain), compiled into config.o
# alone. A build without git (the Debian package) has no branch or revision; its date is SOURCE_DATE_EPOCH
# (dpkg-buildpackage sets it from debian/changelog), so the package build is reproducible. config.o is rebuilt
# when any of them but the date changes (the stamp file); the date is then that compile's.
GIT_BRANCH   ?= $(shell git rev-parse --abbrev-ref HEAD 2>/dev/null)
GIT_REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE   ?= $(shell date -u -d "@$${SOURCE_DATE_EPOCH:-$$(date +%s)}" +%Y%m%d-%H:%M:%S)
TOOLCHAIN    ?= $(shell $(CXX) --version 2>/dev/null | head -n1)
BUILD_FACTS  := $(VERSION)|$(GIT_BRANCH)|$(GIT_REVISION)|$(TOOLCHAIN)
$(BUILD)/build-facts: FORCE | $(BUILD)/obj
	$(Q)[ "$$(cat $@ 2>/dev/null)" = '$(BUILD_FACTS)' ] || printf '%s\n' '$(BUILD_FACTS)' > $@
$(BUILD)/obj/config.o: $(BUILD)/build-facts
$(BUILD)/obj/config.o: CPPFLAGS += -DMERGEWATCH_BRANCH='"$(GIT_BRANCH)"' -DMERGEWATCH_REVISION='"$(GIT_REVISION)"' \
	-DMERGEWATCH_BUILD_DATE='"$(BUILD_DATE)"' -DMERGEWATCH_TOOLCHAIN='"$(TOOLCHAIN)"'
.PHONY: FORCE
FORCE:

$(BUILD)/obj/%.o: daemon/%.cpp | $(BUILD)/obj $(SKEL)
	$(call msg,CXX,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(BUILD)/obj/unit/%.o: tests/unit/%.cpp | $(BUILD)/obj/unit $(SKEL)
	$(call msg,CXX,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(BUILD)/cliobj/%.o: cli/%.cpp
	$(call msg,CXX,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

$(CLI_LIB): $(CLI_OBJS)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(CLI): $(BUILD)/cliobj/main.o $(CLI_LIB)
	$(call msg,LINK,$@)
	$(Q)$(CXX) $(CXXFLAGS) $(LDFLAGS) $^ $(CLI_PKG_LIBS) -o $@

$(LIB): $(LIB_OBJS)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(DAEMON): $(MAIN_OBJ) $(LIB)
	$(call msg,LINK,$@)
	$(Q)$(CXX) $(CXXFLAGS) $(LDFLAGS) $^ $(PKG_LIBS) -o $@

$(UNIT_BIN): $(UNIT_OBJS) $(LIB) $(CLI_LIB)
	$(call msg,LINK,$@)
	$(Q)$(CXX) $(CXXFLAGS) $^ -lgtest -lgtest_main $(PKG_LIBS) $(CLI_PKG_LIBS) -o $@

# The unit goes where systemd looks for units of this prefix (/usr/local/lib/systemd/system for the
# default; the Debian package passes UNITDIR=/lib/systemd/system, where bookworm's systemd and lintian
# want packaged units); /etc/default/mergewatchd is never overwritten, it holds the operator's flags.
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR  ?= /etc
DATADIR     ?= $(PREFIX)/share/mergewatch
RULESDIR    ?= $(DATADIR)/prometheus
MANDIR      ?= $(PREFIX)/share/man
DOCDIR      ?= $(PREFIX)/share/doc/mergewatch
install: all $(CLI)
	install -D -m 0755 $(DAEMON) $(DESTDIR)$(PREFIX)/sbin/mergewatchd
	install -D -m 0755 $(CLI) $(DESTDIR)$(PREFIX)/bin/mergewatch
	install -d $(DESTDIR)$(UNITDIR)
	sed -e 's|@SBINDIR@|$(PREFIX)/sbin|g' -e 's|@DOCDIR@|$(DOCDIR)|g' deploy/systemd/mergewatchd.service.in > $(DESTDIR)$(UNITDIR)/mergewatchd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/mergewatchd.service
	install -m 0644 deploy/systemd/mergewatchd.socket $(DESTDIR)$(UNITDIR)/mergewatchd.socket
	[ -e $(DESTDIR)$(SYSCONFDIR)/default/mergewatchd ] || \
		install -D -m 0644 deploy/default/mergewatchd $(DESTDIR)$(SYSCONFDIR)/default/mergewatchd
	install -D -m 0644 -t $(DESTDIR)$(RULESDIR) deploy/prometheus/*.yml
	install -D -m 0644 -t $(DESTDIR)$(RULESDIR)/file_sd deploy/prometheus/file_sd/*.yml
	install -D -m 0644 -t $(DESTDIR)$(DATADIR)/grafana deploy/grafana/*.json
	install -D -m 0644 -t $(DESTDIR)$(DATADIR)/mixin deploy/mixin/*.libsonnet deploy/mixin/*.jsonnet
	install -D -m 0644 -t $(DESTDIR)$(DATADIR)/systemd deploy/systemd/examples/*.conf
	install -D -m 0644 deploy/web-config.example.yml $(DESTDIR)$(DATADIR)/web-config.example.yml
	install -D -m 0644 docs/mergewatchd.8 $(DESTDIR)$(MANDIR)/man8/mergewatchd.8
	install -D -m 0644 docs/mergewatch.8 $(DESTDIR)$(MANDIR)/man8/mergewatch.8
	install -D -m 0644 -t $(DESTDIR)$(DOCDIR) README.md docs/runbook.md
	@if [ -z "$(DESTDIR)" ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then \
		systemctl daemon-reload; echo 'installed: systemctl enable --now mergewatchd'; fi

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/sbin/mergewatchd $(DESTDIR)$(PREFIX)/bin/mergewatch $(DESTDIR)$(UNITDIR)/mergewatchd.service \
		$(DESTDIR)$(UNITDIR)/mergewatchd.socket
	rm -f $(DESTDIR)$(MANDIR)/man8/mergewatchd.8 $(DESTDIR)$(MANDIR)/man8/mergewatch.8
	rm -rf $(DESTDIR)$(DOCDIR)
	rm -rf $(DESTDIR)$(DATADIR)
	@echo 'left $(SYSCONFDIR)/default/mergewatchd in place (your flags)'

clean:
	rm -rf $(BUILD)

# Benchmark and reliability targets live in their own files.
include mk/bench.mk mk/reliability.mk

-include $(BUILD)/mergewatch.bpf.d $(wildcard $(BUILD)/obj/*.d $(BUILD)/obj/*/*.d $(BUILD)/obj/unit/*/*.d $(BUILD)/cliobj/*.d)
