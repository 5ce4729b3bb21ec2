// SPDX-License-Identifier: Apache-2.0
// The loader child's reply: what the parent accepts, and what it refuses without keeping a
// descriptor. Descriptors here are plain numbers; nothing is opened or closed.
#include "source/bpf_loader.h"
#include "source/source.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

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

TEST(LoadReply, ErrorsKeepTheirKindAndText) {
  for (ProbeError kind : {ProbeError::kNoBtf, ProbeError::kNoPrivilege, ProbeError::kLoad}) {
    LoadReply failed;
    failed.kind = kind;
    failed.error = "not privileged to load BPF: run as root\n  libbpf: tail";
    std::vector<int> sent;
    const std::string bytes = EncodeLoadReply(failed, &sent);
    EXPECT_TRUE(sent.empty());
    LoadReply got;
    std::string error;
    ASSERT_TRUE(DecodeLoadReply(bytes, {}, &got, &error)) << error;
    EXPECT_EQ(got.kind, kind);
    EXPECT_EQ(got.error, failed.error);
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
  const std::string oom = "the BPF loader process (pid 7) " + DescribeLoaderExit(SIGKILL, false);
  EXPECT_TRUE(BpfFailureCanPass(ProbeError::kLoad, oom)) << oom;
  // Killed by us at the loader's timeout, or crashed: not a cause that passes by itself.
  EXPECT_EQ(DescribeLoaderExit(SIGKILL, true), "was killed by signal 9 (Killed)");
  EXPECT_FALSE(BpfFailureCanPass(ProbeError::kLoad, DescribeLoaderExit(SIGKILL, true)));
  EXPECT_FALSE(BpfFailureCanPass(ProbeError::kLoad, DescribeLoaderExit(SIGSEGV, false)));
  EXPECT_FALSE(BpfFailureCanPass(ProbeError::kLoad, DescribeLoaderExit(3 << 8, false)));
}

TEST(InflightSlotBits, RoundsUpToAPowerOfTwo) {
  EXPECT_EQ(InflightSlotBits(1), 1u);
  EXPECT_EQ(InflightSlotBits(1024), 10u);
  EXPECT_EQ(InflightSlotBits(1025), 11u);
}

}  // namespace
}  // namespace mergewatch
