// SPDX-License-Identifier: Apache-2.0
// The topology reader's view of a sysfs tree, which never leaves its root: every path is walked
// one component at a time with one lstat each, and every symlink is resolved relative to the
// root by reading it, so an absolute target or a ".." above the root is refused with a warning
// and a fixture tree can never read the host's /sys. Portable (no openat2); the readers that run
// often open single attributes with sysfs_beneath.h instead, in one system call.
//
// Internal to daemon/topology/: device_reader.cpp reads devices through it, and
// ReadSysfsAttribute (topology.h) reads one attribute with it.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace mergewatch {
namespace topology_internal {

// Outcome of resolving a path inside the root.
struct Lookup {
  std::string rel;       // canonical path relative to the root, symlink-free
  std::string error;     // empty on success
  bool missing = false;  // the path itself does not exist (no symlink involved)
  bool is_dir = false;   // what `rel` is, when ok()
  bool ok() const { return error.empty(); }
};

// One scan's view of a sysfs tree that never leaves its root. Every path
// component seen is stat'ed (and read, when a symlink) once per instance:
// a full scan reads about ten attributes per device through the same few
// directories, and stat'ing each prefix anew made a rescan of 99 devices
// cost 75 ms of CPU (measured with perf on 6.18). An instance lives for one
// scan, so the cache never outlives what it describes by more than that.
class SysfsTree {
 public:
  // Problems are appended to `warnings` (may be nullptr), prefixed with the full path.
  SysfsTree(const std::string& root, std::vector<std::string>* warnings);

  // Walks `rel` one component at a time, replacing each symlink by its target
  // read with readlink, so ".." and relative targets are interpreted exactly
  // as the kernel would but never above the root. realpath() is not used: it
  // would happily follow an absolute target into the host's /sys.
  Lookup Resolve(const std::string& rel) const;

  bool Exists(const std::string& rel) const { return Resolve(rel).ok(); }

  bool IsDir(const std::string& rel) const {
    const Lookup lookup = Resolve(rel);
    return lookup.ok() && lookup.is_dir;
  }

  // Attribute content, trimmed. nullopt when absent (silently: callers know
  // which attributes are optional) or unreadable (with a warning).
  std::optional<std::string> ReadAttr(const std::string& rel) const;

  // Names in a directory, sorted. Dot-files are skipped: kernel names never
  // start with '.', and fixtures use ".keep" files so git stores the dirs.
  std::vector<std::string> ListNames(const std::string& rel) const {
    return List(rel, /*real_dirs_only=*/false);
  }

  // Like ListNames but only real (non-symlink) subdirectories.
  std::vector<std::string> ListRealSubdirs(const std::string& rel) const {
    return List(rel, /*real_dirs_only=*/true);
  }

  void Warn(const std::string& rel, const std::string& problem) const;

 private:
  // What one path (relative to the root, symlink-free up to its last
  // component) is.
  struct Entry {
    bool exists = false;
    bool is_symlink = false;
    bool is_dir = false;
    std::filesystem::path target;  // when is_symlink
    std::string link_error;        // when is_symlink and readlink failed
  };

  std::string Full(const std::string& rel) const;
  std::optional<std::string> ReadOpenAttr(const std::string& rel, int fd) const;
  const Entry& Stat(const std::string& rel) const;
  std::vector<std::string> List(const std::string& rel, bool real_dirs_only) const;

  std::string root_;
  std::vector<std::string>* warnings_;
  mutable std::unordered_map<std::string, Entry> entries_;
};

}  // namespace topology_internal
}  // namespace mergewatch
