// SPDX-License-Identifier: Apache-2.0
#include "config_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace mergewatch {
namespace {

class ConfigFileTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/config-file-" + std::to_string(getpid());
    ASSERT_EQ(system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str()), 0);
  }
  void TearDown() override { ASSERT_EQ(system(("rm -rf " + dir_).c_str()), 0); }
  std::string dir_;
};

TEST_F(ConfigFileTest, ReadsARegularFileWholeWithEveryByte) {
  std::string bytes = "tls_server_config:\n";
  bytes += std::string("\0\xff\n", 3);
  bytes += std::string(20000, 'x');  // over one read's buffer
  std::ofstream(dir_ + "/web.yml", std::ios::binary) << bytes;
  std::string content = "old", error;
  ASSERT_TRUE(ReadConfigFile(dir_ + "/web.yml", &content, &error)) << error;
  EXPECT_EQ(content, bytes);
  std::ofstream(dir_ + "/empty");  // empty is a file like any other: the caller judges its content
  ASSERT_TRUE(ReadConfigFile(dir_ + "/empty", &content, &error)) << error;
  EXPECT_EQ(content, "");
  ASSERT_EQ(symlink("web.yml", (dir_ + "/link.yml").c_str()), 0);  // as Kubernetes mounts secrets
  ASSERT_TRUE(ReadConfigFile(dir_ + "/link.yml", &content, &error)) << error;
  EXPECT_EQ(content, bytes);
}

TEST_F(ConfigFileTest, RefusesADirectoryThatAStreamWouldReadAsEmpty) {
  std::string content = "kept", error;
  EXPECT_FALSE(ReadConfigFile(dir_, &content, &error));
  EXPECT_EQ(error, "cannot read " + dir_ + ": a directory, not a file");
  EXPECT_EQ(content, "kept");
}

TEST_F(ConfigFileTest, RefusesAFifoAtOnceInsteadOfWaitingForAWriter) {
  ASSERT_EQ(mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  std::string content, error;
  EXPECT_FALSE(ReadConfigFile(dir_ + "/fifo", &content, &error));  // would block forever if it opened blocking
  EXPECT_EQ(error, "cannot read " + dir_ + "/fifo: not a regular file");
  EXPECT_FALSE(ReadConfigFile("/dev/null", &content, &error));
  EXPECT_EQ(error, "cannot read /dev/null: not a regular file");
}

TEST_F(ConfigFileTest, SaysWhyAFileCannotBeOpened) {
  std::string content, error;
  EXPECT_FALSE(ReadConfigFile(dir_ + "/missing.yml", &content, &error));
  EXPECT_EQ(error, "cannot read " + dir_ + "/missing.yml: No such file or directory");
  EXPECT_FALSE(ReadConfigFile(dir_ + "/missing/web.yml", &content, &error));
  EXPECT_EQ(error, "cannot read " + dir_ + "/missing/web.yml: No such file or directory");
}

TEST_F(ConfigFileTest, RefusesAFileLargerThanAnyConfiguration) {
  ASSERT_EQ(truncate((std::ofstream(dir_ + "/image"), dir_ + "/image").c_str(), kConfigFileMaxBytes + 1), 0);
  std::string content, error;
  EXPECT_FALSE(ReadConfigFile(dir_ + "/image", &content, &error));
  EXPECT_EQ(error, "cannot read " + dir_ + "/image: larger than 16 MiB");
  ASSERT_EQ(truncate((dir_ + "/image").c_str(), kConfigFileMaxBytes), 0);
  EXPECT_TRUE(ReadConfigFile(dir_ + "/image", &content, &error)) << error;
  EXPECT_EQ(content.size(), static_cast<size_t>(kConfigFileMaxBytes));
}

}  // namespace
}  // namespace mergewatch
