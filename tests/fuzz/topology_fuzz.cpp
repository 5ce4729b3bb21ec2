// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness for the sysfs topology reader (daemon/topology/topology.h).
//
// Each input is decoded into a small sysfs-like tree in a fresh temp dir, then
// Topology::Scan, Dump, the graph queries, ResolveDevice and the pure parsers
// (ParseLvmName, ParseScheduler) run over it. The tree is removed before the
// next input; leftovers abort the run.
//
// Input format (tests/fuzz/encode_tree.py writes it from a fixture tree): one
// entry per line, '\n' separated, fields separated by a single '\t':
//
//   d <path>                 directory (parents are created as needed)
//   f <path> \t <content>    regular file; content escapes: \n \t \\ \xHH
//   l <path> \t <target>     symlink, target verbatim (dangling, absolute,
//                            looping, ../../.. escaping: all allowed)
//   a <path>                 symlink to the absolute path of the canary device
//                            outside the root (must be refused by Scan)
//   r <major>:<minor>        ResolveDevice query
//   n <dm_name> \t <dm_uuid> ParseLvmName query (escapes as for f)
//   s <content>              ParseScheduler query (escapes as for f)
//
// <path> is relative to the root: empty, "." and ".." components and
// components naming the canary are dropped, so the harness itself never writes
// outside its temp dir (parents are opened with O_NOFOLLOW, files with O_EXCL).
// Unknown or malformed lines are ignored.
//
// Invariants checked beyond what the sanitizers catch:
//   * no device found by Scan or ResolveDevice comes from the canary directory
//     next to the root (reachable only through an escaping or absolute link);
//   * Scan is deterministic (two scans of the same tree dump the same);
//   * ResolveDevice(M, m) returns nothing or a device with dev M:m;
//   * every device Find()/FindByName() returns is consistent with devices().
//
// Env: MERGEWATCH_FUZZ_TMPDIR = where the per-process work dir goes (default
// /dev/shm when writable, else /tmp); MERGEWATCH_FUZZ_PRINT=1 prints each
// input's Dump() and warnings (root shown as <root>, as in the golden files):
//   MERGEWATCH_FUZZ_PRINT=1 build/fuzz/topology_fuzz -runs=0 build/fuzz/corpus/seed-loop
#include "topology/topology.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr size_t kMaxEntries = 512;
constexpr size_t kMaxDepth = 24;
constexpr size_t kMaxContent = 4096;
constexpr size_t kMaxQueries = 8;
constexpr char kCanaryName[] = "mwfuzz-canary";
// dev of the canary device: a valid dev_t, so a leak through an escaping link
// would be parsed rather than skipped.
constexpr char kCanaryDev[] = "4094:1048574";

std::string g_work_dir;   // per process: <tmp>/mergewatch-fuzz.XXXXXX
std::string g_root;       // per input:   <work>/root (removed after each input)
std::string g_canary;     // <work>/mwfuzz-canary (lives for the whole process)
bool g_print = false;     // MERGEWATCH_FUZZ_PRINT=1: print each input's dump and warnings

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "topology_fuzz: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path) == 0 ? 0 : -1;
}

// Depth-first, never follows symlinks (FTW_PHYS), never crosses mounts.
void RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  ::nftw(path.c_str(), RemoveEntry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
  if (::lstat(path.c_str(), &st) == 0) Die("could not remove temp tree " + path);
}

void CleanupWorkDir() {
  if (!g_work_dir.empty()) RemoveTree(g_work_dir);
}

void WriteFileAt(int dirfd, const char* name, const std::string& content) {
  const int fd = ::openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

// The canary: a complete, valid device directory next to the root.
void MakeCanary() {
  if (::mkdir(g_canary.c_str(), 0755) != 0) Die("mkdir " + g_canary + ": " + std::strerror(errno));
  const int fd = ::open(g_canary.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) Die("open " + g_canary);
  WriteFileAt(fd, "dev", std::string(kCanaryDev) + "\n");
  ::mkdirat(fd, "queue", 0755);
  const int queue = ::openat(fd, "queue", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (queue >= 0) {
    WriteFileAt(queue, "nomerges", "0\n");
    WriteFileAt(queue, "scheduler", "[none]\n");
    ::close(queue);
  }
  ::close(fd);
}

std::string Unescape(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 >= in.size()) {
      out += in[i];
      continue;
    }
    const char c = in[++i];
    if (c == 'n') out += '\n';
    else if (c == 't') out += '\t';
    else if (c == '\\') out += '\\';
    else if (c == 'x' && i + 2 < in.size()) {
      const std::string hex = in.substr(i + 1, 2);
      char* end = nullptr;
      const long value = std::strtol(hex.c_str(), &end, 16);
      if (hex.size() == 2 && end == hex.c_str() + 2) {
        out += static_cast<char>(value);
        i += 2;
      } else {
        out += c;
      }
    } else {
      out += c;
    }
  }
  return out;
}

// Relative path split into safe components; empty on anything unusable.
std::vector<std::string> SafeComponents(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    std::string part = path.substr(start, slash - start);
    start = slash + 1;
    if (part.empty() || part == ".") continue;
    if (part == ".." || part == kCanaryName || part.size() > 255 ||
        part.find('\0') != std::string::npos) {
      return {};
    }
    parts.push_back(std::move(part));
  }
  if (parts.size() > kMaxDepth) return {};
  return parts;
}

// Opens (creating as needed) the directory holding the last component, never
// through a symlink. -1 when a parent is not a real directory.
int OpenParent(int rootfd, const std::vector<std::string>& parts) {
  int fd = ::dup(rootfd);
  for (size_t i = 0; i + 1 < parts.size() && fd >= 0; ++i) {
    ::mkdirat(fd, parts[i].c_str(), 0755);
    const int next = ::openat(fd, parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    ::close(fd);
    fd = next;
  }
  return fd;
}

struct Queries {
  std::vector<std::pair<uint32_t, uint32_t>> resolve;
  std::vector<std::pair<std::string, std::string>> lvm;
  std::vector<std::string> scheduler;
};

bool ParseDev(const std::string& text, uint32_t* major, uint32_t* minor) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size()) return false;
  char* end = nullptr;
  const unsigned long ma = std::strtoul(text.c_str(), &end, 10);
  if (end != text.c_str() + colon) return false;
  const unsigned long mi = std::strtoul(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0') return false;
  *major = static_cast<uint32_t>(ma);
  *minor = static_cast<uint32_t>(mi);
  return true;
}

// Builds the tree under g_root and collects the queries.
Queries BuildTree(const uint8_t* data, size_t size) {
  Queries queries;
  if (::mkdir(g_root.c_str(), 0755) != 0) Die("mkdir " + g_root + ": " + std::strerror(errno));
  const int rootfd = ::open(g_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) Die("open " + g_root);
  const std::string input(reinterpret_cast<const char*>(data), size);
  size_t pos = 0;
  size_t entries = 0;
  while (pos < input.size() && entries < kMaxEntries) {
    size_t eol = input.find('\n', pos);
    if (eol == std::string::npos) eol = input.size();
    const std::string line = input.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.size() < 3 || line[1] != ' ') continue;
    ++entries;
    const char kind = line[0];
    const std::string rest = line.substr(2);
    const size_t tab = rest.find('\t');
    const std::string first = rest.substr(0, tab);
    const std::string second = tab == std::string::npos ? "" : rest.substr(tab + 1);
    if (kind == 'r') {
      uint32_t major = 0, minor = 0;
      if (queries.resolve.size() < kMaxQueries && ParseDev(first, &major, &minor)) {
        queries.resolve.emplace_back(major, minor);
      }
      continue;
    }
    if (kind == 'n') {
      if (queries.lvm.size() < kMaxQueries) queries.lvm.emplace_back(Unescape(first), Unescape(second));
      continue;
    }
    if (kind == 's') {
      if (queries.scheduler.size() < kMaxQueries) queries.scheduler.push_back(Unescape(rest));
      continue;
    }
    const std::vector<std::string> parts = SafeComponents(first);
    if (parts.empty()) continue;
    const int dirfd = OpenParent(rootfd, parts);
    if (dirfd < 0) continue;
    const char* name = parts.back().c_str();
    switch (kind) {
      case 'd':
        ::mkdirat(dirfd, name, 0755);
        break;
      case 'f': {
        std::string content = Unescape(second);
        if (content.size() > kMaxContent) content.resize(kMaxContent);
        WriteFileAt(dirfd, name, content);
        break;
      }
      case 'l':
        if (!second.empty() && second.size() < 4096 && second.find('\0') == std::string::npos) {
          ::symlinkat(second.c_str(), dirfd, name);
        }
        break;
      case 'a':
        ::symlinkat(g_canary.c_str(), dirfd, name);
        break;
      default:
        break;
    }
    ::close(dirfd);
  }
  ::close(rootfd);
  return queries;
}

bool FromCanary(const mergewatch::BlockDevice& device) {
  return device.name == kCanaryName || device.disk == kCanaryName;
}

void CheckTopology(const mergewatch::Topology& topology) {
  for (const mergewatch::BlockDevice& device : topology.devices()) {
    if (FromCanary(device)) Die("device read from outside the sysfs root: " + device.name);
    const mergewatch::BlockDevice* by_name = topology.FindByName(device.name);
    // A hidden multipath path disk has no dev_t in sysfs (major:minor stay 0): it is found by its
    // diskseq (FindKey), and only the name index must give it back.
    const mergewatch::BlockDevice* by_dev = device.hidden ? &device : topology.Find(device.major, device.minor);
    if (device.hidden) (void)topology.CountedUnder(device.major, device.minor, device.diskseq);
    if (by_name != &device || by_dev != &device) Die("index inconsistent for " + device.name);
    (void)topology.UpperDevices(device.name);
    (void)topology.LowerDisks(device.name);
  }
  (void)topology.StackedBioBasedDevices();
  (void)topology.UpperDevices("");
  (void)topology.LowerDisks("no-such-device");
}

void RunTarget(const Queries& queries, const uint8_t* data, size_t size) {
  std::vector<std::string> warnings;
  const mergewatch::Topology topology = mergewatch::Topology::Scan(g_root, &warnings);
  const std::string dump = topology.Dump();
  CheckTopology(topology);
  if (g_print) {
    // Same shape as tests/unit/topology/device_reader_test.cpp's golden files, to check the encoder.
    std::string out = dump;
    for (std::string warning : warnings) {
      for (size_t at = warning.find(g_root); at != std::string::npos; at = warning.find(g_root, at)) {
        warning.replace(at, g_root.size(), "<root>");
      }
      out += "warning: " + warning + "\n";
    }
    std::fputs(out.c_str(), stdout);
  }

  // Same tree, same answer; also exercises the nullptr warnings path.
  const mergewatch::Topology again = mergewatch::Topology::Scan(g_root + "/", nullptr);
  if (again.Dump() != dump) Die("Scan is not deterministic:\n" + dump + "---\n" + again.Dump());

  std::vector<std::pair<uint32_t, uint32_t>> resolve = queries.resolve;
  // Plus the first two scanned devices (each ResolveDevice may rescan the whole tree).
  for (const mergewatch::BlockDevice& device : topology.devices()) {
    if (resolve.size() >= queries.resolve.size() + 2) break;
    resolve.emplace_back(device.major, device.minor);
  }
  for (const auto& [major, minor] : resolve) {
    std::vector<std::string> resolve_warnings;
    const auto device = mergewatch::ResolveDevice(g_root, major, minor, &resolve_warnings);
    if (!device) continue;
    if (device->major != major || device->minor != minor) {
      Die("ResolveDevice(" + std::to_string(major) + ":" + std::to_string(minor) + ") returned " +
          device->name);
    }
    if (FromCanary(*device)) Die("ResolveDevice read outside the sysfs root");
  }

  for (const auto& [name, uuid] : queries.lvm) (void)mergewatch::ParseLvmName(name, uuid);
  for (const std::string& content : queries.scheduler) (void)mergewatch::ParseScheduler(content);
  // The raw input as parser input too: the parsers take any bytes.
  const std::string raw(reinterpret_cast<const char*>(data), size);
  (void)mergewatch::ParseScheduler(raw);
  const size_t half = raw.size() / 2;
  (void)mergewatch::ParseLvmName(raw.substr(0, half), raw.substr(half));
  (void)mergewatch::ParseLvmName(raw, "LVM-" + std::string(64, '0') + "-" + raw);
  for (const mergewatch::BlockDevice& device : topology.devices()) {
    (void)mergewatch::DeviceKindName(device.kind);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string base;
  if (const char* env = std::getenv("MERGEWATCH_FUZZ_TMPDIR"); env != nullptr && *env != '\0') {
    base = env;
    ::mkdir(base.c_str(), 0755);
  } else {
    base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  }
  std::string templ = base + "/mergewatch-fuzz.XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) Die("mkdtemp " + templ + ": " + std::strerror(errno));
  g_work_dir = templ;
  g_root = g_work_dir + "/root";
  g_canary = g_work_dir + "/" + kCanaryName;
  MakeCanary();
  g_print = std::getenv("MERGEWATCH_FUZZ_PRINT") != nullptr;
  std::atexit(CleanupWorkDir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 256 * 1024) return -1;  // reject: trees that big only slow the search down
  const Queries queries = BuildTree(data, size);
  RunTarget(queries, data, size);
  RemoveTree(g_root);
  return 0;
}
