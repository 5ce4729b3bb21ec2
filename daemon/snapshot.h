// A point-in-time copy of the BPF maps, summed over CPUs: the input of the exporter and
// the detector, so both can be fed fixtures in tests.
#pragma once

#include <linux/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <tuple>

#include "mergewatch/abi.h"

namespace mergewatch {

struct DevOpKey {
  uint32_t major = 0;
  uint32_t minor = 0;
  uint32_t op = 0;  // raw REQ_OP_*
  bool operator<(const DevOpKey& o) const {
    return std::tie(major, minor, op) < std::tie(o.major, o.minor, o.op);
  }
  bool operator==(const DevOpKey& o) const {
    return major == o.major && minor == o.minor && op == o.op;
  }
};

struct Snapshot {
  std::map<DevOpKey, mw_dev_stats> stats;
  std::array<uint64_t, MW_CNT_MAX> event_counts{};
};

// Adds every counter of `from` into `into` (per-CPU values, or ops that share a label).
void AccumulateStats(const mw_dev_stats& from, mw_dev_stats* into);

// Where snapshots come from: the live BPF maps, or a fixture in tests.
class SnapshotSource {
 public:
  virtual ~SnapshotSource() = default;
  virtual Snapshot Read() = 0;
};

}  // namespace mergewatch
