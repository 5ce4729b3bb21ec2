// SPDX-License-Identifier: Apache-2.0
#include "topology/device_namer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <sys/stat.h>

namespace mergewatch {
namespace {

namespace fs = std::filesystem;

TEST(SysfsDeviceNamer, NamesDevicesOfAFixtureTree) {
  SysfsDeviceNamer namer(std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/seed-lvm-snapshot");
  EXPECT_EQ(namer.NameOf(259, 0), "nvme1n1");
  EXPECT_EQ(namer.NameOf(253, 3), "dm-3");
  EXPECT_EQ(namer.NameOf(7, 99), std::nullopt);
}

// Native NVMe multipath: a path disk's key (its gendisk's 259:1 on 6.1, in no sysfs file)
// is named after the head by its diskseq; without a diskseq, or with one nobody has,
// it stays unresolved.
TEST(SysfsDeviceNamer, MultipathPathKeysAreNamedAfterTheHead) {
  SysfsDeviceNamer namer(std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/nvme-multipath");
  EXPECT_EQ(namer.NameOf(259, 1, 2), "nvme2n1");
  EXPECT_EQ(namer.NameOf(259, 1, 2), "nvme2n1");  // from the cache, checked against sysfs
  EXPECT_EQ(namer.NameOf(259, 0, 1), "nvme2n1");
  EXPECT_EQ(namer.NameOf(259, 1, 0), std::nullopt);
  EXPECT_EQ(namer.NameOf(259, 1, 77), std::nullopt);
  EXPECT_EQ(namer.NameOf(259, 2, 3), "nvme2n1");
  EXPECT_EQ(namer.NameOf(259, 3, 4), "nvme0n1");
}

TEST(SysfsDeviceNamer, MinorsAboveTwoFiftyFive) {
  SysfsDeviceNamer namer(std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/big-minors");
  EXPECT_EQ(namer.NameOf(7, 300), "loop300");
}

// A tiny sysfs with one device whose major:minor we re-point, as the kernel does when a
// number is freed and handed to another device.
class ReusedNumber : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(testing::TempDir()) / ("namer-" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "dev/block");
    fs::create_directories(root_ / "block");
  }
  void TearDown() override { fs::remove_all(root_); }
  void Attach(const std::string& name, const std::string& devnum) {
    fs::path dir = root_ / "devices/virtual/block" / name;
    fs::create_directories(dir);
    std::ofstream(dir / "dev") << devnum << "\n";
    fs::remove(root_ / "dev/block" / devnum);
    fs::create_directory_symlink("../../devices/virtual/block/" + name, root_ / "dev/block" / devnum);
    fs::remove(root_ / "block" / name);
    fs::create_directory_symlink("../devices/virtual/block/" + name, root_ / "block" / name);
  }
  void Detach(const std::string& name, const std::string& devnum) {
    fs::remove(root_ / "dev/block" / devnum);
    fs::remove(root_ / "block" / name);
    fs::remove_all(root_ / "devices/virtual/block" / name);
  }
  fs::path root_;
};

TEST_F(ReusedNumber, NewDeviceOnAnOldNumberGetsItsNewName) {
  SysfsDeviceNamer namer(root_.string());
  EXPECT_EQ(namer.NameOf(259, 3), std::nullopt);  // not there yet
  Attach("nvme0n1p3", "259:3");
  EXPECT_EQ(namer.NameOf(259, 3), "nvme0n1p3");   // resolved when first seen
  Detach("nvme0n1p3", "259:3");
  EXPECT_EQ(namer.NameOf(259, 3), std::nullopt);  // removed: its series disappear
  Attach("nvme1n1", "259:3");
  EXPECT_EQ(namer.NameOf(259, 3), "nvme1n1");     // reused number, new name
}

// With a diskseq the name comes from the cache while the number's diskseq file still reads the
// one it was resolved for (no readlink); any other diskseq, or none, resolves again.
TEST_F(ReusedNumber, CachedNameOnlyForTheDiskseqItWasResolvedFor) {
  SysfsDeviceNamer namer(root_.string());
  const fs::path diskseq = root_ / "devices/virtual/block/loop0/diskseq";
  Attach("loop0", "7:0");
  std::ofstream(diskseq) << "5\n";
  EXPECT_EQ(namer.NameOf(7, 0, 5), "loop0");
  EXPECT_EQ(namer.NameOf(7, 0, 5), "loop0");      // from the cache
  Detach("loop0", "7:0");
  EXPECT_EQ(namer.NameOf(7, 0, 5), std::nullopt);  // removed: gone at once
  Attach("loop0", "7:0");
  std::ofstream(diskseq) << "6\n";
  EXPECT_EQ(namer.NameOf(7, 0, 5), std::nullopt);  // the predecessor's key
  EXPECT_EQ(namer.NameOf(7, 0, 6), "loop0");
  Detach("loop0", "7:0");
  Attach("vdz", "7:0");  // another disk on the number, the cache still holding loop0 at 6
  std::ofstream(root_ / "devices/virtual/block/vdz/diskseq") << "7\n";
  EXPECT_EQ(namer.NameOf(7, 0, 7), "vdz");
  EXPECT_EQ(namer.NameOf(7, 0, 6), std::nullopt);
}

// The namer runs under the scrape: a FIFO where diskseq should be must not block it (open
// without O_NONBLOCK waits for a writer forever), and a symlinked diskseq pointing out of the
// tree must not be followed.
TEST_F(ReusedNumber, OddDiskseqFilesNeitherBlockNorLeaveTheTree) {
  Attach("loop0", "7:0");
  const fs::path diskseq = root_ / "devices/virtual/block/loop0/diskseq";
  ASSERT_EQ(mkfifo(diskseq.c_str(), 0600), 0);
  SysfsDeviceNamer namer(root_.string());
  // A detached thread, so that a blocked open() fails this test instead of hanging the binary.
  auto promise = std::make_shared<std::promise<std::optional<std::string>>>();
  std::future<std::optional<std::string>> result = promise->get_future();
  std::thread([promise, root = root_.string()] {
    SysfsDeviceNamer fresh(root);
    promise->set_value(fresh.NameOf(7, 0, 42));
  }).detach();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "NameOf blocked on a FIFO";
  EXPECT_EQ(result.get(), "loop0");  // unreadable diskseq: unknown, not a mismatch

  fs::remove(diskseq);
  std::ofstream(root_ / "outside-diskseq") << "7\n";
  fs::create_symlink(root_ / "outside-diskseq", diskseq);  // absolute: leaves the root
  EXPECT_EQ(namer.NameOf(7, 0, 42), "loop0");              // 7 was not read: no mismatch
  fs::remove(diskseq);
  std::ofstream(diskseq) << "7\n";
  EXPECT_EQ(namer.NameOf(7, 0, 42), std::nullopt);  // a real diskseq of another incarnation
}

}  // namespace
}  // namespace mergewatch
