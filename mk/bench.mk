# make bench: what mergewatchd costs next to bpftrace and libbpf-tools biolatency (bench/run.py,
# results in BENCHMARKS.md). Not part of make test: it measures speed, which no test may assert.
BENCH_PACKAGES := fio bpftrace libbpf-tools bpftool util-linux python3
BENCH_ARGS     ?=
BENCH_FLOOR_OBJ := $(BUILD)/bench/floor.bpf.o
BENCH_FLOOR     := $(BUILD)/bench/floor

.PHONY: bench deps-bench

deps-bench:
	@missing=''; for p in $(BENCH_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "make bench: missing Debian packages:$$missing; run as root" >&2; exit 1; fi; \
		echo "make bench: installing$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

bench: all deps-bench $(BENCH_FLOOR_OBJ) $(BENCH_FLOOR)
	@if [ "$$(id -u)" != 0 ]; then echo 'make bench: loads BPF and creates loop devices; run as root' >&2; exit 1; fi
	@mkdir -p $(BUILD)/bench
	$(PYTHON) bench/run.py --daemon $(CURDIR)/$(DAEMON) --floor $(CURDIR)/$(BENCH_FLOOR) $(CURDIR)/$(BENCH_FLOOR_OBJ) \
		--json $(BUILD)/bench/results.json $(BENCH_ARGS)

# The floor: empty programs on the same tracepoints, loaded by a minimal libbpf loader.
$(BENCH_FLOOR_OBJ): bench/floor.bpf.c $(VMLINUX_H)
	@mkdir -p $(dir $@)
	$(call msg,BPF,$@)
	$(Q)$(CLANG) -g -O2 -target bpf -D__TARGET_ARCH_$(ARCH) -Wall -Werror -I$(dir $(VMLINUX_H)) \
		$(CLANG_BPF_SYS_INCLUDES) -c $< -o $@
$(BENCH_FLOOR): bench/floor.c
	@mkdir -p $(dir $@)
	$(call msg,CC,$@)
	$(Q)cc -O2 -Wall -Werror $< $$(pkg-config --libs libbpf) -o $@
