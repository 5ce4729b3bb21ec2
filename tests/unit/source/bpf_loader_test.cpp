// SPDX-License-Identifier: Apache-2.0
// The loader child's reply: what the parent accepts, and what it refuses without keeping a
// descriptor. Descriptors here are plain numbers; nothing is opened or closed.
#include "source/bpf_loader.h"
#include "source/source.h"

#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "mergewatch.skel.h"

namespace mergewatch {
namespace {

LoadReply Loaded() {
  LoadReply r;
  r.mode = "tp_btf";
  r.dev_stats_fd = 10;
  r.origin_stats_fd = 11;
  r.event_counts_fd = 12;
  r.other_map_fds = {13};
  r.programs = {{"block_rq_issue", "tp_btf", 20, 30}, {"block_bio_queue", "tp_btf", 21, -1},
                {"block_rq_complete", "tp_btf", 22, 31}};
  return r;
}

// The parent receives the same descriptors under other numbers.
std::vector<int> Renumbered(const std::vector<int>& sent) {
  std::vector<int> got;
  for (size_t i = 0; i < sent.size(); ++i) got.push_back(100 + static_cast<int>(i));
  return got;
}

TEST(LoadReply, RoundTripGivesEveryReceivedDescriptorItsRole) {
  std::vector<int> sent;
  const std::string bytes = EncodeLoadReply(Loaded(), &sent);
  EXPECT_EQ(sent, (std::vector<int>{10, 11, 12, 13, 20, 30, 21, 22, 31}));
  LoadReply got;
  std::string error;
  ASSERT_TRUE(DecodeLoadReply(bytes, Renumbered(sent), &got, &error)) << error;
  EXPECT_EQ(got.kind, ProbeError::kNone);
  EXPECT_EQ(got.mode, "tp_btf");
  EXPECT_EQ(got.dev_stats_fd, 100);
  EXPECT_EQ(got.origin_stats_fd, 101);
  EXPECT_EQ(got.event_counts_fd, 102);
  EXPECT_EQ(got.other_map_fds, std::vector<int>{103});
  ASSERT_EQ(got.programs.size(), 3u);
  EXPECT_EQ(got.programs[0].tracepoint, "block_rq_issue");
  EXPECT_EQ(got.programs[0].prog_fd, 104);
  EXPECT_EQ(got.programs[0].link_fd, 105);
  EXPECT_EQ(got.programs[1].tracepoint, "block_bio_queue");
  EXPECT_EQ(got.programs[1].prog_fd, 106);
  EXPECT_EQ(got.programs[1].link_fd, -1);  // loaded, attached later by the parent
  EXPECT_EQ(got.programs[2].prog_fd, 107);
  EXPECT_EQ(got.programs[2].link_fd, 108);
}

TEST(LoadReply, ErrorsKeepTheirKindTextAndErrno) {
  for (ProbeError kind : {ProbeError::kNoBtf, ProbeError::kNoPrivilege, ProbeError::kLoad}) {
    LoadReply failed;
    failed.kind = kind;
    failed.error = "not privileged to load BPF: run as root\n  libbpf: tail";
    failed.error_number = kind == ProbeError::kLoad ? ENOMEM : 0;
    std::vector<int> sent;
    const std::string bytes = EncodeLoadReply(failed, &sent);
    EXPECT_TRUE(sent.empty());
    LoadReply got;
    std::string error;
    ASSERT_TRUE(DecodeLoadReply(bytes, {}, &got, &error)) << error;
    EXPECT_EQ(got.kind, kind);
    EXPECT_EQ(got.error, failed.error);
    EXPECT_EQ(got.error_number, failed.error_number);
  }
}

TEST(LoadReply, LongErrorsAreCutNotLost) {
  LoadReply failed;
  failed.kind = ProbeError::kLoad;
  failed.error = std::string(200 * 1024, 'v');
  std::vector<int> sent;
  const std::string bytes = EncodeLoadReply(failed, &sent);
  EXPECT_LT(bytes.size(), 100u * 1024);
  LoadReply got;
  std::string error;
  ASSERT_TRUE(DecodeLoadReply(bytes, {}, &got, &error)) << error;
  EXPECT_EQ(got.error.substr(0, 10), "vvvvvvvvvv");
  EXPECT_EQ(got.error.substr(got.error.size() - 3), "...");
}

TEST(LoadReply, RefusesEveryTruncation) {
  std::vector<int> sent;
  const std::string bytes = EncodeLoadReply(Loaded(), &sent);
  for (size_t n = 0; n < bytes.size(); ++n) {
    LoadReply got;
    std::string error;
    EXPECT_FALSE(DecodeLoadReply(bytes.substr(0, n), Renumbered(sent), &got, &error)) << n << " bytes";
    EXPECT_EQ(got.programs.size(), 0u);  // nothing handed over on failure
  }
}

TEST(LoadReply, RefusesGarbageTrailingBytesAndWrongMagic) {
  std::vector<int> sent;
  const std::string bytes = EncodeLoadReply(Loaded(), &sent);
  LoadReply got;
  std::string error;
  EXPECT_FALSE(DecodeLoadReply(bytes + "x", Renumbered(sent), &got, &error));
  EXPECT_NE(error.find("trailing"), std::string::npos) << error;
  std::string wrong = bytes;
  wrong[0] = 'X';
  EXPECT_FALSE(DecodeLoadReply(wrong, Renumbered(sent), &got, &error));
  EXPECT_FALSE(DecodeLoadReply("", {}, &got, &error));
  EXPECT_FALSE(DecodeLoadReply(std::string(64, '\xff'), {}, &got, &error));
}

TEST(LoadReply, EveryDescriptorMustBeReferredToExactlyOnce) {
  std::vector<int> sent;
  const std::string bytes = EncodeLoadReply(Loaded(), &sent);
  LoadReply got;
  std::string error;
  std::vector<int> fewer = Renumbered(sent);
  fewer.pop_back();
  EXPECT_FALSE(DecodeLoadReply(bytes, fewer, &got, &error));  // an index past the end
  std::vector<int> more = Renumbered(sent);
  more.push_back(999);
  EXPECT_FALSE(DecodeLoadReply(bytes, more, &got, &error));  // one the reply never mentions
  EXPECT_NE(error.find("not referred to"), std::string::npos) << error;
  // An error reply carries no descriptors; one that does is not trusted.
  LoadReply failed;
  failed.kind = ProbeError::kLoad;
  failed.error = "x";
  std::vector<int> none;
  EXPECT_FALSE(DecodeLoadReply(EncodeLoadReply(failed, &none), {5}, &got, &error));
}

TEST(LoadReply, AMapOrProgramWithoutDescriptorIsRefused) {
  LoadReply r = Loaded();
  r.event_counts_fd = -1;
  std::vector<int> sent;
  LoadReply got;
  std::string error;
  std::string bytes = EncodeLoadReply(r, &sent);
  EXPECT_FALSE(DecodeLoadReply(bytes, Renumbered(sent), &got, &error));
  r = Loaded();
  r.programs[0].prog_fd = -1;
  sent.clear();
  bytes = EncodeLoadReply(r, &sent);
  EXPECT_FALSE(DecodeLoadReply(bytes, Renumbered(sent), &got, &error));
}

TEST(DescribeWaitStatus, SaysHowTheLoaderEnded) {
  EXPECT_EQ(DescribeWaitStatus(3 << 8), "exited with status 3");
  EXPECT_EQ(DescribeWaitStatus(SIGSEGV), "was killed by signal 11 (Segmentation fault)");
}

TEST(DescribeLoaderExit, AnOomKilledLoaderIsTheMemoryCauseThatCanPass) {
  EXPECT_EQ(LoaderExitErrno(SIGKILL, false), ENOMEM);
  EXPECT_NE(DescribeLoaderExit(SIGKILL, false).find("OOM killer"), std::string::npos);
  EXPECT_TRUE(BpfFailureCanPass({ProbeError::kLoad, LoaderExitErrno(SIGKILL, false), "killed"}));
  // Killed by us at the loader's timeout, or crashed: not a cause that passes by itself.
  EXPECT_EQ(DescribeLoaderExit(SIGKILL, true), "was killed by signal 9 (Killed)");
  EXPECT_EQ(LoaderExitErrno(SIGKILL, true), 0);
  EXPECT_EQ(LoaderExitErrno(SIGSEGV, false), 0);
  EXPECT_EQ(LoaderExitErrno(3 << 8, false), 0);
}

// Decided by the kind and the errno, never by the message's words.
TEST(BpfFailureCanPass, OnlyMemoryBusyAndTimeoutNeverPrivilegeLockdownOrBtf) {
  EXPECT_TRUE(BpfFailureCanPass({ProbeError::kLoad, ENOMEM, "tp_btf: out of memory"}));
  EXPECT_TRUE(BpfFailureCanPass({ProbeError::kLoad, EBUSY, "cannot attach"}));
  EXPECT_TRUE(BpfFailureCanPass({ProbeError::kTimeout, 0, "no answer"}));
  EXPECT_FALSE(BpfFailureCanPass({ProbeError::kNoPrivilege, EPERM, "refused"}));
  EXPECT_FALSE(BpfFailureCanPass({ProbeError::kNoPrivilege, ENOMEM, "refused"}));
  EXPECT_FALSE(BpfFailureCanPass({ProbeError::kNoBtf, ENOMEM, "no BTF"}));
  EXPECT_FALSE(BpfFailureCanPass({ProbeError::kLockdown, ENOMEM, "lockdown"}));
  EXPECT_FALSE(BpfFailureCanPass({ProbeError::kLoad, EINVAL, "the BPF programs did not load in any mode"}));
  // The words alone say nothing: a message naming ENOMEM's text with another errno does not pass.
  EXPECT_FALSE(BpfFailureCanPass({ProbeError::kLoad, EINVAL, strerror(ENOMEM)}));
}

TEST(InflightSlotBits, RoundsUpToAPowerOfTwo) {
  EXPECT_EQ(InflightSlotBits(1), 1u);
  EXPECT_EQ(InflightSlotBits(1024), 10u);
  EXPECT_EQ(InflightSlotBits(1025), 11u);
}

// ---- the program variants per argument layout, on made-up kernels (no BPF loaded)

// The programs of the real BPF object (opened, never loaded: no privilege needed).
std::vector<ProgramId> ObjectPrograms() {
  std::vector<ProgramId> out;
  mergewatch_bpf* skel = mergewatch_bpf__open();
  if (skel == nullptr) return out;
  struct bpf_program* prog;
  bpf_object__for_each_program(prog, skel->obj) out.push_back({bpf_program__name(prog), bpf_program__section_name(prog)});
  mergewatch_bpf__destroy(skel);
  return out;
}

// Argument counts as the btf_trace_<tp> prototypes give them: Debian 11's 5.10 (measured in the
// VM: the request_queue first) and 5.11+ (6.1, 6.12, 6.18).
KernelFeatures Kernel510() {
  KernelFeatures f;
  f.tracepoint_arity = {{"block_rq_insert", 2},     {"block_rq_issue", 2},       {"block_rq_requeue", 2},
                        {"block_rq_complete", 3},   {"block_bio_backmerge", 3},  {"block_bio_frontmerge", 3},
                        {"block_bio_queue", 2},     {"block_getrq", 3},          {"block_bio_remap", 4}};
  return f;
}
KernelFeatures Kernel61() {
  KernelFeatures f;
  f.tracepoint_arity = {{"block_rq_insert", 1},     {"block_rq_issue", 1},       {"block_rq_requeue", 1},
                        {"block_rq_complete", 3},   {"block_bio_backmerge", 1},  {"block_bio_frontmerge", 1},
                        {"block_bio_queue", 1},     {"block_getrq", 1},          {"block_bio_remap", 3}};
  f.current_task_btf = true;
  f.compare_exchange = true;
  return f;
}
// Debian 11's 5.10.262 (measured in the VM): the request tracepoints' v5.11 layout backported, the bio
// ones not, and no compare-and-exchange in the verifier (v5.12).
KernelFeatures Kernel510Debian() {
  KernelFeatures f = Kernel510();
  f.tracepoint_arity["block_rq_insert"] = 1;
  f.tracepoint_arity["block_rq_issue"] = 1;
  f.tracepoint_arity["block_rq_requeue"] = 1;
  return f;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(ChooseVariants, TheRequestQueueFirstLayoutLoadsTheQVariantsInBothModes) {
  const std::vector<ProgramId> programs = ObjectPrograms();
  ASSERT_FALSE(programs.empty());
  VariantPlan btf = ChooseVariants("tp_btf", Kernel510(), programs);
  EXPECT_EQ(Sorted(btf.load),
            Sorted({"btf_rq_insert_q", "btf_rq_issue_q", "btf_rq_requeue_q", "btf_rq_complete", "btf_bio_backmerge_q",
                    "btf_bio_frontmerge_q", "btf_bio_queue_q", "btf_getrq_q", "btf_bio_remap_q"}));
  EXPECT_EQ(btf.old_layout.size(), 8u);  // every tracepoint but block_rq_complete, whose layout never changed
  EXPECT_TRUE(btf.missing.empty());
  EXPECT_TRUE(btf.unknown_layout.empty());
  VariantPlan raw = ChooseVariants("raw_tp", Kernel510(), programs);
  EXPECT_EQ(Sorted(raw.load),
            Sorted({"raw_rq_insert_q", "raw_rq_issue_q", "raw_rq_requeue_q", "raw_rq_complete", "raw_bio_backmerge_q",
                    "raw_bio_frontmerge_q", "raw_bio_queue_q", "raw_getrq_q", "raw_bio_remap_q"}));
}

TEST(ChooseVariants, TheV511LayoutLoadsThePlainVariants) {
  VariantPlan plan = ChooseVariants("tp_btf", Kernel61(), ObjectPrograms());
  EXPECT_EQ(Sorted(plan.load),
            Sorted({"btf_rq_insert", "btf_rq_issue", "btf_rq_requeue", "btf_rq_complete", "btf_bio_backmerge",
                    "btf_bio_frontmerge", "btf_bio_queue", "btf_getrq", "btf_bio_remap"}));
  EXPECT_TRUE(plan.old_layout.empty());
}

// The two programs that claim in-flight slots: by compare-and-exchange where the verifier has it, else
// the plain-store variant of the same layout; the other tracepoints are not affected.
TEST(ChooseVariants, WithoutCompareExchangeTheNewLayoutClaimsByStore) {
  KernelFeatures k = Kernel61();
  k.compare_exchange = false;
  VariantPlan plan = ChooseVariants("tp_btf", k, ObjectPrograms());
  EXPECT_EQ(Sorted(plan.load),
            Sorted({"btf_rq_insert_store", "btf_rq_issue_store", "btf_rq_requeue", "btf_rq_complete",
                    "btf_bio_backmerge", "btf_bio_frontmerge", "btf_bio_queue", "btf_getrq", "btf_bio_remap"}));
  VariantPlan debian510 = ChooseVariants("raw_tp", Kernel510Debian(), ObjectPrograms());
  EXPECT_EQ(Sorted(debian510.load),
            Sorted({"raw_rq_insert_store", "raw_rq_issue_store", "raw_rq_requeue", "raw_rq_complete",
                    "raw_bio_backmerge_q", "raw_bio_frontmerge_q", "raw_bio_queue_q", "raw_getrq_q",
                    "raw_bio_remap_q"}));
}

// A vendor kernel that backported only some of the changes: each tracepoint on its own.
TEST(ChooseVariants, EachTracepointIsChosenByItsOwnPrototype) {
  KernelFeatures mixed = Kernel61();
  mixed.tracepoint_arity["block_bio_backmerge"] = 3;
  mixed.tracepoint_arity["block_bio_remap"] = 4;
  VariantPlan plan = ChooseVariants("raw_tp", mixed, ObjectPrograms());
  EXPECT_EQ(Sorted(plan.load),
            Sorted({"raw_rq_insert", "raw_rq_issue", "raw_rq_requeue", "raw_rq_complete", "raw_bio_backmerge_q",
                    "raw_bio_frontmerge", "raw_bio_queue", "raw_getrq", "raw_bio_remap_q"}));
  EXPECT_EQ(Sorted(plan.old_layout), Sorted({"block_bio_backmerge", "block_bio_remap"}));
}

TEST(ChooseVariants, AMissingTracepointOrAnUnknownLayoutLoadsNothingForIt) {
  KernelFeatures k = Kernel61();
  k.tracepoint_arity.erase("block_bio_remap");
  k.tracepoint_arity["block_getrq"] = 5;
  VariantPlan plan = ChooseVariants("tp_btf", k, ObjectPrograms());
  EXPECT_EQ(plan.missing, std::vector<std::string>{"block_bio_remap"});
  ASSERT_EQ(plan.unknown_layout.size(), 1u);
  EXPECT_EQ(plan.unknown_layout[0], "block_getrq has 5 arguments; mergewatchd knows 1 and 3");
  for (const std::string& name : plan.load) {
    EXPECT_EQ(name.find("getrq"), std::string::npos) << name;
    EXPECT_EQ(name.find("remap"), std::string::npos) << name;
  }
  EXPECT_EQ(plan.load.size(), 7u);
}

// Every tracepoint has exactly one program per layout, mode and claim in the object, so no kernel
// the loader knows can leave a tracepoint without its program.
TEST(ChooseVariants, TheObjectHasOneProgramPerLayoutAndMode) {
  const std::vector<ProgramId> programs = ObjectPrograms();
  for (const std::string mode : {"tp_btf", "raw_tp"}) {
    for (KernelFeatures k : {Kernel510(), Kernel510Debian(), Kernel61()}) {
      for (bool compare_exchange : {false, true}) {
        k.compare_exchange = compare_exchange;
        VariantPlan plan = ChooseVariants(mode, k, programs);
        EXPECT_EQ(plan.load.size(), 9u) << mode << " compare_exchange " << compare_exchange;
      }
    }
  }
}

// The host's own BTF (6.18): the v5.11 layout and the typed-task helper.
TEST(ReadKernelFeatures, TheHostKernelHasTheNewLayoutAndTheTaskHelper) {
  KernelFeatures f;
  std::string error;
  if (access("/sys/kernel/btf/vmlinux", R_OK) != 0) GTEST_SKIP() << "no /sys/kernel/btf/vmlinux";
  ASSERT_TRUE(ReadKernelFeatures("/sys/kernel/btf/vmlinux", &f, &error)) << error;
  EXPECT_TRUE(f.current_task_btf);
  EXPECT_EQ(f.tracepoint_arity["block_rq_issue"], 1);
  EXPECT_EQ(f.tracepoint_arity["block_bio_remap"], 3);
  EXPECT_FALSE(ReadKernelFeatures("/dev/null", &f, &error));
}


TEST(LoadReply, ALockdownErrorKeepsItsKind) {
  LoadReply failed;
  failed.kind = ProbeError::kLockdown;
  failed.error = "kernel lockdown (confidentiality) refuses BPF reads";
  std::vector<int> sent;
  LoadReply got;
  std::string error;
  ASSERT_TRUE(DecodeLoadReply(EncodeLoadReply(failed, &sent), {}, &got, &error)) << error;
  EXPECT_EQ(got.kind, ProbeError::kLockdown);
  EXPECT_EQ(got.error, failed.error);
}

TEST(LockdownMode, TheBracketedWordOrNothing) {
  char tmpl[] = "/tmp/mw-lockdown-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  EXPECT_EQ(LockdownMode(root), "");  // no securityfs
  ASSERT_EQ(mkdir((root + "/kernel").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((root + "/kernel/security").c_str(), 0755), 0);
  std::ofstream(root + "/kernel/security/lockdown") << "none integrity [confidentiality]\n";
  EXPECT_EQ(LockdownMode(root), "confidentiality");
  std::ofstream(root + "/kernel/security/lockdown") << "garbage]x[\n";
  EXPECT_EQ(LockdownMode(root), "");
  std::system(("rm -rf " + root).c_str());
}

}  // namespace
}  // namespace mergewatch

namespace mergewatch {
namespace {

// The stamp bits (bpf/request_clock.bpf.h) from a BTF made here: an anonymous enum with QUEUE_FLAG_STATS (v6.11+)
// and the named enum rqf_flags (v6.14+); neither (before v6.11: the #defines' 20 and 17); only one (unknown).
TEST(KernelStampBits, EnumeratorsOfAnyEnumElseTheDefinesValues) {
  struct btf* btf = btf__new_empty();
  ASSERT_NE(btf, nullptr);
  KernelFeatures none;
  KernelStampBits(btf, &none);
  EXPECT_EQ(none.queue_flag_stats_bit, 20);
  EXPECT_EQ(none.rqf_stats_bit, 17);
  EXPECT_FALSE(none.stamp_bits_from_btf);

  ASSERT_GT(btf__add_enum(btf, nullptr, 4), 0);  // anonymous, as QUEUE_FLAG_* in 6.11-6.18
  ASSERT_EQ(btf__add_enum_value(btf, "QUEUE_FLAG_DYING", 0), 0);
  ASSERT_EQ(btf__add_enum_value(btf, "QUEUE_FLAG_STATS", 7), 0);
  KernelFeatures half;
  KernelStampBits(btf, &half);
  EXPECT_EQ(half.queue_flag_stats_bit, -1);
  EXPECT_EQ(half.rqf_stats_bit, -1);

  ASSERT_GT(btf__add_enum(btf, "rqf_flags", 4), 0);
  ASSERT_EQ(btf__add_enum_value(btf, "__RQF_STARTED", 0), 0);
  ASSERT_EQ(btf__add_enum_value(btf, "__RQF_STATS", 11), 0);
  KernelFeatures both;
  KernelStampBits(btf, &both);
  EXPECT_EQ(both.queue_flag_stats_bit, 7);
  EXPECT_EQ(both.rqf_stats_bit, 11);
  EXPECT_TRUE(both.stamp_bits_from_btf);
  btf__free(btf);
}

TEST(RequestClock, NamesRoundTripAndUnknownOnesAreRefused) {
  for (RequestClock c : {RequestClock::kAuto, RequestClock::kDispatch, RequestClock::kTable}) {
    RequestClock parsed = RequestClock::kAuto;
    ASSERT_TRUE(ParseRequestClock(RequestClockName(c), &parsed));
    EXPECT_EQ(parsed, c);
  }
  RequestClock parsed = RequestClock::kTable;
  EXPECT_FALSE(ParseRequestClock("stamps", &parsed));
  EXPECT_FALSE(ParseRequestClock("", &parsed));
  EXPECT_EQ(parsed, RequestClock::kTable);
}

}  // namespace
}  // namespace mergewatch
