// SPDX-License-Identifier: Apache-2.0
// What the topology tests share: the synthetic sysfs trees in tests/fixtures/sysfs (built by
// make-fixtures.sh), scanned, and lookups that fail the test instead of crashing it. Never
// touches the host's /sys.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "topology/topology.h"

#ifndef MERGEWATCH_FIXTURE_DIR
#error "compile with -DMERGEWATCH_FIXTURE_DIR=\"<repo>/tests/fixtures\""
#endif

namespace mergewatch {
namespace topology_test {

using Names = std::vector<std::string>;

inline std::string CaseRoot(const std::string& fixture_case) {
  return std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/" + fixture_case;
}

struct ScanResult {
  Topology topology;
  std::vector<std::string> warnings;
};

inline ScanResult ScanCase(const std::string& fixture_case) {
  ScanResult result;
  result.topology = Topology::Scan(CaseRoot(fixture_case), &result.warnings);
  return result;
}

// The named device, or a failure plus an empty device so the test goes on.
inline const BlockDevice& MustFind(const Topology& topology, const std::string& name) {
  static const BlockDevice kMissing;
  const BlockDevice* device = topology.FindByName(name);
  if (device == nullptr) {
    ADD_FAILURE() << "device " << name << " not found";
    return kMissing;
  }
  return *device;
}

inline Names DeviceNames(const Topology& topology) {
  Names names;
  for (const BlockDevice& device : topology.devices()) names.push_back(device.name);
  return names;
}

inline bool ContainsSubstring(const std::vector<std::string>& lines, const std::string& needle) {
  for (const std::string& line : lines) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

}  // namespace topology_test
}  // namespace mergewatch
