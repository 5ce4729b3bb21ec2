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

}  // namespace
}  // namespace mergewatch
