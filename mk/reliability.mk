# SPDX-License-Identifier: Apache-2.0
# Reliability: sanitizers and fuzzing. Included by the main Makefile.
#
#   make test-sanitize     unit tests built with ASan+UBSan (g++), objects in $(BUILD)/asan/,
#                          report $(REPORTS)/sanitize.json
#   make test-fuzz         libFuzzer on the sysfs topology parser (clang++), work dir $(BUILD)/fuzz/,
#                          report $(REPORTS)/fuzz.xml (JUnit, one testcase "topology_fuzz")
#   make deps-reliability  installs the Debian packages both need (idempotent, like `make deps`)

# Debian 12's clang is clang-14; libFuzzer (libclang_rt.fuzzer-x86_64.a) and the clang ASan/UBSan
# runtimes are in libclang-rt-14-dev (pulled in by libclang-common-14-dev, listed so it is explicit).
# g++'s runtimes (libasan8, libubsan1) come with g++ itself.
RELIABILITY_PACKAGES := clang libclang-rt-14-dev g++ libgtest-dev python3

FUZZ_CXX       ?= clang++
FUZZ_TIME      ?= 30
FUZZ_ARGS      ?=
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# g++ 12 with ASan at -O2 reports -Wmaybe-uninitialized inside libstdc++'s <regex> (_State move,
# regex_automaton.h:315, GCC PR 105562), which -Werror turns fatal; the normal build keeps the check.
SANITIZE_WARN  := -Wno-maybe-uninitialized
# -O1 with line tables only (after CXXFLAGS' -O2 -g, so these win): what the ASan and libFuzzer docs
# recommend, stack traces keep file:line, and it compiles in about half the time of -O2 -g under ASan
# (measured here: detector_test.cpp 191 s -> 109 s, exporter.cpp 95 s -> 31 s, 2 busy cores).
SANITIZE_OPT   := -O1 -g1
FUZZ_OPT       := -O1 -gline-tables-only
# LeakSanitizer works here: it needs ptrace for its stop-the-world step, and neither seccomp nor
# Yama blocks that on this host/container (checked: a planted malloc leak is reported, exit 1).
SANITIZE_ENV   := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

ASAN_DIR       := $(BUILD)/asan
ASAN_LIB_OBJS  := $(patsubst daemon/%.cpp,$(ASAN_DIR)/obj/%.o,$(LIB_SRCS))
ASAN_UNIT_OBJS := $(patsubst tests/unit/%.cpp,$(ASAN_DIR)/obj/unit/%.o,$(UNIT_SRCS))
ASAN_UNIT_BIN  := $(ASAN_DIR)/mergewatch_unit_tests
ASAN_CLI_OBJS  := $(patsubst cli/%.cpp,$(ASAN_DIR)/cliobj/%.o,$(CLI_SRCS))
# The daemon itself under ASan+UBSan, for the privileged test of its error exit path with scrapes in
# flight (tests/integration/test_endpoint.py); make test-privileged builds it.
ASAN_DAEMON    := $(ASAN_DIR)/mergewatchd

# The library goes into the fuzz binary with coverage instrumentation (fuzzer-no-link) and the
# same ASan/UBSan flags; only the harness itself links libFuzzer's main.
FUZZ_DIR       := $(BUILD)/fuzz
# The harness drives the sysfs topology reader only: the library part it links is daemon/topology/ and
# the logger, not the whole daemon (a third full compile of LIB_SRCS in make test otherwise).
FUZZ_LIB_SRCS  := $(wildcard daemon/topology/*.cpp) daemon/log.cpp
FUZZ_LIB_OBJS  := $(patsubst daemon/%.cpp,$(FUZZ_DIR)/obj/%.o,$(FUZZ_LIB_SRCS))
FUZZ_LIB       := $(FUZZ_DIR)/libmergewatch.a
FUZZ_BIN       := $(FUZZ_DIR)/topology_fuzz
FUZZ_CORPUS    := $(FUZZ_DIR)/corpus
FUZZ_FIXTURES  := $(wildcard tests/fixtures/sysfs/*/)
# Temp trees (one per input, removed after it) go to tmpfs when there is one.
FUZZ_TMP       ?= $(if $(wildcard /dev/shm/.),/dev/shm/mergewatch-fuzz,$(FUZZ_DIR)/tmp)
FUZZ_CXXFLAGS  := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all \
	-fno-omit-frame-pointer

.PHONY: test-sanitize test-fuzz deps-reliability

deps-reliability:
	$(call install_debian_packages,make deps-reliability,$(RELIABILITY_PACKAGES))

# --- ASan + UBSan unit tests (g++) -------------------------------------------------------------

test-sanitize: $(ASAN_UNIT_BIN)
	@mkdir -p $(REPORTS)
	$(SANITIZE_ENV) $(ASAN_UNIT_BIN) --gtest_brief=1 --gtest_output=json:$(REPORTS)/sanitize.json

$(ASAN_DIR)/obj $(ASAN_DIR)/obj/unit $(FUZZ_DIR)/obj:
	$(Q)mkdir -p $@

$(ASAN_DIR)/obj/%.o: daemon/%.cpp | $(ASAN_DIR)/obj $(SKEL)
	$(call msg,CXX-ASAN,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CXX) $(CPPFLAGS) $(CXXFLAGS) $(SANITIZE_OPT) $(SANITIZE_FLAGS) $(SANITIZE_WARN) -c $< -o $@

$(ASAN_DIR)/obj/unit/%.o: tests/unit/%.cpp | $(ASAN_DIR)/obj/unit $(SKEL)
	$(call msg,CXX-ASAN,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CXX) $(CPPFLAGS) $(CXXFLAGS) $(SANITIZE_OPT) $(SANITIZE_FLAGS) $(SANITIZE_WARN) -c $< -o $@

$(ASAN_DIR)/cliobj/%.o: cli/%.cpp
	$(call msg,CXX-ASAN,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(CXX) $(CPPFLAGS) $(CXXFLAGS) $(SANITIZE_OPT) $(SANITIZE_FLAGS) $(SANITIZE_WARN) -c $< -o $@

$(ASAN_UNIT_BIN): $(ASAN_UNIT_OBJS) $(ASAN_LIB_OBJS) $(ASAN_CLI_OBJS)
	$(call msg,LINK,$@)
	$(Q)$(CXX) $(CXXFLAGS) $(SANITIZE_FLAGS) $^ -lgtest -lgtest_main $(PKG_LIBS) $(CLI_PKG_LIBS) -o $@

test-privileged: $(ASAN_DAEMON)

$(ASAN_DAEMON): $(ASAN_DIR)/obj/main.o $(ASAN_LIB_OBJS)
	$(call msg,LINK,$@)
	$(Q)$(CXX) $(CXXFLAGS) $(SANITIZE_FLAGS) $^ $(PKG_LIBS) -o $@

# --- libFuzzer on Topology (clang++) ----------------------------------------------------------

# The seeds (seed-<fixture>*) are re-encoded from the fixture trees on every run (milliseconds;
# fixture paths hold ':' so they cannot be make prerequisites). libFuzzer adds what it finds to
# the same dir under sha1 names, so later runs start from there.
test-fuzz: $(FUZZ_BIN)
	@mkdir -p $(REPORTS) $(FUZZ_DIR)/artifacts $(FUZZ_CORPUS)
	$(PYTHON) tests/fuzz/encode_tree.py --out-dir $(FUZZ_CORPUS) $(FUZZ_FIXTURES)
	$(PYTHON) tests/fuzz/run_fuzz.py --junit $(REPORTS)/fuzz.xml --log $(FUZZ_DIR)/fuzz.log \
		--tmp-base $(FUZZ_TMP) -- $(FUZZ_BIN) -max_total_time=$(FUZZ_TIME) -timeout=10 \
		-rss_limit_mb=2048 -print_final_stats=1 -dict=tests/fuzz/topology.dict \
		-artifact_prefix=$(FUZZ_DIR)/artifacts/ $(FUZZ_ARGS) $(FUZZ_CORPUS)

$(FUZZ_DIR)/obj/%.o: daemon/%.cpp | $(FUZZ_DIR)/obj $(SKEL)
	$(call msg,CXX-FUZZ,$@)
	$(Q)mkdir -p $(@D)
	$(Q)$(FUZZ_CXX) $(CPPFLAGS) $(CXXFLAGS) $(FUZZ_OPT) $(FUZZ_CXXFLAGS) -c $< -o $@

$(FUZZ_DIR)/obj/topology_fuzz.o: tests/fuzz/topology_fuzz.cpp | $(FUZZ_DIR)/obj $(SKEL)
	$(call msg,CXX-FUZZ,$@)
	$(Q)$(FUZZ_CXX) $(CPPFLAGS) $(CXXFLAGS) $(FUZZ_OPT) $(FUZZ_CXXFLAGS) -c $< -o $@

$(FUZZ_LIB): $(FUZZ_LIB_OBJS)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(FUZZ_BIN): $(FUZZ_DIR)/obj/topology_fuzz.o $(FUZZ_LIB)
	$(call msg,LINK,$@)
	$(Q)$(FUZZ_CXX) $(CXXFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $^ \
		$(PKG_LIBS) -o $@

-include $(wildcard $(ASAN_DIR)/cliobj/*.d $(ASAN_DIR)/obj/*.d $(ASAN_DIR)/obj/*/*.d $(ASAN_DIR)/obj/unit/*/*.d $(FUZZ_DIR)/obj/*.d $(FUZZ_DIR)/obj/*/*.d)
