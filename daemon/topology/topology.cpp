// SPDX-License-Identifier: Apache-2.0
#include "topology/topology.h"
#include "topology/block_ids.h"
#include "topology/sysfs_beneath.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <charconv>
#include <deque>
#include <filesystem>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <system_error>
#include <unordered_map>

namespace mergewatch {
namespace {

namespace fs = std::filesystem;

// Same bound as the kernel's path walk (MAXSYMLINKS), so a symlink cycle in a
// broken tree ends with a warning instead of a hang.
constexpr int kMaxSymlinkHops = 40;
// Larger than any sysfs attribute (one page); bounds what a hostile fixture tree can make us hold.
constexpr size_t kMaxAttrBytes = 64 * 1024;

// dev_t limits of the kernel-internal encoding (abi.h): a value outside them cannot match any
// BPF-reported device.
constexpr uint32_t kMaxMajor = MW_MAJORMASK;
constexpr uint32_t kMaxMinor = MW_MINORMASK;

// "LVM-" followed by the VG uuid and LV uuid, 32 chars each, no dashes.
constexpr size_t kLvmUuidIdLength = 4 + 64;

// ---------------------------------------------------------------------------
// Small string helpers.

std::string Trim(const std::string& s) {
  const char* kSpace = " \t\r\n";
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string::npos) return "";
  const size_t last = s.find_last_not_of(kSpace);
  return s.substr(first, last - first + 1);
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string Basename(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  return slash == std::string::npos ? rel : rel.substr(slash + 1);
}

std::string Dirname(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  return slash == std::string::npos ? "" : rel.substr(0, slash);
}

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

// Whole string must be a decimal number in [min, max]; no sign, no junk.
template <typename T>
std::optional<T> ParseDecimal(const std::string& text, T min, T max) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  if (value < min || value > max) return std::nullopt;
  return value;
}

std::optional<std::pair<uint32_t, uint32_t>> ParseDevNumber(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return std::nullopt;
  const auto major = ParseDecimal<uint32_t>(text.substr(0, colon), 0, kMaxMajor);
  const auto minor = ParseDecimal<uint32_t>(text.substr(colon + 1), 0, kMaxMinor);
  if (!major || !minor) return std::nullopt;
  return std::make_pair(*major, *minor);
}

std::string DevNumberText(uint32_t major, uint32_t minor) {
  return std::to_string(major) + ":" + std::to_string(minor);
}

void AppendWarning(std::vector<std::string>* warnings, std::string warning) {
  if (warnings != nullptr) warnings->push_back(std::move(warning));
}

// ---------------------------------------------------------------------------
// Read-only view of a sysfs tree that never leaves its root.

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
  SysfsTree(const std::string& root, std::vector<std::string>* warnings)
      : root_(NormalizeRoot(root)), warnings_(warnings) {}

  // Walks `rel` one component at a time, replacing each symlink by its target
  // read with readlink, so ".." and relative targets are interpreted exactly
  // as the kernel would but never above the root. realpath() is not used: it
  // would happily follow an absolute target into the host's /sys.
  Lookup Resolve(const std::string& rel) const {
    Lookup lookup;
    std::vector<std::string> done;
    std::deque<std::string> todo;
    for (std::string& part : SplitPath(rel)) todo.push_back(std::move(part));
    int hops = 0;
    const Entry* last = nullptr;  // the entry of JoinPath(done), once known
    while (!todo.empty()) {
      const std::string part = todo.front();
      todo.pop_front();
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
      todo.insert(todo.begin(), target_parts.begin(), target_parts.end());
    }
    lookup.rel = JoinPath(done);
    // After a trailing "..", the entry of the new last component is needed.
    if (last == nullptr) last = &Stat(lookup.rel);
    lookup.is_dir = last->is_dir;
    return lookup;
  }

  bool Exists(const std::string& rel) const { return Resolve(rel).ok(); }

  bool IsDir(const std::string& rel) const {
    const Lookup lookup = Resolve(rel);
    return lookup.ok() && lookup.is_dir;
  }

  // Attribute content, trimmed. nullopt when absent (silently: callers know
  // which attributes are optional) or unreadable (with a warning).
  std::optional<std::string> ReadAttr(const std::string& rel) const {
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

  // Names in a directory, sorted. Dot-files are skipped: kernel names never
  // start with '.', and fixtures use ".keep" files so git stores the dirs.
  std::vector<std::string> ListNames(const std::string& rel) const {
    return List(rel, /*real_dirs_only=*/false);
  }

  // Like ListNames but only real (non-symlink) subdirectories.
  std::vector<std::string> ListRealSubdirs(const std::string& rel) const {
    return List(rel, /*real_dirs_only=*/true);
  }

  void Warn(const std::string& rel, const std::string& problem) const {
    AppendWarning(warnings_, Full(rel) + ": " + problem);
  }

 private:
  static std::string NormalizeRoot(std::string root) {
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    return root;
  }

  std::string Full(const std::string& rel) const {
    if (rel.empty()) return root_;
    return root_ == "/" ? "/" + rel : root_ + "/" + rel;
  }

  // Reads a whole attribute from `fd` (taking ownership; -1 means open failed, errno set).
  std::optional<std::string> ReadOpenAttr(const std::string& rel, int fd) const {
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

  // What one path (relative to the root, symlink-free up to its last
  // component) is.
  struct Entry {
    bool exists = false;
    bool is_symlink = false;
    bool is_dir = false;
    fs::path target;         // when is_symlink
    std::string link_error;  // when is_symlink and readlink failed
  };

  const Entry& Stat(const std::string& rel) const {
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

  Lookup Fail(std::string error) const {
    Lookup lookup;
    lookup.error = std::move(error);
    return lookup;
  }

  // Missing directories yield an empty list without a warning: sysfs
  // creates slaves/ and holders/ for every disk, but git cannot store them
  // empty, and old kernels lack some directories entirely.
  std::vector<std::string> List(const std::string& rel, bool real_dirs_only) const {
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

  std::string root_;
  std::vector<std::string>* warnings_;
  mutable std::unordered_map<std::string, Entry> entries_;
};

// ---------------------------------------------------------------------------
// Per-device readers. `rel` is always a canonical device directory.

template <typename T>
std::optional<T> ReadNumberAttr(const SysfsTree& tree, const std::string& rel, T min, T max) {
  const std::optional<std::string> text = tree.ReadAttr(rel);
  if (!text) {
    tree.Warn(rel, "missing");
    return std::nullopt;
  }
  const std::optional<T> value = ParseDecimal<T>(*text, min, max);
  if (!value) tree.Warn(rel, "malformed value \"" + *text + "\"");
  return value;
}

std::string ReadSchedulerAttr(const SysfsTree& tree, const std::string& rel,
                              std::vector<std::string>* available) {
  const std::optional<std::string> text = tree.ReadAttr(rel);
  if (!text) return "";  // bio-based devices may have no scheduler file
  const std::optional<std::string> scheduler = ParseScheduler(*text);
  if (!scheduler) tree.Warn(rel, "malformed value \"" + *text + "\"");
  else *available = ParseSchedulerList(*text);
  return scheduler.value_or("");
}

// An attribute older kernels or fixtures may lack: absent is 0 without a warning, malformed warns.
uint64_t ReadOptionalCount(const SysfsTree& tree, const std::string& rel) {
  const std::optional<std::string> text = tree.ReadAttr(rel);
  if (!text) return 0;
  const std::optional<uint64_t> value =
      ParseDecimal<uint64_t>(*text, 0, std::numeric_limits<uint64_t>::max());
  if (!value) tree.Warn(rel, "malformed value \"" + *text + "\"");
  return value.value_or(0);
}

QueueSettings ReadQueue(const SysfsTree& tree, const std::string& disk_rel) {
  QueueSettings queue;
  const std::string dir = disk_rel + "/queue";
  if (!tree.IsDir(dir)) {
    tree.Warn(dir, "missing, queue settings unknown");
    return queue;
  }
  queue.nomerges = ReadNumberAttr<int>(tree, dir + "/nomerges", 0, 2).value_or(-1);
  queue.scheduler = ReadSchedulerAttr(tree, dir + "/scheduler", &queue.available_schedulers);
  queue.max_sectors_kb =
      ReadNumberAttr<uint64_t>(tree, dir + "/max_sectors_kb", 0,
                               std::numeric_limits<uint64_t>::max())
          .value_or(0);
  queue.max_segments =
      ReadNumberAttr<uint32_t>(tree, dir + "/max_segments", 0,
                               std::numeric_limits<uint32_t>::max())
          .value_or(0);
  queue.rotational = ReadNumberAttr<int>(tree, dir + "/rotational", 0, 1).value_or(-1);
  queue.max_hw_sectors_kb = ReadOptionalCount(tree, dir + "/max_hw_sectors_kb");
  queue.optimal_io_bytes = ReadOptionalCount(tree, dir + "/optimal_io_size");
  if (const std::optional<std::string> iostats = tree.ReadAttr(dir + "/iostats")) {
    queue.iostats = ParseDecimal<int>(*iostats, 0, 1).value_or(-1);
    if (queue.iostats < 0) tree.Warn(dir + "/iostats", "malformed value \"" + *iostats + "\"");
  }
  // One directory per hardware queue (mq/0, mq/1, ...): the count elevator_get_default() checks.
  if (tree.IsDir(disk_rel + "/mq")) queue.hw_queues = static_cast<int>(tree.ListRealSubdirs(disk_rel + "/mq").size());
  return queue;
}

// A loop device without a backing file has no loop/ dir (checked on 6.18),
// yet it is still a loop device and may be attached at any moment.
bool IsUnattachedLoop(const std::string& disk_rel) {
  const std::string prefix = "devices/virtual/block/loop";
  if (!StartsWith(disk_rel, prefix) || disk_rel.size() == prefix.size()) return false;
  const std::string digits = disk_rel.substr(prefix.size());
  return digits.find_first_not_of("0123456789") == std::string::npos;
}

// Decided on the whole disk's directory: partitions share their disk's kind.
DeviceKind Classify(const SysfsTree& tree, const std::string& disk_rel) {
  const std::string path = "/" + disk_rel + "/";
  const auto contains = [&path](const char* needle) {
    return path.find(needle) != std::string::npos;
  };
  if (tree.IsDir(disk_rel + "/dm")) return DeviceKind::kDm;
  if (tree.IsDir(disk_rel + "/md")) return DeviceKind::kMd;
  if (tree.IsDir(disk_rel + "/loop") || IsUnattachedLoop(disk_rel)) return DeviceKind::kLoop;
  // Native NVMe multipath puts the head disk under virtual/nvme-subsystem/.
  if (contains("/nvme/") || contains("/nvme-subsystem/")) return DeviceKind::kNvme;
  // Checked before virtio: a virtio-scsi disk is a SCSI disk on a virtio bus.
  if (tree.IsDir(disk_rel + "/device/scsi_device") ||
      (contains("/host") && contains("/target"))) {
    return DeviceKind::kScsi;
  }
  if (contains("/virtio")) return DeviceKind::kVirtio;
  return DeviceKind::kOther;
}

void ReadDmInfo(const SysfsTree& tree, const std::string& rel, BlockDevice* device) {
  if (!tree.IsDir(rel + "/dm")) return;
  const std::optional<std::string> name = tree.ReadAttr(rel + "/dm/name");
  const std::optional<std::string> uuid = tree.ReadAttr(rel + "/dm/uuid");
  if (!name) tree.Warn(rel + "/dm/name", "missing");
  if (!uuid) tree.Warn(rel + "/dm/uuid", "missing");
  device->dm_name = name.value_or("");
  device->dm_uuid = uuid.value_or("");
  if (!StartsWith(device->dm_uuid, "LVM-")) return;
  const std::optional<LvmName> lvm = ParseLvmName(device->dm_name, device->dm_uuid);
  if (!lvm) {
    tree.Warn(rel + "/dm/name", "cannot split LVM name \"" + device->dm_name + "\"");
    return;
  }
  device->lvm_vg = lvm->vg;
  device->lvm_lv = lvm->lv;
  device->lvm_layer = lvm->layer;
}

// Reads the device whose canonical directory is `rel`. A partition takes
// `disk_queue` when the caller already parsed its disk, else reads the
// parent's queue/. nullopt (with a warning) without a usable "dev" file,
// because a device that cannot be matched to a dev_t is useless here.
std::optional<BlockDevice> ReadDevice(const SysfsTree& tree, const std::string& rel,
                                      const QueueSettings* disk_queue) {
  const std::optional<std::string> dev_text = tree.ReadAttr(rel + "/dev");
  BlockDevice device;
  device.name = Basename(rel);
  if (!dev_text) {
    // A native NVMe multipath path disk has no dev_t in sysfs (measured on Debian 6.1): it is
    // hidden, and only its diskseq ties it to the BPF keys of the requests it runs.
    const std::optional<std::string> hidden = tree.ReadAttr(rel + "/hidden");
    device.multipath_head = MultipathHeadOf(device.name).value_or("");
    if (!hidden || *hidden != "1" || device.multipath_head.empty() || !tree.Exists(rel + "/diskseq")) {
      tree.Warn(rel, "no dev file, skipped");
      return std::nullopt;
    }
    device.hidden = true;
  } else {
    const auto dev_number = ParseDevNumber(*dev_text);
    if (!dev_number) {
      tree.Warn(rel + "/dev", "malformed value \"" + *dev_text + "\", device skipped");
      return std::nullopt;
    }
    device.major = dev_number->first;
    device.minor = dev_number->second;
  }
  device.is_partition = tree.Exists(rel + "/partition");
  device.request_based = tree.IsDir((device.is_partition ? Dirname(rel) : rel) + "/mq");
  if (!device.is_partition) {
    const std::optional<std::string> seq = tree.ReadAttr(rel + "/diskseq");
    if (seq) {
      const auto value = ParseDecimal<uint64_t>(*seq, 0, std::numeric_limits<uint64_t>::max());
      if (value) device.diskseq = *value;
      else tree.Warn(rel + "/diskseq", "malformed value \"" + *seq + "\"");
    }
  }
  const std::string disk_rel = device.is_partition ? Dirname(rel) : rel;
  device.disk = Basename(disk_rel);
  device.kind = Classify(tree, disk_rel);
  ReadDmInfo(tree, rel, &device);
  device.slaves = tree.ListNames(rel + "/slaves");
  device.holders = tree.ListNames(rel + "/holders");
  device.queue = disk_queue != nullptr ? *disk_queue : ReadQueue(tree, disk_rel);
  if (device.kind == DeviceKind::kLoop && !device.is_partition) {
    const std::optional<std::string> dio = tree.ReadAttr(rel + "/loop/dio");  // absent while unattached
    if (dio && (*dio == "0" || *dio == "1")) device.loop_direct_io = *dio == "1" ? 1 : 0;
    else if (dio) tree.Warn(rel + "/loop/dio", "malformed value \"" + *dio + "\"");
  }
  if (device.hidden && device.diskseq == 0) {
    tree.Warn(rel, "hidden disk without a usable diskseq, skipped");
    return std::nullopt;
  }
  return device;
}

// Resolves a link such as block/nvme1n1 or dev/block/259:0 to a canonical
// device directory; warns and returns nullopt when it does not lead to one.
std::optional<std::string> ResolveDeviceDir(const SysfsTree& tree, const std::string& link) {
  const Lookup dir = tree.Resolve(link);
  if (!dir.ok()) {
    tree.Warn(link, dir.error);
    return std::nullopt;
  }
  if (!tree.IsDir(dir.rel)) {
    tree.Warn(link, "not a directory");
    return std::nullopt;
  }
  return dir.rel;
}

// A disk and the partitions below its directory, in that order.
std::vector<BlockDevice> ReadDiskWithPartitions(const SysfsTree& tree, const std::string& rel,
                                                std::set<std::string>* seen_dirs) {
  std::vector<BlockDevice> found;
  std::optional<BlockDevice> disk = ReadDevice(tree, rel, nullptr);
  if (!disk) return found;
  found.push_back(*disk);
  for (const std::string& sub : tree.ListRealSubdirs(rel)) {
    const std::string part_rel = rel + "/" + sub;
    if (!tree.Exists(part_rel + "/partition")) continue;
    if (!seen_dirs->insert(part_rel).second) continue;
    std::optional<BlockDevice> part = ReadDevice(tree, part_rel, &disk->queue);
    if (part) found.push_back(std::move(*part));
  }
  return found;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string joined;
  for (const std::string& name : names) {
    if (!joined.empty()) joined += ',';
    joined += name;
  }
  return "[" + joined + "]";
}

std::string DumpLine(const BlockDevice& d) {
  std::ostringstream line;
  line << d.name << " dev=" << DevNumberText(d.major, d.minor)
       << " kind=" << DeviceKindName(d.kind) << " partition=" << (d.is_partition ? 1 : 0)
       << " disk=" << d.disk << " dm_name=\"" << d.dm_name << "\" dm_uuid=\"" << d.dm_uuid
       << "\" lvm_vg=\"" << d.lvm_vg << "\" lvm_lv=\"" << d.lvm_lv << "\" lvm_layer=\""
       << d.lvm_layer << "\" slaves=" << JoinNames(d.slaves)
       << " holders=" << JoinNames(d.holders) << " nomerges=" << d.queue.nomerges
       << " scheduler=\"" << d.queue.scheduler << "\" max_sectors_kb=" << d.queue.max_sectors_kb
       << " max_segments=" << d.queue.max_segments << " rotational=" << d.queue.rotational;
  // Only on multipath devices, so the golden dumps of every other tree stay as they were.
  if (d.hidden) line << " hidden=1 diskseq=" << d.diskseq;
  if (!d.multipath_head.empty()) line << " multipath_head=" << d.multipath_head;
  if (!d.multipath_paths.empty()) line << " multipath_paths=" << JoinNames(d.multipath_paths);
  return line.str();
}

}  // namespace

// ---------------------------------------------------------------------------
// Public functions.

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kNvme: return "nvme";
    case DeviceKind::kScsi: return "scsi";
    case DeviceKind::kVirtio: return "virtio";
    case DeviceKind::kLoop: return "loop";
    case DeviceKind::kDm: return "dm";
    case DeviceKind::kMd: return "md";
    case DeviceKind::kOther: return "other";
  }
  return "other";
}

std::optional<LvmName> ParseLvmName(const std::string& dm_name, const std::string& dm_uuid) {
  if (!StartsWith(dm_uuid, "LVM-") || dm_uuid.size() < kLvmUuidIdLength) return std::nullopt;
  // Same walk as lvm2's dm_split_lvm_name(): "--" is a literal '-', a single
  // '-' ends a part.
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < dm_name.size(); ++i) {
    if (dm_name[i] != '-') {
      parts.back() += dm_name[i];
    } else if (i + 1 < dm_name.size() && dm_name[i + 1] == '-') {
      parts.back() += '-';
      ++i;
    } else {
      parts.emplace_back();
    }
  }
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() || parts[1].empty()) {
    return std::nullopt;
  }
  LvmName lvm{parts[0], parts[1], ""};
  // The uuid suffix is authoritative ("LVM-<ids>-real"); a name without a
  // layer part but a uuid with one (or the reverse) is still accepted.
  if (dm_uuid.size() > kLvmUuidIdLength + 1 && dm_uuid[kLvmUuidIdLength] == '-') {
    lvm.layer = dm_uuid.substr(kLvmUuidIdLength + 1);
  }
  return lvm;
}

std::optional<std::string> ParseScheduler(const std::string& content) {
  const size_t open = content.find('[');
  if (open != std::string::npos) {
    const size_t close = content.find(']', open + 1);
    if (close == std::string::npos || close == open + 1) return std::nullopt;
    return content.substr(open + 1, close - open - 1);
  }
  if (Trim(content) == "none") return std::string("none");
  return std::nullopt;
}

std::vector<std::string> ParseSchedulerList(const std::string& content) {
  std::vector<std::string> names;
  std::istringstream words(content);
  std::string word;
  while (words >> word) {
    if (word.size() >= 2 && word.front() == '[' && word.back() == ']') word = word.substr(1, word.size() - 2);
    if (!word.empty()) names.push_back(word);
  }
  return names;
}

Topology::Topology(std::vector<BlockDevice> devices, std::vector<std::string>* warnings) {
  std::stable_sort(devices.begin(), devices.end(),
                   [](const BlockDevice& a, const BlockDevice& b) { return a.name < b.name; });
  for (BlockDevice& device : devices) {
    const auto dev_key = std::make_pair(device.major, device.minor);
    // A hidden disk has no dev_t: it is told apart by its diskseq instead.
    const bool duplicate = index_by_name_.count(device.name) != 0 ||
                           (device.hidden ? hidden_by_diskseq_.count(device.diskseq) != 0
                                          : index_by_dev_.count(dev_key) != 0);
    if (duplicate) {
      AppendWarning(warnings, "duplicate device " + device.name + " (" +
                                  (device.hidden ? "diskseq " + std::to_string(device.diskseq)
                                                 : DevNumberText(device.major, device.minor)) +
                                  "), dropped");
      continue;
    }
    device.multipath_paths.clear();  // derived from the paths below, never taken as given
    index_by_name_[device.name] = devices_.size();
    if (device.hidden) {
      hidden_by_diskseq_[device.diskseq] = devices_.size();
    } else {
      index_by_dev_[dev_key] = devices_.size();
    }
    if (device.is_partition) partitions_by_disk_[device.disk].push_back(device.name);
    devices_.push_back(std::move(device));
  }
  for (const BlockDevice& path : devices_) {
    if (path.multipath_head.empty()) continue;
    const auto head = index_by_name_.find(path.multipath_head);
    if (head != index_by_name_.end()) devices_[head->second].multipath_paths.push_back(path.name);
  }
}

Topology Topology::Scan(const std::string& sysfs_root, std::vector<std::string>* warnings) {
  const SysfsTree tree(sysfs_root, warnings);
  if (!tree.IsDir("block")) tree.Warn("block", "missing, no disks found");
  std::vector<BlockDevice> found;
  std::set<std::string> seen_dirs;
  for (const std::string& name : tree.ListNames("block")) {
    const std::optional<std::string> rel = ResolveDeviceDir(tree, "block/" + name);
    if (!rel || !seen_dirs.insert(*rel).second) continue;
    for (BlockDevice& device : ReadDiskWithPartitions(tree, *rel, &seen_dirs)) {
      found.push_back(std::move(device));
    }
  }
  // dev/block also lists partitions and disks that block/ might miss.
  for (const std::string& name : tree.ListNames("dev/block")) {
    const std::optional<std::string> rel = ResolveDeviceDir(tree, "dev/block/" + name);
    if (!rel || !seen_dirs.insert(*rel).second) continue;
    std::optional<BlockDevice> device = ReadDevice(tree, *rel, nullptr);
    if (device) found.push_back(std::move(*device));
  }
  return Topology(std::move(found), warnings);
}

Topology Topology::FromDevices(std::vector<BlockDevice> devices) {
  return Topology(std::move(devices), nullptr);
}

std::vector<std::string> Topology::StackedBioBasedDevices() const {
  std::vector<std::string> names;
  for (const BlockDevice& d : devices_)
    if (!d.is_partition && !d.request_based && !d.slaves.empty()) names.push_back(d.name);
  return names;
}

const BlockDevice* Topology::Find(uint32_t major, uint32_t minor) const {
  const auto it = index_by_dev_.find(std::make_pair(major, minor));
  return it == index_by_dev_.end() ? nullptr : &devices_[it->second];
}

const BlockDevice* Topology::FindKey(uint32_t major, uint32_t minor, uint64_t diskseq) const {
  const BlockDevice* device = Find(major, minor);
  if (device != nullptr && (diskseq == 0 || device->diskseq == 0 || device->diskseq == diskseq)) return device;
  if (diskseq == 0) return nullptr;
  const auto hidden = hidden_by_diskseq_.find(diskseq);
  return hidden == hidden_by_diskseq_.end() ? nullptr : &devices_[hidden->second];
}

const BlockDevice* Topology::CountedUnder(uint32_t major, uint32_t minor, uint64_t diskseq) const {
  const BlockDevice* device = FindKey(major, minor, diskseq);
  if (device == nullptr || device->multipath_head.empty()) return device;
  return FindByName(device->multipath_head);
}

const BlockDevice* Topology::FindByName(const std::string& name) const {
  const auto it = index_by_name_.find(name);
  return it == index_by_name_.end() ? nullptr : &devices_[it->second];
}

std::vector<std::string> Topology::DirectHolders(const std::string& name) const {
  std::vector<std::string> holders;
  const BlockDevice* device = FindByName(name);
  if (device == nullptr) return holders;
  holders = device->holders;
  if (device->is_partition) return holders;
  const auto partitions = partitions_by_disk_.find(name);
  if (partitions == partitions_by_disk_.end()) return holders;
  for (const std::string& partition : partitions->second) {
    const std::vector<std::string>& above = FindByName(partition)->holders;
    holders.insert(holders.end(), above.begin(), above.end());
  }
  return holders;
}

std::vector<std::string> Topology::UpperDevices(const std::string& name) const {
  std::vector<std::string> result;
  std::set<std::string> visited{name};
  std::vector<std::string> level = DirectHolders(name);
  while (!level.empty()) {
    std::sort(level.begin(), level.end());
    std::vector<std::string> next_level;
    for (const std::string& upper : level) {
      if (!visited.insert(upper).second) continue;
      result.push_back(upper);
      const std::vector<std::string> above = DirectHolders(upper);
      next_level.insert(next_level.end(), above.begin(), above.end());
    }
    level = std::move(next_level);
  }
  return result;
}

std::string Topology::DiskOf(const std::string& name) const {
  const BlockDevice* device = FindByName(name);
  return device == nullptr ? name : device->disk;
}

std::vector<std::string> Topology::LowerDisks(const std::string& name) const {
  std::set<std::string> bottoms;
  const std::string start = DiskOf(name);
  std::set<std::string> visited{start};
  const BlockDevice* start_device = FindByName(start);
  std::vector<std::string> pending =
      start_device == nullptr ? std::vector<std::string>{} : start_device->slaves;
  while (!pending.empty()) {
    const std::string disk = DiskOf(pending.back());
    pending.pop_back();
    if (!visited.insert(disk).second) continue;
    const BlockDevice* device = FindByName(disk);
    // A slave missing from the topology is still a real device below us.
    if (device == nullptr || device->slaves.empty()) {
      bottoms.insert(disk);
      continue;
    }
    pending.insert(pending.end(), device->slaves.begin(), device->slaves.end());
  }
  return std::vector<std::string>(bottoms.begin(), bottoms.end());
}

std::string Topology::Dump() const {
  std::string dump;
  for (const BlockDevice& device : devices_) dump += DumpLine(device) + "\n";
  return dump;
}

std::optional<std::string> MultipathHeadOf(const std::string& name) {
  // nvme<S>c<C>n<N>, each a decimal number.
  auto digits = [&name](size_t at) {
    size_t end = at;
    while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
    return end;
  };
  if (!StartsWith(name, "nvme")) return std::nullopt;
  const size_t subsys_end = digits(4);
  if (subsys_end == 4 || subsys_end >= name.size() || name[subsys_end] != 'c') return std::nullopt;
  const size_t ctrl_end = digits(subsys_end + 1);
  if (ctrl_end == subsys_end + 1 || ctrl_end >= name.size() || name[ctrl_end] != 'n') return std::nullopt;
  const size_t ns_end = digits(ctrl_end + 1);
  if (ns_end == ctrl_end + 1 || ns_end != name.size()) return std::nullopt;
  return name.substr(0, subsys_end) + name.substr(ctrl_end);
}

std::optional<BlockDevice> ResolveHiddenDisk(const std::string& sysfs_root, uint64_t diskseq,
                                             std::vector<std::string>* warnings) {
  if (diskseq == 0) return std::nullopt;
  const SysfsTree tree(sysfs_root, warnings);
  const std::string wanted = std::to_string(diskseq);
  for (const std::string& name : tree.ListNames("block")) {
    if (!MultipathHeadOf(name)) continue;  // only multipath path disks are hidden
    const std::optional<std::string> seq = tree.ReadAttr("block/" + name + "/diskseq");
    if (!seq || *seq != wanted) continue;
    const std::optional<std::string> rel = ResolveDeviceDir(tree, "block/" + name);
    if (!rel) return std::nullopt;
    std::optional<BlockDevice> device = ReadDevice(tree, *rel, nullptr);
    if (device && device->hidden && device->diskseq == diskseq) return device;
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<BlockDevice> ResolveDevice(const std::string& sysfs_root, uint32_t major,
                                         uint32_t minor, std::vector<std::string>* warnings) {
  const SysfsTree tree(sysfs_root, warnings);
  const std::string link = "dev/block/" + DevNumberText(major, minor);
  const Lookup dir = tree.Resolve(link);
  if (dir.ok()) {
    std::optional<BlockDevice> device = ReadDevice(tree, dir.rel, nullptr);
    if (device && device->major == major && device->minor == minor) return device;
    if (device) {
      tree.Warn(link, "leads to " + device->name + " with dev " +
                          DevNumberText(device->major, device->minor) + ", rescanning");
    }
  } else if (!dir.missing) {
    tree.Warn(link, dir.error + ", rescanning");
  }
  const Topology topology = Topology::Scan(sysfs_root, warnings);
  const BlockDevice* device = topology.Find(major, minor);
  if (device == nullptr) return std::nullopt;
  return *device;
}

std::optional<std::string> ReadSysfsAttribute(const std::string& sysfs_root, const std::string& rel) {
  return SysfsTree(sysfs_root, nullptr).ReadAttr(rel);
}

}  // namespace mergewatch
