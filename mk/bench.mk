# SPDX-License-Identifier: Apache-2.0
# make bench: what mergewatchd costs next to bpftrace and libbpf-tools biolatency, and its floor
# (bench/run.py, whose docstring explains the method; BENCHMARKS.md holds the results). Included by
# the main Makefile. Not part of `make test`: it measures speed, which no test may assert.
#
#   make bench                                   full run, about 8 minutes on 2 CPUs
#   make bench BENCH_QUICK=1                     smoke run, about 1.5 minutes
#   make bench BENCH_SECONDS=10 BENCH_REPEATS=5  longer runs, more repeats
#   make bench BENCH_ARGS="--quiet-wait 0"       any other bench/run.py flag
#
# Output: the summary table on stdout, also in $(BUILD)/bench/summary.md; raw numbers in
# $(BUILD)/bench/results.json.

# Debian 12 names: libbpf-tools is bcc's libbpf-based tools (0.26, /usr/sbin/biolatency);
# util-linux has losetup and unshare; clang and libbpf-dev build the floor; linux-perf is perf, for
# bench/bpf_profile.py (per source line of the BPF programs, with $(BENCH_DIR)/jit_lines).
BENCH_PACKAGES  := fio bpftrace libbpf-tools bpftool util-linux python3 clang libbpf-dev pkg-config linux-perf
BENCH_ARGS      ?=
BENCH_SECONDS   ?=
BENCH_REPEATS   ?=
BENCH_QUICK     ?=
BENCH_DIR       := $(BUILD)/bench
BENCH_FLOOR_OBJ := $(BENCH_DIR)/floor.bpf.o
BENCH_FLOOR     := $(BENCH_DIR)/floor
BENCH_JIT_LINES := $(BENCH_DIR)/jit_lines
# The lower bound of any per-device size/latency histogram (bench/lower_bound.bpf.c), counting at
# completion and at dispatch, and at dispatch with the least missed-merge evidence on block_getrq, and
# without a table (the kernel's stamps at completion: hashless); loaded by the floor loader, measured with
# bench/bpf_ab.py.
BENCH_LOWER_BOUND_OBJS := $(BENCH_DIR)/lower_bound_at_completion.bpf.o $(BENCH_DIR)/lower_bound_at_dispatch.bpf.o \
	$(BENCH_DIR)/lower_bound_with_evidence.bpf.o $(BENCH_DIR)/lower_bound_hashless.bpf.o
BENCH_RUN_ARGS   = --daemon $(CURDIR)/$(DAEMON) --floor $(CURDIR)/$(BENCH_FLOOR) $(CURDIR)/$(BENCH_FLOOR_OBJ) \
	--json $(BENCH_DIR)/results.json --markdown $(BENCH_DIR)/summary.md \
	$(if $(BENCH_SECONDS),--seconds $(BENCH_SECONDS)) $(if $(BENCH_REPEATS),--repeats $(BENCH_REPEATS)) \
	$(if $(filter-out 0,$(BENCH_QUICK)),--quick) $(BENCH_ARGS)

.PHONY: bench bench-run deps-bench

# After `deps` (the build's packages), never alongside it: two apt-get runs would fight over the lock.
deps-bench: deps
	$(call install_debian_packages,make bench,$(BENCH_PACKAGES))

# Packages first, then the build in a sub-make (pkg-config must see the installed packages).
bench: deps-bench
	@if [ "$$(id -u)" != 0 ]; then echo 'make bench: loads BPF and creates loop devices; run as root' >&2; exit 1; fi
	@$(MAKE) --no-print-directory bench-run

bench-run: $(DAEMON) $(BENCH_FLOOR_OBJ) $(BENCH_FLOOR) $(BENCH_LOWER_BOUND_OBJS) $(BENCH_JIT_LINES)
	@mkdir -p $(BENCH_DIR)
	$(PYTHON) bench/run.py $(BENCH_RUN_ARGS)
	$(PYTHON) bench/diskstats_cost.py --daemon $(CURDIR)/$(DAEMON) $(if $(filter-out 0,$(BENCH_QUICK)),--idle 5 --scrapes 50)
	$(PYTHON) bench/diskstats_cost.py --daemon $(CURDIR)/$(DAEMON) --procfs-hidden $(if $(filter-out 0,$(BENCH_QUICK)),--idle 5 --scrapes 50)

# The floor: empty tp_btf programs on the same tracepoints, loaded by a minimal libbpf loader.
$(BENCH_FLOOR_OBJ): bench/floor.bpf.c $(VMLINUX_H)
	@mkdir -p $(dir $@)
	$(call msg,BPF,$@)
	$(Q)$(CLANG) -g -O2 -target bpf -D__TARGET_ARCH_$(ARCH) -Wall -Werror -I$(dir $(VMLINUX_H)) \
		$(CLANG_BPF_SYS_INCLUDES) -c $< -o $@

# lower_bound_<way>.bpf.o: at_completion, at_dispatch, with_evidence (at dispatch, evidence on block_getrq),
# hashless (sizes at dispatch, latency from the kernel's stamp at completion).
$(BENCH_DIR)/lower_bound_%.bpf.o: bench/lower_bound.bpf.c include/mergewatch/abi.h $(VMLINUX_H)
	@mkdir -p $(dir $@)
	$(call msg,BPF,$@)
	$(Q)$(CLANG) -g -O2 -target bpf -D__TARGET_ARCH_$(ARCH) -Wall -Werror -I$(dir $(VMLINUX_H)) -Iinclude \
		-DCOUNT_AT_COMPLETION=$(if $(filter at_completion,$*),1,0) \
		-DGETRQ_EVIDENCE=$(if $(filter with_evidence,$*),1,0) -DHASHLESS=$(if $(filter hashless,$*),1,0) \
		$(CLANG_BPF_SYS_INCLUDES) -c $< -o $@

# The floor's loader, and jit_lines (a BPF program's JIT image and line info, for bench/bpf_profile.py).
$(BENCH_FLOOR) $(BENCH_JIT_LINES): $(BENCH_DIR)/%: bench/%.c
	@mkdir -p $(dir $@)
	$(call msg,CC,$@)
	$(Q)$(CC) -O2 -g -Wall -Wextra -Werror $$(pkg-config --cflags libbpf) $< $$(pkg-config --libs libbpf) -o $@
