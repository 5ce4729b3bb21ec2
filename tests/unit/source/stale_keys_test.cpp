// SPDX-License-Identifier: Apache-2.0
#include "source/stale_keys.h"

#include <gtest/gtest.h>

#include <set>

namespace mergewatch {
namespace {

// Answers as sysfs would right now: only the devices it is given exist.
class FakeNamer final : public DeviceNamer {
 public:
  explicit FakeNamer(std::set<std::pair<uint32_t, uint32_t>> present) : present_(std::move(present)) {}
  std::optional<std::string> NameOf(uint32_t major, uint32_t minor, uint64_t) override {
    if (!present_.count({major, minor})) return std::nullopt;
    return std::to_string(major) + ":" + std::to_string(minor);
  }

 private:
  std::set<std::pair<uint32_t, uint32_t>> present_;
};

BlockDevice Disk(const std::string& name, uint32_t major, uint32_t minor) {
  BlockDevice d;
  d.name = d.disk = name;
  d.major = major;
  d.minor = minor;
  d.request_based = true;
  return d;
}

Snapshot WithKeys(std::vector<DevOpKey> devs, std::vector<OriginKey> origins) {
  Snapshot s;
  for (const DevOpKey& k : devs) s.stats[k] = mw_dev_stats{};
  for (const OriginKey& k : origins) s.origins[k] = mw_origin_stats{};
  return s;
}

TEST(FindStaleKeys, KeysOfDevicesNeitherTheScanNorSysfsKnowAreStale) {
  const Topology topology = Topology::FromDevices({Disk("loop0", 7, 0), Disk("nvme0n1", 259, 0)});
  // 7:1 appeared after the scan (sysfs knows it): kept. 7:2 is gone: stale.
  FakeNamer namer({{7, 0}, {7, 1}, {259, 0}});
  DevOpKey known{7, 0}, appeared{7, 1}, gone{7, 2};
  OriginKey from_gone_upper{259, 0, 253, 4}, on_known{259, 0, 7, 0};
  const StaleKeys stale = FindStaleKeys(WithKeys({known, appeared, gone}, {from_gone_upper, on_known}), topology, namer);
  ASSERT_EQ(stale.stats.size(), 1u);
  EXPECT_EQ(stale.stats[0], gone);
  ASSERT_EQ(stale.origins.size(), 1u);
  EXPECT_EQ(stale.origins[0].origin_major, 253u);
  EXPECT_TRUE(HasUnknownDevice(WithKeys({known, appeared}, {}), topology));
  EXPECT_FALSE(HasUnknownDevice(WithKeys({known}, {}), topology));
}

TEST(FindStaleKeys, ASysfsWithoutDevicesDropsNothing) {
  FakeNamer namer({});
  const StaleKeys stale = FindStaleKeys(WithKeys({DevOpKey{7, 0}}, {}), Topology::FromDevices({}), namer);
  EXPECT_TRUE(stale.empty());
}

}  // namespace
}  // namespace mergewatch
