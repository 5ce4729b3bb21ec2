// SPDX-License-Identifier: Apache-2.0
// The pure parsers of sysfs text (sysfs_text.h, and the ones topology.h declares): strings in,
// values out, no tree needed.
#include "topology/sysfs_text.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "topology/topology.h"

namespace mergewatch {
namespace {

TEST(TopologyParseLvmName, UnescapesDoubledDashes) {
  const std::string ids(64, 'a');
  const auto plain = ParseLvmName("my--vg-data", "LVM-" + ids);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->vg, "my-vg");
  EXPECT_EQ(plain->lv, "data");
  EXPECT_EQ(plain->layer, "");

  const auto layered = ParseLvmName("vg-my--lv--x-real", "LVM-" + ids + "-real");
  ASSERT_TRUE(layered.has_value());
  EXPECT_EQ(layered->vg, "vg");
  EXPECT_EQ(layered->lv, "my-lv-x");
  EXPECT_EQ(layered->layer, "real");

  // "a-" as VG: "a--" then the separator.
  const auto trailing = ParseLvmName("a---lv", "LVM-" + ids);
  ASSERT_TRUE(trailing.has_value());
  EXPECT_EQ(trailing->vg, "a-");
  EXPECT_EQ(trailing->lv, "lv");
}

TEST(TopologyParseLvmName, LayerComesFromUuid) {
  const std::string ids(64, 'b');
  const auto cow = ParseLvmName("vg-snap-cow", "LVM-" + ids + "-cow");
  ASSERT_TRUE(cow.has_value());
  EXPECT_EQ(cow->lv, "snap");
  EXPECT_EQ(cow->layer, "cow");
}

TEST(TopologyParseLvmName, RejectsNonLvm) {
  const std::string ids(64, 'c');
  EXPECT_FALSE(ParseLvmName("mpatha", "mpath-3600a0980").has_value());
  EXPECT_FALSE(ParseLvmName("vg-lv", "LVM-short").has_value());
  EXPECT_FALSE(ParseLvmName("novg", "LVM-" + ids).has_value());
  EXPECT_FALSE(ParseLvmName("a-b-c-d", "LVM-" + ids).has_value());
  EXPECT_FALSE(ParseLvmName("-lv", "LVM-" + ids).has_value());
}

TEST(TopologyParseScheduler, BracketsAndBareNone) {
  EXPECT_EQ(ParseScheduler("[none] mq-deadline"), "none");
  EXPECT_EQ(ParseScheduler("none [mq-deadline] kyber bfq"), "mq-deadline");
  EXPECT_EQ(ParseScheduler("none"), "none");
  EXPECT_EQ(ParseScheduler("noop deadline [cfq]"), "cfq");  // legacy single-queue
  EXPECT_FALSE(ParseScheduler("[none mq-deadline").has_value());
  EXPECT_FALSE(ParseScheduler("mq-deadline").has_value());
  EXPECT_FALSE(ParseScheduler("[]").has_value());
}

TEST(TopologyNvmeMultipath, HeadNameFollowsTheKernelsNaming) {
  EXPECT_EQ(MultipathHeadOf("nvme2c1n1"), std::optional<std::string>("nvme2n1"));
  EXPECT_EQ(MultipathHeadOf("nvme10c23n4"), std::optional<std::string>("nvme10n4"));
  for (const char* other : {"nvme2n1", "nvme0n1p1", "nvme2c1n", "nvmec1n1", "nvme2c1n1p1", "nvme2cxn1", "sda"})
    EXPECT_FALSE(MultipathHeadOf(other).has_value()) << other;
}

TEST(TopologyParseSchedulerList, EveryNameInFileOrder) {
  using List = std::vector<std::string>;
  EXPECT_EQ(ParseSchedulerList("[none] mq-deadline kyber"), (List{"none", "mq-deadline", "kyber"}));
  EXPECT_EQ(ParseSchedulerList("none [mq-deadline] bfq\n"), (List{"none", "mq-deadline", "bfq"}));
  EXPECT_EQ(ParseSchedulerList("none"), (List{"none"}));
  EXPECT_TRUE(ParseSchedulerList("").empty());
  EXPECT_TRUE(ParseSchedulerList("[]").empty());
}

// The helpers the readers share (sysfs_text.h).
TEST(TopologySysfsText, ParseDevNumberKeepsToTheKernelsDevT) {
  using topology_internal::ParseDevNumber;
  using DevNumber = std::optional<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(ParseDevNumber("259:3"), DevNumber(std::make_pair(259u, 3u)));
  EXPECT_EQ(ParseDevNumber("7:1048575"), DevNumber(std::make_pair(7u, (1u << 20) - 1)));  // MW_MINORMASK
  EXPECT_EQ(ParseDevNumber("4095:0"), DevNumber(std::make_pair(4095u, 0u)));               // MW_MAJORMASK
  for (const char* bad : {"7:1048576", "4096:0", "259", "259:", ":3", "259:x", "-1:0", "259:3 ", "+7:0"})
    EXPECT_FALSE(ParseDevNumber(bad).has_value()) << bad;
  EXPECT_EQ(topology_internal::DevNumberText(259, 3), "259:3");
}

TEST(TopologySysfsText, ParseDecimalWholeStringWithinBounds) {
  using topology_internal::ParseDecimal;
  EXPECT_EQ(ParseDecimal<int>("2", 0, 2), std::optional<int>(2));
  EXPECT_FALSE(ParseDecimal<int>("3", 0, 2).has_value());
  EXPECT_FALSE(ParseDecimal<int>("", 0, 2).has_value());
  EXPECT_FALSE(ParseDecimal<int>("1x", 0, 2).has_value());
  EXPECT_FALSE(ParseDecimal<uint64_t>("-5", 0, UINT64_MAX).has_value());
  EXPECT_FALSE(ParseDecimal<uint32_t>("4294967296", 0, UINT32_MAX).has_value());  // overflow
}

TEST(TopologySysfsText, TrimAndPathParts) {
  using namespace topology_internal;
  EXPECT_EQ(Trim(" \t[none] mq-deadline\r\n"), "[none] mq-deadline");
  EXPECT_EQ(Trim(" \n"), "");
  EXPECT_TRUE(StartsWith("LVM-abc", "LVM-"));
  EXPECT_FALSE(StartsWith("LV", "LVM-"));
  EXPECT_EQ(Basename("devices/virtual/block/loop0"), "loop0");
  EXPECT_EQ(Dirname("devices/virtual/block/loop0"), "devices/virtual/block");
  EXPECT_EQ(Basename("loop0"), "loop0");
  EXPECT_EQ(Dirname("loop0"), "");
  std::vector<std::string> warnings;
  AppendWarning(&warnings, "one");
  AppendWarning(nullptr, "dropped");
  EXPECT_EQ(warnings, std::vector<std::string>{"one"});
}
}  // namespace
}  // namespace mergewatch
