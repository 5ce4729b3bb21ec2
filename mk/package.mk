# SPDX-License-Identifier: Apache-2.0
# Packaging and the monitoring mixin. Included by the main Makefile (before the rules that use $(DEB)).
#
#   make deb              $(BUILD)/deb/mergewatch_<version>_<arch>.deb from debian/ with dpkg-buildpackage,
#                         then lintian (fails on any error or warning); log in $(BUILD)/deb/
#   make mixin            deploy/mixin/*.jsonnet -> deploy/prometheus/mergewatch.rules.yml and
#                         deploy/grafana/mergewatch.json (both committed: the package ships them and
#                         tests/deploy/test_mixin.py checks they equal a fresh jsonnet run)
#   make dashboard-picture  docs/dashboard.png from a real run (root: BPF, a loop device, Prometheus)
#   make deps-deb         the Debian packages `make deb` needs (RUN_PACKAGES + PACKAGING_PACKAGES)
#
# The package version has one source, debian/changelog (`dch -v X.Y.Z "..."` to release): a build from
# a tarball has no git, dpkg-buildpackage reads the changelog anyway, and the daemon's --version is
# set from it (debian/rules passes VERSION=). Development builds keep `git describe`.

DEB_VERSION := $(shell dpkg-parsechangelog -l debian/changelog -S Version 2>/dev/null)
DEB_ARCH    := $(shell dpkg --print-architecture 2>/dev/null)
DEB_DIR     := $(BUILD)/deb
DEB         := $(DEB_DIR)/mergewatch_$(DEB_VERSION)_$(DEB_ARCH).deb
# dpkg-buildpackage builds in the source tree and writes its results to the parent directory: build in
# a copy under $(DEB_DIR) so neither the checkout nor its parent gets anything. The copy's own build/
# survives between runs (the copy keeps modification times), so a rebuild compiles only what changed.
DEB_SRC     := $(DEB_DIR)/src/mergewatch
LINTIAN_ARGS ?= --fail-on error,warning --display-info

MIXIN_SRCS  := $(wildcard deploy/mixin/*.libsonnet deploy/mixin/*.jsonnet)
MIXIN_OUT   := deploy/prometheus/mergewatch.rules.yml deploy/grafana/mergewatch.json

.PHONY: deb deb-build deps-deb mixin dashboard-picture

deps-deb:
	$(call install_debian_packages,make deps-deb,$(RUN_PACKAGES) $(PACKAGING_PACKAGES))

deb: deps-deb
	@$(MAKE) --no-print-directory deb-build

# Always rebuilt (phony; a FORCE prerequisite does nothing under the Makefile's .SECONDARY:): the sources
# are every file of the tree, and some fixture paths hold ':'. Incremental all the same: see DEB_SRC.
deb-build:
	@[ -n "$(DEB_VERSION)" ] || { echo 'make deb: no version in debian/changelog' >&2; exit 1; }
	@mkdir -p $(DEB_SRC)
	find $(DEB_SRC) -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
	tar -C $(CURDIR) --exclude=./build --exclude=./.git --exclude=./debian/mergewatch \
		--exclude=./debian/.debhelper --exclude='./debian/*.substvars' --exclude=./debian/files \
		--exclude='./debian/*.log' --exclude=./debian/debhelper-build-stamp -cf - . | tar -C $(DEB_SRC) -xf -
	rm -f $(DEB_DIR)/mergewatch*_$(DEB_VERSION)_*
	cd $(DEB_SRC) && dpkg-buildpackage -b --no-sign -nc > ../../dpkg-buildpackage.log 2>&1 \
		|| { tail -n 60 ../../dpkg-buildpackage.log >&2; echo 'make deb: dpkg-buildpackage failed, log in $(DEB_DIR)/dpkg-buildpackage.log' >&2; exit 1; }
	mv $(DEB_DIR)/src/mergewatch*_$(DEB_VERSION)_* $(DEB_DIR)/
	lintian $(LINTIAN_ARGS) $(DEB) > $(DEB_DIR)/lintian.txt 2>&1; rc=$$?; cat $(DEB_DIR)/lintian.txt; \
		[ $$rc = 0 ] || { echo 'make deb: lintian found errors or warnings' >&2; exit 1; }
	@echo 'make deb: $(DEB) (lintian: 0 errors, 0 warnings; the informational tags above are explained in docs/building.md, "Debian package")'

# One source for rules and dashboard: the mixin. std.manifestYamlDoc output is stable, so the
# committed files can be compared byte for byte with a fresh run.
mixin: $(MIXIN_SRCS)
	jsonnet -S deploy/mixin/rules.jsonnet > deploy/prometheus/mergewatch.rules.yml.tmp
	mv deploy/prometheus/mergewatch.rules.yml.tmp deploy/prometheus/mergewatch.rules.yml
	@mkdir -p deploy/grafana
	jsonnet deploy/mixin/dashboard.jsonnet > deploy/grafana/mergewatch.json.tmp
	mv deploy/grafana/mergewatch.json.tmp deploy/grafana/mergewatch.json

# Prometheus and mergewatchd on this host, a loop device driven into merge collapse, the dashboard's
# panels queried and drawn with matplotlib (Grafana is not in Debian). Needs root.
dashboard-picture: $(DAEMON)
	$(call install_debian_packages,make dashboard-picture,python3-matplotlib prometheus fio)
	$(PYTHON) docs/dashboard_picture.py --daemon $(CURDIR)/$(DAEMON) --out docs/dashboard.png
