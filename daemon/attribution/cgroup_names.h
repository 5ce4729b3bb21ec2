// SPDX-License-Identifier: Apache-2.0
// The name of the cgroup behind an I/O: a cgroup v2 id, as the BPF side will record it, to the
// cgroup's path below the cgroup2 mount ("/system.slice/backup.service").
//
// The id is the cgroup directory's kernfs node id: bpf_get_current_cgroup_id() returns
// cgroup_id(cgrp) = cgrp->kn->id since 743210386c03 ("cgroup: use cgrp->kn->id as the cgroup
// ID", v5.5), and a bio's association gives the same through bi_blkg->blkcg->css.cgroup->kn->id.
// 67c0496e87d1 ("kernfs: convert kernfs_node->id from union kernfs_node_id to u64", v5.5) made
// it a u64, and 40430452fd5d ("kernfs: use 64bit inos if ino_t is 64bit", v5.5) made it the
// inode number itself where ino_t is 64-bit (the low 32 bits from a cyclic idr, the high bits
// counting its wrap-arounds: never reused in practice); on 32-bit the low half is the inode
// number and the high half a generation. So on every kernel this daemon supports (5.10-6.18):
// name_to_handle_at() on cgroup2 gives the whole u64 as an 8-byte FILEID_KERNFS handle
// (kernfs_encode_fh, fs/kernfs/mount.c: "*(u64 *)fh = kn->id"), the exact id on every
// architecture; stat()'s st_ino equals it on 64-bit only. The root cgroup's id is 1 on 64-bit
// (the kernfs root is the idr's first id, with id_highbits 0), 1 << 32 | 1 on 32-bit; this
// code never assumes either: the walk reads the mount root's id like any other.
//
// A pure core: the mount point comes from a mountinfo text, the tree is walked below a root
// given as a parameter, the id of a directory comes from an IdSource (tests pass a fake one
// over a tree of plain directories) and time is a parameter. Not yet wired into the daemon.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "clock.h"

namespace mergewatch {

// How the BPF side came by an I/O's cgroup id. It travels with the id (a flag in the map key),
// because the same id means different things: id 1 from a task in the root cgroup is a service
// (rare: only kernel threads and a few early processes live there), id 1 from the flusher is
// the kernel writing back dirty pages whose owner the io controller did not record.
enum class CgroupSource : uint8_t {
  kTask = 0,       // bpf_get_current_cgroup_id() of the task submitting the top-of-stack bio
  kBlkcg = 1,      // the bio's blkcg association (cgroup writeback, dm-crypt write clones)
  kWriteback = 2,  // a writeback worker's bio associated with the root blkcg: named "writeback"
};

// What a name stands for. kService alone has a path; the others are fixed words, which can
// never equal a path because every path starts with '/'.
enum class CgroupNameKind : uint8_t {
  kService,         // a cgroup v2 path below the mount, "/" for the root cgroup
  kWriteback,       // "writeback": flagged by the BPF side (CgroupSource::kWriteback)
  kKernel,          // "kernel": id 0 (no task context) or an id the tree never showed
  kUnattributedV1,  // "": a host without a cgroup2 mount, where every task is in the default
                    // hierarchy's root (id 1, unless a cgroup2 mount the daemon cannot see made children)
                    // and ids name nothing; callers say "unattributed (cgroup v1)". Id 0 and
                    // writeback keep their names there.
};

struct CgroupName {
  CgroupNameKind kind = CgroupNameKind::kKernel;
  std::string path;  // kService only: "/" or "/a/b", raw bytes (any but '/' and NUL in a component)

  bool operator==(const CgroupName& other) const { return kind == other.kind && path == other.path; }
};

// The label value: the path, "writeback", "kernel", or "" on a cgroup v1 host. Raw bytes: the
// exposition makes them valid UTF-8 (LabelText), as it does for every label.
std::string LabelOf(const CgroupName& name);

// For a person (log line, /status): as LabelOf, but "unattributed (cgroup v1)" for the v1 case.
std::string DisplayOf(const CgroupName& name);

// The cgroup2 mount the names are relative to: the first "cgroup2" mount of a
// /proc/self/mountinfo text whose root field is "/" (a bind mount of a subtree would give
// names relative to that subtree). systemd's hybrid layout mounts cgroup2 at
// /sys/fs/cgroup/unified with no controllers: the ids are the same default hierarchy's, so it
// names them too. nullopt: no cgroup2 mount (a cgroup v1-only host, or no cgroup at all).
std::optional<std::string> Cgroup2MountPoint(const std::string& mountinfo);

// Whether the io controller is bound to a cgroup v1 hierarchy: a "cgroup" mount with the blkio
// option. A bio's blkcg then lives in that hierarchy, whose kernfs ids come from another idr
// than cgroup2's and may equal the id of an unrelated cgroup2 directory: such ids must not be
// looked up in the cgroup2 tree (CgroupNamesOptions::blkcg_ids_on_cgroup2). Task ids
// (bpf_get_current_cgroup_id) are always the default hierarchy's.
bool IoControllerOnV1(const std::string& mountinfo);

// mountinfo's octal escapes (\040 space, \011 tab, \012 newline, \134 backslash) undone.
std::string UnescapeMountinfo(const std::string& field);

// The id of an open directory, nullopt if it cannot be read. A descriptor, not a path: the walk
// opens each directory beneath the mount root, so paths near 4 KiB work (an absolute path past
// PATH_MAX would not), and tests map a plain directory's st_ino to an id of their choosing.
using IdSource = std::function<std::optional<uint64_t>(int directory_fd)>;

// The real source: name_to_handle_at(fd, "", AT_EMPTY_PATH)'s 8-byte handle, the kernfs id on
// cgroup2. On another filesystem the handle is not a cgroup id; the caller only uses it on the
// cgroup2 mount.
std::optional<uint64_t> KernfsIdOf(int directory_fd);

struct CgroupNamesOptions {
  size_t capacity = 4096;                                // cached ids at most
  Duration min_rescan_interval = std::chrono::seconds(1);  // a miss walks the tree at most this often
  Duration refresh_interval = std::chrono::seconds(60);   // Sweep walks it this often to notice departures
  Duration grace = std::chrono::minutes(5);              // a departed id keeps its name this long
  size_t max_scan_directories = 65536;                   // one walk reads at most this many directories
  bool blkcg_ids_on_cgroup2 = true;  // false when IoControllerOnV1: CgroupSource::kBlkcg ids are "kernel"
};

inline constexpr size_t kMaxCgroupPathBytes = 4096;  // PATH_MAX: deeper directories are not named

// Counts of what the walks did, for the daemon's self metrics later.
struct CgroupScanStats {
  uint64_t scans = 0;
  uint64_t directories = 0;       // read by all scans
  uint64_t truncated_scans = 0;   // stopped at max_scan_directories
  uint64_t too_long_paths = 0;    // directories below a path over kMaxCgroupPathBytes
  uint64_t evictions = 0;         // live entries dropped for capacity
  uint64_t expired = 0;           // departed entries dropped after the grace period
};

// The cache of names. mount_root is the cgroup2 mount point, or nullopt on a v1-only host.
class CgroupNames {
 public:
  CgroupNames(std::optional<std::string> mount_root, IdSource id_source, CgroupNamesOptions options = {});

  // The name of an id seen now. A miss walks the tree again (no more often than
  // min_rescan_interval); an id still unknown after that is "kernel".
  CgroupName Name(uint64_t id, CgroupSource source, TimePoint now);

  // Call once per tick: walks the tree every refresh_interval, so ids whose directory went
  // away are noticed, named as last seen for the grace period, then dropped.
  void Sweep(TimePoint now);

  size_t size() const { return entries_.size(); }
  const CgroupScanStats& stats() const { return stats_; }

 private:
  struct Entry {
    std::string path;
    std::optional<TimePoint> gone_since;  // set by the first walk that did not find it
    TimePoint last_used{};
  };

  void Rescan(TimePoint now, uint64_t wanted);
  void Walk(std::unordered_map<uint64_t, std::string>* found);
  void ReadDirectory(int fd, const std::string& relative, std::vector<std::string>* pending);
  void Insert(uint64_t id, std::string path, TimePoint now);
  void Expire(TimePoint now);
  bool EvictOne();

  std::optional<std::string> mount_root_;
  IdSource id_source_;
  CgroupNamesOptions options_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::optional<TimePoint> last_scan_;
  CgroupScanStats stats_;
};

}  // namespace mergewatch
