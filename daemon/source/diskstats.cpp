// SPDX-License-Identifier: Apache-2.0
#include "source/diskstats.h"

#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "log.h"

namespace mergewatch {
namespace {

constexpr uint64_t kSectorBytes = 512;                           // diskstats sectors are always 512 bytes

bool ParseU64(const std::string& word, uint64_t* out) {
  if (word.empty() || word.size() > 20) return false;
  uint64_t v = 0;
  for (char c : word) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

bool ReadWholeFile(const std::string& path, std::string* out, int* err) {
  std::ifstream in(path);
  if (!in) {
    *err = errno;
    return false;
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  *out = buf.str();
  return true;
}

void AddOp(Snapshot* snapshot, const DiskstatsRecord& r, uint32_t op, uint64_t completed, uint64_t sectors,
           uint64_t merged, bool bio_based) {
  if (completed == 0 && sectors == 0 && merged == 0) return;
  mw_dev_stats& s = snapshot->stats[DevOpKey{r.major, r.minor, op, 0}];
  if (bio_based) {
    s.bio_size_slots[MW_SIZE_SLOTS - 1] += completed;
    s.bio_size_sum_bytes += sectors * kSectorBytes;
  } else {
    // No per-request size: every request in the overflow slot, so only le="+Inf" (= count) is true.
    s.size_slots[MW_SIZE_SLOTS - 1] += completed;
    s.size_sum_bytes += sectors * kSectorBytes;
  }
  s.back_merges += merged;
}

}  // namespace

bool ParseStatFields(const std::string& text, DiskstatsRecord* record, std::string* error) {
  std::istringstream in(text);
  std::string word;
  size_t n = 0;
  while (in >> word) {
    uint64_t v;
    if (!ParseU64(word, &v)) {
      *error = "field " + std::to_string(n + 1) + " is not a counter: \"" + word.substr(0, 32) + "\"";
      return false;
    }
    if (n < record->fields.size()) record->fields[n] = v;
    ++n;
  }
  if (n < 11) {
    *error = std::to_string(n) + " fields, expected 11 to 17";
    return false;
  }
  // Later kernels may append fields: the first 17 keep their meaning (iostats.rst).
  record->field_count = std::min(n, record->fields.size());
  return true;
}

std::vector<DiskstatsRecord> ParseProcDiskstats(const std::string& text, std::vector<std::string>* warnings) {
  std::vector<DiskstatsRecord> records;
  std::istringstream lines(text);
  std::string line;
  size_t number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::istringstream in(line);
    std::string major, minor, name;
    DiskstatsRecord r;
    uint64_t ma = 0, mi = 0;
    std::string error;
    if (!(in >> major >> minor >> name) || !ParseU64(major, &ma) || !ParseU64(minor, &mi) || ma > UINT32_MAX ||
        mi > UINT32_MAX) {
      error = "no major, minor and name";
    } else {
      std::string rest;
      std::getline(in, rest);
      r.major = static_cast<uint32_t>(ma);
      r.minor = static_cast<uint32_t>(mi);
      r.name = name;
      if (ParseStatFields(rest, &r, &error)) {
        records.push_back(std::move(r));
        continue;
      }
    }
    if (warnings != nullptr) warnings->push_back("diskstats line " + std::to_string(number) + " skipped: " + error);
  }
  return records;
}

std::vector<std::string> DisksWithoutStatistics(const Topology& topology) {
  std::vector<std::string> disks;
  for (const BlockDevice& d : topology.devices())
    if (d.request_based && !d.is_partition && d.queue.iostats == 0) disks.push_back(d.name);
  return disks;
}

Snapshot SnapshotFromDiskstats(const std::vector<DiskstatsRecord>& records, const std::set<std::string>& whole_disks,
                               const std::set<std::string>& bio_based) {
  Snapshot snapshot;
  snapshot.reduced = true;
  // No BPF program runs: the required ones say so (mergewatch_bpf_program_attached 0), which
  // keeps MergewatchBpfNotAttached firing while detection runs on this reduced source.
  snapshot.programs = {{"block_rq_issue", "none", false}, {"block_rq_complete", "none", false}};
  for (const DiskstatsRecord& r : records) {
    if (!whole_disks.count(r.name)) continue;
    const bool bio = bio_based.count(r.name) != 0;
    const auto& f = r.fields;
    AddOp(&snapshot, r, MW_OP_READ, f[kReadsCompleted], f[kSectorsRead], f[kReadsMerged], bio);
    AddOp(&snapshot, r, MW_OP_WRITE, f[kWritesCompleted], f[kSectorsWritten], f[kWritesMerged], bio);
    if (r.field_count >= 15)
      AddOp(&snapshot, r, MW_OP_DISCARD, f[kDiscardsCompleted], f[kSectorsDiscarded], f[kDiscardsMerged], bio);
    // Flush requests are no I/O here either (mergewatch_non_io_requests_total{kind="flush"}).
    if (r.field_count >= 17 && !bio) snapshot.event_counts[MW_CNT_FLUSH] += f[kFlushesCompleted];
  }
  return snapshot;
}

DiskstatsSource::DiskstatsSource(std::string proc_root, std::string sysfs_root)
    : proc_root_(std::move(proc_root)), sysfs_root_(std::move(sysfs_root)) {}

std::string DiskstatsSource::last_path() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_path_;
}

Snapshot DiskstatsSource::Read() {
  // The whole disks are the entries of /sys/block; a blk-mq disk has an mq/ directory, the
  // others (dm, md, zram, NVMe multipath heads) are bio-based.
  std::set<std::string> disks, bio_based;
  const std::string block_dir = sysfs_root_ + "/block";
  DIR* dir = opendir(block_dir.c_str());
  if (dir == nullptr) throw std::runtime_error("cannot list " + block_dir + ": " + strerror(errno));
  while (const dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    disks.insert(name);
    if (access((block_dir + "/" + name + "/mq").c_str(), F_OK) != 0) bio_based.insert(name);
  }
  closedir(dir);

  std::lock_guard<std::mutex> lock(mutex_);
  std::string text;
  int err = 0;
  const std::string proc_path = proc_root_ + "/diskstats";
  if (ReadWholeFile(proc_path, &text, &err)) {
    std::vector<std::string> warnings;
    std::vector<DiskstatsRecord> records = ParseProcDiskstats(text, &warnings);
    for (const std::string& w : warnings)
      if (warned_.insert(w).second) LogWarn(proc_path + ": " + w);
    last_path_ = proc_path;
    return SnapshotFromDiskstats(records, disks, bio_based);
  }
  if (!warned_proc_) {
    // Not an error: the shipped unit's ProcSubset=pid hides it, and sysfs has the same counters.
    LogInfo("cannot read " + proc_path + " (" + strerror(err) + "): reading " + block_dir +
            "/<disk>/stat instead (the same counters)");
    warned_proc_ = true;
  }
  std::vector<DiskstatsRecord> records;
  for (const std::string& name : disks) {
    DiskstatsRecord r;
    r.name = name;
    std::string stat, dev, error;
    // A disk removed between the listing and the read is simply not in this snapshot.
    if (!ReadWholeFile(block_dir + "/" + name + "/stat", &stat, &err) ||
        !ReadWholeFile(block_dir + "/" + name + "/dev", &dev, &err))
      continue;
    unsigned major = 0, minor = 0;
    char tail = 0;
    if (sscanf(dev.c_str(), "%u:%u%c", &major, &minor, &tail) < 2 || (tail != 0 && tail != '\n')) {
      error = "dev is not major:minor";
    } else if (ParseStatFields(stat, &r, &error)) {
      r.major = major;
      r.minor = minor;
      records.push_back(std::move(r));
      continue;
    }
    if (warned_.insert(name + error).second) LogWarn(block_dir + "/" + name + ": skipped: " + error);
  }
  last_path_ = block_dir + "/*/stat";
  return SnapshotFromDiskstats(records, disks, bio_based);
}

}  // namespace mergewatch
