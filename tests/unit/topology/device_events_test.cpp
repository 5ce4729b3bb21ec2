// SPDX-License-Identifier: Apache-2.0
#include "topology/device_events.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace mergewatch {
namespace {

using std::chrono::milliseconds;

std::optional<Uevent> Parse(const std::string& message) { return ParseKernelUevent(message.data(), message.size()); }

// A string literal with its embedded NULs, without the terminating one.
template <size_t N>
std::string Bytes(const char (&text)[N]) {
  return std::string(text, N - 1);
}

// As the kernel sent it at `losetup -d` on 6.18 (captured with a group-1 socket, trailing NUL included).
TEST(ParseKernelUevent, LoopChange) {
  const std::string message = Bytes(
      "change@/devices/virtual/block/loop0\0ACTION=change\0DEVPATH=/devices/virtual/block/loop0\0"
      "SUBSYSTEM=block\0DISK_MEDIA_CHANGE=1\0MAJOR=7\0MINOR=0\0DEVNAME=loop0\0DEVTYPE=disk\0DISKSEQ=3168\0"
      "SEQNUM=5562\0");
  const auto event = Parse(message);
  ASSERT_TRUE(event);
  EXPECT_EQ(event->action, "change");
  EXPECT_EQ(event->devpath, "/devices/virtual/block/loop0");
  EXPECT_EQ(event->subsystem, "block");
  EXPECT_EQ(event->devname, "loop0");
}

TEST(ParseKernelUevent, OtherSubsystemsAreParsedButNotBlock) {
  const std::string message = Bytes("add@/devices/virtual/bdi/7:3\0ACTION=add\0DEVPATH=/devices/virtual/bdi/7:3\0"
                                     "SUBSYSTEM=bdi\0");
  const auto event = Parse(message);
  ASSERT_TRUE(event);
  EXPECT_EQ(event->subsystem, "bdi");
  EXPECT_EQ(event->devname, "");
}

TEST(ParseKernelUevent, RefusesWhatIsNotAKernelUevent) {
  EXPECT_FALSE(Parse(Bytes("libudev\0\xfe\xed\xca\xfe")));  // udevd's re-broadcast
  EXPECT_FALSE(Parse(""));
  EXPECT_FALSE(Parse("add@/devices/no/terminator"));  // header without its NUL
  EXPECT_FALSE(Parse(Bytes("@/devices/x\0")));
  EXPECT_FALSE(Parse(Bytes("add@\0")));
  EXPECT_FALSE(Parse(Bytes("add@devices/relative\0")));
}

TEST(ParseKernelUevent, LastFieldWithoutTerminatorAndFieldsWithoutValue) {
  const std::string message = Bytes("remove@/devices/virtual/block/loop3/loop3p1\0JUNK\0SUBSYSTEM=block\0DEVNAME=loop3p1");
  const auto event = Parse(message);
  ASSERT_TRUE(event);
  EXPECT_EQ(event->action, "remove");
  EXPECT_EQ(event->subsystem, "block");
  EXPECT_EQ(event->devname, "loop3p1");
}

TimePoint At(int ms) { return milliseconds(ms); }

TEST(RescanDebouncer, OneEventIsDueAfterTheQuietTime) {
  RescanDebouncer d(milliseconds(200), milliseconds(600));
  EXPECT_FALSE(d.pending());
  EXPECT_FALSE(d.Due(At(10'000)));
  d.OnEvent(At(1000));
  EXPECT_FALSE(d.Due(At(1199)));
  EXPECT_TRUE(d.Due(At(1200)));
  d.Done();
  EXPECT_FALSE(d.pending());
  EXPECT_FALSE(d.Due(At(5000)));
}

TEST(RescanDebouncer, ABurstIsOneRescan) {
  RescanDebouncer d(milliseconds(200), milliseconds(600));
  int rescans = 0;
  // 100 events 3 ms apart (a script attaching 100 loop devices), polled every millisecond.
  for (int t = 0; t < 2000; ++t) {
    if (t < 300 && t % 3 == 0) d.OnEvent(At(t));
    if (d.Due(At(t))) {
      ++rescans;
      d.Done();
    }
  }
  EXPECT_EQ(rescans, 1);
}

TEST(RescanDebouncer, ASteadyTrickleIsStillRescannedWithinTheMaximumDelay) {
  RescanDebouncer d(milliseconds(200), milliseconds(600));
  std::vector<int> rescan_times;
  for (int t = 0; t <= 3000; ++t) {
    if (t % 100 == 0) d.OnEvent(At(t));  // never 200 ms of quiet
    if (d.Due(At(t))) {
      rescan_times.push_back(t);
      d.Done();
    }
  }
  // First event at 0 -> due at 600; the next batch starts at 700 -> 1300; ... and the quiet
  // time after the last event (3000) -> 3200 is past the loop.
  EXPECT_EQ(rescan_times, (std::vector<int>{600, 1300, 2000, 2700}));
}

TEST(RescanDebouncer, UrgentIsDueAtOnce) {
  RescanDebouncer d(milliseconds(200), milliseconds(600));
  d.OnEvent(At(1000));
  d.Urgent(At(1050));
  EXPECT_TRUE(d.Due(At(1050)));
  d.Done();
  d.Urgent(At(3000));
  EXPECT_TRUE(d.Due(At(3000)));
}

DrainResult Events(int block, std::vector<std::string> seen, bool overrun = false) {
  DrainResult r;
  r.block_events = block;
  r.seen = std::move(seen);
  r.overrun = overrun;
  return r;
}

TEST(RescanPlanner, BlockEventsMakeADebouncedRescanDueAndSayWhich) {
  RescanPlanner p(milliseconds(200), milliseconds(600));
  p.Add(Events(0, {}), At(0));
  EXPECT_FALSE(p.pending());  // a drain of other subsystems' events only
  p.Add(Events(2, {"add loop7", "change loop7"}), At(100));
  p.Add(Events(1, {"add loop7"}), At(150));
  bool lost = true;
  EXPECT_FALSE(p.TakeDue(At(349), &lost));
  const auto why = p.TakeDue(At(350), &lost);
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "3 block device events: add loop7, change loop7, ...");
  EXPECT_FALSE(lost);
  EXPECT_FALSE(p.pending());
}

TEST(RescanPlanner, LostEventsMakeARescanDueAtOnceEvenWithoutABlockEvent) {
  RescanPlanner p(milliseconds(200), milliseconds(600));
  p.Add(Events(0, {}, /*overrun=*/true), At(1000));  // the queue held only bdi events
  bool lost = false;
  const auto why = p.TakeDue(At(1000), &lost);
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "0 block device events; events were lost");
  EXPECT_TRUE(lost);
  EXPECT_FALSE(p.TakeDue(At(5000), &lost));  // once
}

TEST(RescanPlanner, ListsAtMostEightDistinctEvents) {
  RescanPlanner p(milliseconds(200), milliseconds(600));
  for (int i = 0; i < 20; ++i) p.Add(Events(1, {"add loop" + std::to_string(i)}), At(i));
  bool lost = false;
  const auto why = p.TakeDue(At(1000), &lost);
  ASSERT_TRUE(why);
  EXPECT_EQ(*why, "20 block device events: add loop0, add loop1, add loop2, add loop3, add loop4, add loop5, "
                  "add loop6, add loop7, ...");
}

}  // namespace
}  // namespace mergewatch
