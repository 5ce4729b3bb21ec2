// SPDX-License-Identifier: Apache-2.0
#include "topology/sysfs_tree.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <sstream>
#include <system_error>
#include <utility>

#include "topology/sysfs_beneath.h"
#include "topology/sysfs_text.h"
#include "topology/topology.h"

namespace mergewatch {
namespace topology_internal {
namespace {

namespace fs = std::filesystem;

// Same bound as the kernel's path walk (MAXSYMLINKS), so a symlink cycle in a
// broken tree ends with a warning instead of a hang.
constexpr int kMaxSymlinkHops = 40;
// Larger than any sysfs attribute (one page); bounds what a hostile fixture tree can make us hold.
constexpr size_t kMaxAttrBytes = 64 * 1024;

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '/')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

std::string JoinPath(const std::vector<std::string>& parts) {
  std::string joined;
  for (const std::string& part : parts) {
    if (!joined.empty()) joined += '/';
    joined += part;
  }
  return joined;
}

std::string NormalizeRoot(std::string root) {
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return root;
}

Lookup Fail(std::string error) {
  Lookup lookup;
  lookup.error = std::move(error);
  return lookup;
}

}  // namespace

SysfsTree::SysfsTree(const std::string& root, std::vector<std::string>* warnings)
    : root_(NormalizeRoot(root)), warnings_(warnings) {}

Lookup SysfsTree::Resolve(const std::string& rel) const {
  Lookup lookup;
  std::vector<std::string> done;
  std::deque<std::string> pending;
  for (std::string& part : SplitPath(rel)) pending.push_back(std::move(part));
  int hops = 0;
  const Entry* last = nullptr;  // the entry of JoinPath(done), once known
  while (!pending.empty()) {
    const std::string part = pending.front();
    pending.pop_front();
    if (part == ".") continue;
    if (part == "..") {
      if (done.empty()) return Fail("symlink climbs above the sysfs root");
      done.pop_back();
      last = nullptr;
      continue;
    }
    done.push_back(part);
    const Entry& entry = Stat(JoinPath(done));
    if (!entry.exists) {
      if (hops == 0) {
        lookup.error = "does not exist";
        lookup.missing = true;
        return lookup;
      }
      return Fail("dangling symlink: " + JoinPath(done) + " does not exist");
    }
    if (!entry.is_symlink) {
      last = &entry;
      continue;
    }
    if (++hops > kMaxSymlinkHops) return Fail("too many levels of symlinks");
    if (!entry.link_error.empty()) return Fail("unreadable symlink: " + entry.link_error);
    if (entry.target.is_absolute()) {
      return Fail("absolute symlink target " + entry.target.string() +
                  " refused (must stay inside the sysfs root)");
    }
    done.pop_back();  // the link itself is replaced by its target
    last = nullptr;
    const std::vector<std::string> target_parts = SplitPath(entry.target.string());
    pending.insert(pending.begin(), target_parts.begin(), target_parts.end());
  }
  lookup.rel = JoinPath(done);
  // After a trailing "..", the entry of the new last component is needed.
  if (last == nullptr) last = &Stat(lookup.rel);
  lookup.is_dir = last->is_dir;
  return lookup;
}

std::optional<std::string> SysfsTree::ReadAttr(const std::string& rel) const {
  // Fast path: resolve the directory (cached per scan), then open the file itself without
  // following a symlink, and check its type on the open descriptor: one path walk per
  // attribute instead of a stat and an open. A symlinked attribute takes the slow path.
  const std::string leaf = Basename(rel);
  if (!leaf.empty() && leaf != "." && leaf != ".." && rel.find('/') != std::string::npos) {
    const Lookup dir = Resolve(Dirname(rel));
    if (!dir.ok()) {
      if (!dir.missing) Warn(rel, dir.error);
      return std::nullopt;
    }
    const int fd = open(Full(dir.rel + "/" + leaf).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT) return std::nullopt;
    if (fd >= 0 || errno != ELOOP) return ReadOpenAttr(rel, fd);
  }
  const Lookup lookup = Resolve(rel);
  if (!lookup.ok()) {
    if (!lookup.missing) Warn(rel, lookup.error);
    return std::nullopt;
  }
  return ReadOpenAttr(rel, open(Full(lookup.rel).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
}

void SysfsTree::Warn(const std::string& rel, const std::string& problem) const {
  AppendWarning(warnings_, Full(rel) + ": " + problem);
}

std::string SysfsTree::Full(const std::string& rel) const {
  if (rel.empty()) return root_;
  return root_ == "/" ? "/" + rel : root_ + "/" + rel;
}

// Reads a whole attribute from `fd` (taking ownership; -1 means open failed, errno set).
std::optional<std::string> SysfsTree::ReadOpenAttr(const std::string& rel, int fd) const {
  if (fd < 0) {
    Warn(rel, std::string("unreadable: ") + strerror(errno));
    return std::nullopt;
  }
  if (!IsRegularFile(fd)) {
    close(fd);
    Warn(rel, "not a regular file");
    return std::nullopt;
  }
  std::string content;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      content.append(buffer, static_cast<size_t>(n));
      if (content.size() > kMaxAttrBytes) break;  // sysfs attributes are at most a page
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      Warn(rel, std::string("unreadable: ") + strerror(errno));
      return std::nullopt;
    }
    break;
  }
  close(fd);
  return Trim(content);
}

const SysfsTree::Entry& SysfsTree::Stat(const std::string& rel) const {
  const auto cached = entries_.find(rel);
  if (cached != entries_.end()) return cached->second;
  Entry entry;
  const std::string full = Full(rel);
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(full, ec);
  entry.exists = !ec && fs::exists(status);
  if (entry.exists) {
    entry.is_symlink = fs::is_symlink(status);
    entry.is_dir = fs::is_directory(status);
    if (entry.is_symlink) {
      entry.target = fs::read_symlink(full, ec);
      if (ec) entry.link_error = ec.message();
    }
  }
  // unordered_map keeps references to its elements valid across inserts.
  return entries_.emplace(rel, std::move(entry)).first->second;
}

// Missing directories yield an empty list without a warning: sysfs
// creates slaves/ and holders/ for every disk, but git cannot store them
// empty, and old kernels lack some directories entirely.
std::vector<std::string> SysfsTree::List(const std::string& rel, bool real_dirs_only) const {
  std::vector<std::string> names;
  const Lookup dir = Resolve(rel);
  if (!dir.ok()) {
    if (!dir.missing) Warn(rel, dir.error);
    return names;
  }
  std::error_code ec;
  fs::directory_iterator it(Full(dir.rel), ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (real_dirs_only) {
      // is_symlink/is_directory use the type readdir returned (sysfs fills d_type), where
      // symlink_status() would stat every entry: 28 stats per disk on 6.18 for nothing.
      std::error_code status_ec;
      if (it->is_symlink(status_ec) || status_ec || !it->is_directory(status_ec) || status_ec) continue;
    }
    names.push_back(name);
  }
  if (ec) Warn(rel, "cannot list directory: " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace topology_internal

std::optional<std::string> ReadSysfsAttribute(const std::string& sysfs_root, const std::string& rel) {
  return topology_internal::SysfsTree(sysfs_root, nullptr).ReadAttr(rel);
}

}  // namespace mergewatch
