// SPDX-License-Identifier: Apache-2.0
// topology/transport: the transport names ReadTransport derives from what resolves, and which of them
// the queue finding trusts (the fixture side is in tests/unit/findings/queue_findings_test.cpp).
#include "topology/transport.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace mergewatch {
namespace {

// A resolver over a fixed map: rel -> canonical path; anything else does not resolve.
SysfsResolver Over(std::map<std::string, std::string> links) {
  return [links](const std::string& rel) -> std::optional<std::string> {
    const auto it = links.find(rel);
    if (it == links.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Transport, DriverLinkFirstThenTheDevicesClass) {
  const std::string vda = "devices/pci0000:00/0000:00:05.0/virtio2/block/vda";
  EXPECT_EQ(ReadTransport(Over({{vda + "/device/driver", "bus/virtio/drivers/virtio_blk"},
                                {vda + "/device", "devices/pci0000:00/0000:00:05.0/virtio2"}}),
                          vda, false),
            "virtio_blk");
  const std::string ns = "devices/pci0000:00/0000:00:06.0/nvme/nvme0/nvme0n1";
  EXPECT_EQ(ReadTransport(Over({{ns + "/device", "devices/pci0000:00/0000:00:06.0/nvme/nvme0"},
                                {ns + "/device/subsystem", "class/nvme"}}),
                          ns, false),
            "nvme");
  // A device with neither: unknown.
  EXPECT_EQ(ReadTransport(Over({{ns + "/device", "devices/x"}}), ns, false), "");
}

TEST(Transport, DisksWithoutADevice) {
  EXPECT_EQ(ReadTransport(Over({}), "devices/virtual/block/loop3", true), "loop");
  EXPECT_EQ(ReadTransport(Over({}), "devices/virtual/block/etherd!e1.0", false), "aoe");
  EXPECT_EQ(ReadTransport(Over({}), "devices/virtual/block/nbd0", false), "");
}

TEST(Transport, WhichTransportsReportRotation) {
  for (const char* cannot : {"virtio_blk", "vbd", "loop", "aoe"}) EXPECT_FALSE(TransportReportsRotation(cannot)) << cannot;
  for (const char* can : {"sd", "nvme", "nvme-subsystem", "mmcblk", ""}) EXPECT_TRUE(TransportReportsRotation(can)) << can;
}

}  // namespace
}  // namespace mergewatch
