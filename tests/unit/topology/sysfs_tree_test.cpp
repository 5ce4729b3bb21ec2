// SPDX-License-Identifier: Apache-2.0
// The contained walk (sysfs_tree.h) on small trees built in a temp dir: what it follows, what it
// refuses, and which problems it warns about. The same defences seen through a whole scan are in
// device_reader_test.cpp (the "malformed" fixture).
#include "topology/sysfs_tree.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/unit/topology/sysfs_fixtures.h"
#include "topology/topology.h"

namespace mergewatch {
namespace {

namespace fs = std::filesystem;
using topology_internal::Lookup;
using topology_internal::SysfsTree;
using topology_test::ContainsSubstring;
using topology_test::Names;

// A sysfs-shaped tree: block/loop0 -> ../devices/virtual/block/loop0, with hostile entries beside it.
class SysfsTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/mw-sysfs-tree-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
    const std::string loop = root_ + "/devices/virtual/block/loop0";
    fs::create_directories(loop + "/queue");
    fs::create_directories(loop + "/holders");
    fs::create_directories(loop + "/mq/0");
    fs::create_symlink("../../../../devices/virtual/block/loop0", loop + "/mq/link");  // not a real subdir
    std::ofstream(loop + "/dev") << "7:0\n";
    std::ofstream(loop + "/.keep") << "";
    std::ofstream(loop + "/queue/nomerges") << "  2 \n";
    fs::create_symlink("nomerges", loop + "/queue/alias");  // a symlinked attribute: the slow path
    ASSERT_EQ(mkfifo((loop + "/queue/fifo").c_str(), 0600), 0);
    fs::create_directories(root_ + "/block");
    fs::create_symlink("../devices/virtual/block/loop0", root_ + "/block/loop0");
    fs::create_symlink("/etc", root_ + "/block/absolute");
    fs::create_symlink("../..", root_ + "/block/climb");
    fs::create_symlink("../devices/none", root_ + "/block/dangling");
    fs::create_symlink("cycle", root_ + "/block/cycle");
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string root_;
  std::vector<std::string> warnings_;
};

TEST_F(SysfsTreeTest, ResolvesRelativeLinksToCanonicalPaths) {
  const SysfsTree tree(root_ + "/", &warnings_);  // a trailing slash is dropped
  const Lookup loop = tree.Resolve("block/loop0");
  ASSERT_TRUE(loop.ok()) << loop.error;
  EXPECT_EQ(loop.rel, "devices/virtual/block/loop0");
  EXPECT_TRUE(loop.is_dir);
  EXPECT_EQ(tree.Resolve("block/loop0/queue/../dev").rel, "devices/virtual/block/loop0/dev");
  EXPECT_FALSE(tree.Resolve("block/loop0/dev").is_dir);
  EXPECT_TRUE(tree.IsDir("block/loop0/queue"));
  EXPECT_TRUE(tree.Exists("block/loop0/dev"));
  EXPECT_FALSE(tree.Exists("block/loop1"));
  EXPECT_TRUE(tree.Resolve("block/loop1").missing);
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(SysfsTreeTest, RefusesWhatLeavesTheRoot) {
  const SysfsTree tree(root_, &warnings_);
  EXPECT_NE(tree.Resolve("block/absolute").error.find("absolute symlink target /etc refused"), std::string::npos);
  EXPECT_EQ(tree.Resolve("block/climb/etc").error, "symlink climbs above the sysfs root");
  EXPECT_EQ(tree.Resolve("..").error, "symlink climbs above the sysfs root");
  EXPECT_EQ(tree.Resolve("block/cycle").error, "too many levels of symlinks");
  const Lookup dangling = tree.Resolve("block/dangling");
  EXPECT_FALSE(dangling.missing);  // the link exists: a broken tree, not an absent device
  EXPECT_NE(dangling.error.find("dangling symlink"), std::string::npos);
  EXPECT_FALSE(tree.ReadAttr("block/absolute/hostname").has_value());
  EXPECT_TRUE(ContainsSubstring(warnings_, root_ + "/block/absolute/hostname: absolute symlink target"));
}

TEST_F(SysfsTreeTest, ReadsRegularAttributesOnly) {
  const SysfsTree tree(root_, &warnings_);
  EXPECT_EQ(tree.ReadAttr("block/loop0/queue/nomerges"), std::optional<std::string>("2"));  // trimmed
  EXPECT_EQ(tree.ReadAttr("block/loop0/queue/alias"), std::optional<std::string>("2"));
  EXPECT_EQ(tree.ReadAttr("block/loop0/queue/missing"), std::nullopt);
  EXPECT_EQ(tree.ReadAttr("block/loop1/dev"), std::nullopt);
  EXPECT_TRUE(warnings_.empty()) << "absent attributes are silent";
  EXPECT_EQ(tree.ReadAttr("block/loop0/queue/fifo"), std::nullopt);  // never blocks
  EXPECT_EQ(tree.ReadAttr("block/loop0/queue"), std::nullopt);       // a directory
  ASSERT_EQ(warnings_.size(), 2u);
  EXPECT_NE(warnings_[0].find("queue/fifo: not a regular file"), std::string::npos) << warnings_[0];
  EXPECT_EQ(ReadSysfsAttribute(root_, "block/loop0/dev"), std::optional<std::string>("7:0"));
}

TEST_F(SysfsTreeTest, ListsSortedNamesWithoutDotFiles) {
  const SysfsTree tree(root_, &warnings_);
  EXPECT_EQ(tree.ListNames("block"), (Names{"absolute", "climb", "cycle", "dangling", "loop0"}));
  EXPECT_EQ(tree.ListNames("block/loop0"), (Names{"dev", "holders", "mq", "queue"}));
  EXPECT_EQ(tree.ListRealSubdirs("block/loop0"), (Names{"holders", "mq", "queue"}));
  EXPECT_EQ(tree.ListRealSubdirs("block/loop0/mq"), (Names{"0"}));
  // A missing directory is empty, silently, where the path has no symlink (the readers list the
  // canonical device directory's slaves/ and holders/); past a symlink it is a dangling link.
  EXPECT_TRUE(tree.ListNames("devices/virtual/block/loop0/slaves").empty());
  EXPECT_TRUE(warnings_.empty()) << warnings_.front();
  EXPECT_TRUE(tree.ListNames("block/loop0/slaves").empty());
  EXPECT_TRUE(ContainsSubstring(warnings_, "block/loop0/slaves: dangling symlink"));
  EXPECT_TRUE(tree.ListNames("block/climb").empty());
  EXPECT_TRUE(ContainsSubstring(warnings_, "block/climb: symlink climbs above the sysfs root"));
}

}  // namespace
}  // namespace mergewatch
