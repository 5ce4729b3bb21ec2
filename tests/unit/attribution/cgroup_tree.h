// SPDX-License-Identifier: Apache-2.0
// A stand-in for a cgroup2 mount: plain directories in a temporary folder, and a fake id source
// that gives each directory the id the test chose (kernfs ids are not what a plain filesystem's
// inodes are). Paths may be longer than PATH_MAX: directories are made component by component.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attribution/cgroup_names.h"

namespace mergewatch {
namespace attribution_test {

class CgroupTree {
 public:
  CgroupTree() {
    root_ = testing::TempDir() + "/cgroup2." + std::to_string(getpid()) + "." + std::to_string(counter()++);
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    ids_[Inode("")] = 1;  // the root cgroup, as on a 64-bit kernel
  }
  ~CgroupTree() {
    // remove_all cannot handle paths past PATH_MAX either: remove beneath, deepest first.
    // Each made path and its parents, longest first; a directory still holding others stays
    // until its last child goes.
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      for (std::string path = *it; !path.empty(); path.resize(path.rfind('/'))) Remove(path);
    }
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }

  const std::string& root() const { return root_; }

  // Makes the directory at a relative path ("/a/b", parents made first) and gives it an id.
  void Make(const std::string& relative, uint64_t id) {
    int fd = open(root_.c_str(), O_RDONLY | O_DIRECTORY);
    size_t start = 1;
    while (fd >= 0 && start <= relative.size()) {
      const size_t end = std::min(relative.find('/', start), relative.size());
      const std::string name = relative.substr(start, end - start);
      mkdirat(fd, name.c_str(), 0755);  // EEXIST for a parent made before
      const int next = openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY);
      close(fd);
      fd = next;
      start = end + 1;
    }
    ASSERT_GE(fd, 0) << "cannot make " << relative.size() << "-byte path";
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    close(fd);
    ids_[st.st_ino] = id;
    made_.push_back(relative);
  }

  // Removes the directory (and forgets its inode: a new directory may reuse the number).
  void Remove(const std::string& relative) {
    const size_t slash = relative.rfind('/');
    const int parent = OpenRelative(relative.substr(0, slash));
    if (parent < 0) return;
    struct stat st;
    if (fstatat(parent, relative.c_str() + slash + 1, &st, AT_SYMLINK_NOFOLLOW) == 0) ids_.erase(st.st_ino);
    unlinkat(parent, relative.c_str() + slash + 1, AT_REMOVEDIR);
    close(parent);
  }

  void Rename(const std::string& from, const std::string& to) {
    ASSERT_EQ(rename((root_ + from).c_str(), (root_ + to).c_str()), 0);
  }

  IdSource Source() {
    return [this](int fd) -> std::optional<uint64_t> {
      ++id_reads_;
      struct stat st;
      if (fstat(fd, &st) != 0) return std::nullopt;
      auto it = ids_.find(st.st_ino);
      if (it == ids_.end()) return std::nullopt;
      return it->second;
    };
  }

  uint64_t id_reads() const { return id_reads_; }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }

  ino_t Inode(const std::string& relative) {
    struct stat st;
    EXPECT_EQ(stat((root_ + relative).c_str(), &st), 0);
    return st.st_ino;
  }

  int OpenRelative(const std::string& relative) {
    int fd = open(root_.c_str(), O_RDONLY | O_DIRECTORY);
    size_t start = 1;
    while (fd >= 0 && start <= relative.size() && !relative.empty()) {
      const size_t end = std::min(relative.find('/', start), relative.size());
      const int next = openat(fd, relative.substr(start, end - start).c_str(), O_RDONLY | O_DIRECTORY);
      close(fd);
      fd = next;
      start = end + 1;
    }
    return fd;
  }

  std::string root_;
  std::map<ino_t, uint64_t> ids_;
  std::vector<std::string> made_;
  uint64_t id_reads_ = 0;
};

}  // namespace attribution_test
}  // namespace mergewatch
