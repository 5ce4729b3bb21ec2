// SPDX-License-Identifier: Apache-2.0
#include "topology/sysfs_beneath.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace mergewatch {
namespace {

namespace fs = std::filesystem;

// Hostile trees: what a reader beneath the root must never open.
TEST(OpenBeneath, OpensRegularFilesInsideTheRootOnly) {
  char dir[] = "/tmp/mw-beneath-XXXXXX";
  const std::string root = mkdtemp(dir);
  fs::create_directories(root + "/devices/loop0/queue");
  std::ofstream(root + "/devices/loop0/queue/nomerges") << "0\n";
  fs::create_directories(root + "/block");
  fs::create_symlink("../devices/loop0", root + "/block/loop0");       // sysfs's own shape: relative, inside
  fs::create_symlink("/etc", root + "/block/escape");                    // absolute: leaves the root
  fs::create_symlink("../../..", root + "/block/climb");                 // climbs above the root
  ASSERT_EQ(mkfifo((root + "/devices/loop0/queue/fifo").c_str(), 0600), 0);
  const int root_fd = OpenSysfsRoot(root);
  ASSERT_GE(root_fd, 0);
  bool unsupported = false;
  const int fd = OpenBeneath(root_fd, "block/loop0/queue/nomerges", &unsupported);
  if (fd < 0 && unsupported) GTEST_SKIP() << "no openat2 here";
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(OpenBeneath(root_fd, "block/escape/hostname", &unsupported), -1);
  EXPECT_FALSE(unsupported);
  EXPECT_EQ(OpenBeneath(root_fd, "block/climb/etc/hostname", &unsupported), -1);
  EXPECT_EQ(OpenBeneath(root_fd, "block/loop0/queue/fifo", &unsupported), -1);  // never blocks
  EXPECT_EQ(OpenBeneath(root_fd, "block/loop0/queue", &unsupported), -1);       // a directory
  EXPECT_EQ(OpenBeneath(-1, "block/loop0/queue/nomerges", &unsupported), -1);
  EXPECT_TRUE(unsupported);
  close(root_fd);
  fs::remove_all(root);
}

}  // namespace
}  // namespace mergewatch
