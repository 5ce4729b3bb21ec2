// SPDX-License-Identifier: Apache-2.0
#include "topology/block_ids.h"

#include <gtest/gtest.h>

namespace mergewatch {
namespace {

TEST(KernelDevt, DecodesMajorAndMinorWithTwentyMinorBits) {
  EXPECT_EQ(KernelDevMajor(KernelMkdev(259, 0)), 259u);
  EXPECT_EQ(KernelDevMinor(KernelMkdev(259, 0)), 0u);
  // (253 << 20) | 3: dm-3 as a tracepoint's dev field carries it
  EXPECT_EQ(KernelDevMajor(0x0FD00003), 253u);
  EXPECT_EQ(KernelDevMinor(0x0FD00003), 3u);
}

TEST(KernelDevt, MinorsAboveTwoFiftyFiveSurvive) {
  // The userspace encoding splits minors at 8 bits; the kernel's does not.
  EXPECT_EQ(KernelDevMinor(KernelMkdev(7, 256)), 256u);
  EXPECT_EQ(KernelDevMajor(KernelMkdev(7, 256)), 7u);
  EXPECT_EQ(KernelDevMinor(KernelMkdev(259, 1048575)), 1048575u);
  EXPECT_EQ(KernelDevMajor(KernelMkdev(259, 1048575)), 259u);
  EXPECT_EQ(KernelDevMinor(KernelMkdev(4095, 300)), 300u);
  EXPECT_EQ(KernelDevMajor(KernelMkdev(4095, 300)), 4095u);
}

TEST(OpLabel, NamesTheStableOperationsAndFoldsTheRest) {
  EXPECT_STREQ(OpLabel(0), "read");
  EXPECT_STREQ(OpLabel(1), "write");
  EXPECT_STREQ(OpLabel(2), "flush");
  EXPECT_STREQ(OpLabel(3), "discard");
  EXPECT_STREQ(OpLabel(9), "write_zeroes");
  EXPECT_STREQ(OpLabel(5), "other");   // secure erase
  EXPECT_STREQ(OpLabel(7), "other");   // zone append
  EXPECT_STREQ(OpLabel(34), "other");  // driver passthrough
}

}  // namespace
}  // namespace mergewatch
