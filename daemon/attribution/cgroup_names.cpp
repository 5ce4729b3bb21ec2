// SPDX-License-Identifier: Apache-2.0
#include "attribution/cgroup_names.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

namespace mergewatch {

std::string LabelOf(const CgroupName& name) {
  switch (name.kind) {
    case CgroupNameKind::kService:
      return name.path;
    case CgroupNameKind::kWriteback:
      return "writeback";
    case CgroupNameKind::kKernel:
      return "kernel";
    case CgroupNameKind::kUnattributedV1:
      return "";
  }
  return "kernel";
}

std::string DisplayOf(const CgroupName& name) {
  return name.kind == CgroupNameKind::kUnattributedV1 ? "unattributed (cgroup v1)" : LabelOf(name);
}

std::string UnescapeMountinfo(const std::string& field) {
  auto is_octal = [](char c) { return c >= '0' && c <= '7'; };
  std::string out;
  out.reserve(field.size());
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] <= '3' && is_octal(field[i + 1]) &&
        is_octal(field[i + 2]) && is_octal(field[i + 3])) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

namespace {

// Calls visit(root, mount point, fstype, super options) for each well-formed mountinfo line.
// A line: "36 25 0:31 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate".
// The optional fields before " - " vary in number; the filesystem type is the first after it.
template <typename Visit>
void ForEachMount(const std::string& mountinfo, Visit visit) {
  std::istringstream lines(mountinfo);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string id, parent, devno, root, mount_point, field;
    if (!(fields >> id >> parent >> devno >> root >> mount_point)) continue;
    while (fields >> field && field != "-") {
    }
    std::string fstype, source, options;
    if (field != "-" || !(fields >> fstype)) continue;
    fields >> source >> options;
    if (visit(root, mount_point, fstype, options)) return;
  }
}

}  // namespace

std::optional<std::string> Cgroup2MountPoint(const std::string& mountinfo) {
  std::optional<std::string> found;
  ForEachMount(mountinfo, [&found](const std::string& root, const std::string& mount_point, const std::string& fstype,
                                   const std::string&) {
    if (fstype != "cgroup2" || root != "/") return false;
    found = UnescapeMountinfo(mount_point);
    return true;
  });
  return found;
}

bool IoControllerOnV1(const std::string& mountinfo) {
  bool found = false;
  ForEachMount(mountinfo, [&found](const std::string&, const std::string&, const std::string& fstype,
                                   const std::string& options) {
    found = fstype == "cgroup" && ("," + options + ",").find(",blkio,") != std::string::npos;
    return found;
  });
  return found;
}

std::optional<uint64_t> KernfsIdOf(int directory_fd) {
  // The handle of a kernfs node is 8 bytes (kernfs_encode_fh sets *max_len = 2 u32 words).
  struct {
    struct file_handle handle;
    unsigned char bytes[sizeof(uint64_t)];
  } fh{};
  fh.handle.handle_bytes = sizeof(uint64_t);
  int mount_id = 0;
  if (name_to_handle_at(directory_fd, "", &fh.handle, &mount_id, AT_EMPTY_PATH) != 0) return std::nullopt;
  if (fh.handle.handle_bytes != sizeof(uint64_t)) return std::nullopt;
  uint64_t id = 0;
  std::memcpy(&id, fh.handle.f_handle, sizeof(id));
  return id;
}

CgroupNames::CgroupNames(std::optional<std::string> mount_root, IdSource id_source, CgroupNamesOptions options)
    : mount_root_(std::move(mount_root)), id_source_(std::move(id_source)), options_(options) {}

CgroupName CgroupNames::Name(uint64_t id, CgroupSource source, TimePoint now) {
  if (source == CgroupSource::kWriteback) return {CgroupNameKind::kWriteback, ""};
  if (id == 0) return {CgroupNameKind::kKernel, ""};
  if (!mount_root_) return {CgroupNameKind::kUnattributedV1, ""};
  if (source == CgroupSource::kBlkcg && !options_.blkcg_ids_on_cgroup2) return {CgroupNameKind::kKernel, ""};
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.gone_since && now - *it->second.gone_since >= options_.grace) {
    ++stats_.expired;
    entries_.erase(it);
    it = entries_.end();
  }
  if (it == entries_.end() && (!last_scan_ || now - *last_scan_ >= options_.min_rescan_interval)) {
    Rescan(now, id);
    it = entries_.find(id);
  }
  if (it == entries_.end()) return {CgroupNameKind::kKernel, ""};
  it->second.last_used = now;
  return {CgroupNameKind::kService, it->second.path};
}

void CgroupNames::Sweep(TimePoint now) {
  if (!mount_root_) return;
  if (!last_scan_ || now - *last_scan_ >= options_.refresh_interval) Rescan(now, 0);
  Expire(now);
}

// One walk of the tree: the names of every cached id refreshed (a rename in place keeps the id),
// the ones not found marked departed, and new ids cached while there is room. The id asked for
// is cached even when the cache is full: it is the one a caller is naming now.
void CgroupNames::Rescan(TimePoint now, uint64_t wanted) {
  last_scan_ = now;
  std::unordered_map<uint64_t, std::string> found;
  Walk(&found);
  for (auto& [id, entry] : entries_) {
    auto hit = found.find(id);
    if (hit == found.end()) {
      if (!entry.gone_since) entry.gone_since = now;
      continue;
    }
    entry.path = std::move(hit->second);
    entry.gone_since.reset();
    found.erase(hit);
  }
  if (wanted != 0) {
    auto hit = found.find(wanted);
    if (hit != found.end()) {
      Insert(wanted, std::move(hit->second), now);
      found.erase(hit);
    }
  }
  for (auto& [id, path] : found) {
    if (entries_.size() >= options_.capacity) break;
    Insert(id, std::move(path), now);
  }
}

namespace {

// Opens a directory beneath the mount root. A relative path under PATH_MAX goes in one openat;
// a longer one (cgroup paths may pass it: the limit is per component) component by component,
// so no more than two descriptors are open at a time whatever the depth.
int OpenBeneath(int root_fd, const std::string& relative) {
  constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  if (relative.empty()) return fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
  if (relative.size() < PATH_MAX - 1) return openat(root_fd, relative.c_str() + 1, kFlags);
  int fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
  size_t start = 1;
  while (fd >= 0 && start <= relative.size()) {
    const size_t end = std::min(relative.find('/', start), relative.size());
    const int next = openat(fd, relative.substr(start, end - start).c_str(), kFlags);
    close(fd);
    fd = next;
    start = end + 1;
  }
  return fd;
}

}  // namespace

// Depth-first below the mount root, the mount root included (it names "/"). Directories removed
// during the walk are skipped; a directory whose path would pass kMaxCgroupPathBytes is
// counted and not named; the walk stops after max_scan_directories.
void CgroupNames::Walk(std::unordered_map<uint64_t, std::string>* found) {
  ++stats_.scans;
  const int root_fd = open(mount_root_->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) return;
  std::vector<std::string> pending{""};  // relative paths: "" for the root, else "/a/b"
  size_t directories = 0;
  while (!pending.empty()) {
    if (directories >= options_.max_scan_directories) {
      ++stats_.truncated_scans;
      break;
    }
    const std::string relative = std::move(pending.back());
    pending.pop_back();
    const int fd = OpenBeneath(root_fd, relative);
    if (fd < 0) continue;
    ++directories;
    ++stats_.directories;
    if (std::optional<uint64_t> id = id_source_(fd)) (*found)[*id] = relative.empty() ? "/" : relative;
    ReadDirectory(fd, relative, &pending);  // closes fd
  }
  close(root_fd);
}

// The subdirectories of an open directory onto *pending; takes ownership of fd. cgroupfs fills
// d_type, so the control files cost no stat.
void CgroupNames::ReadDirectory(int fd, const std::string& relative, std::vector<std::string>* pending) {
  DIR* stream = fdopendir(fd);
  if (stream == nullptr) {
    close(fd);
    return;
  }
  while (const dirent* entry = readdir(stream)) {
    const char* name = entry->d_name;
    if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
    bool directory = entry->d_type == DT_DIR;
    struct stat st;
    if (entry->d_type == DT_UNKNOWN) {
      directory = fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (!directory) continue;
    std::string child = relative + "/" + name;
    if (child.size() > kMaxCgroupPathBytes) {
      ++stats_.too_long_paths;
      continue;
    }
    pending->push_back(std::move(child));
  }
  closedir(stream);
}

void CgroupNames::Insert(uint64_t id, std::string path, TimePoint now) {
  if (entries_.size() >= options_.capacity && entries_.count(id) == 0 && !EvictOne()) return;
  Entry& entry = entries_[id];
  entry.path = std::move(path);
  entry.gone_since.reset();
  entry.last_used = now;
}

// Departed entries go first (the oldest departure), then the least recently named live one.
bool CgroupNames::EvictOne() {
  auto victim = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (victim == entries_.end()) {
      victim = it;
      continue;
    }
    const Entry& a = it->second;
    const Entry& b = victim->second;
    if (a.gone_since.has_value() != b.gone_since.has_value()) {
      if (a.gone_since) victim = it;
      continue;
    }
    const TimePoint ka = a.gone_since ? *a.gone_since : a.last_used;
    const TimePoint kb = b.gone_since ? *b.gone_since : b.last_used;
    if (ka < kb || (ka == kb && it->first < victim->first)) victim = it;
  }
  if (victim == entries_.end()) return false;
  if (!victim->second.gone_since) ++stats_.evictions;
  entries_.erase(victim);
  return true;
}

void CgroupNames::Expire(TimePoint now) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.gone_since && now - *it->second.gone_since >= options_.grace) {
      ++stats_.expired;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace mergewatch
