// SPDX-License-Identifier: Apache-2.0
#include "metrics/state_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

namespace mergewatch {
namespace {

std::string Text(const std::vector<prometheus::MetricFamily>& families) {
  return prometheus::TextSerializer().Serialize(families);
}

TEST(TopologyFamilies, DescribeTheSeedStack) {
  Topology topology =
      Topology::Scan(std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/seed-lvm-snapshot", nullptr);
  const std::string text = Text(TopologyFamilies(topology));
  EXPECT_NE(text.find("mergewatch_device_holder_info{device=\"nvme1n1\",holder=\"dm-0\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("mergewatch_queue_nomerges{device=\"nvme1n1\"} 2"), std::string::npos) << text;
  EXPECT_NE(text.find("dm_name=\"secvol-tmp_backup1\",lvm_vg=\"secvol\",lvm_lv=\"tmp_backup1\",lvm_layer=\"\""),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("mergewatch_device_info{device=\"nvme1n1\",kind=\"nvme\""), std::string::npos);
}

TEST(CollapseFamilies, ExportTheVerdictAndItsEvidence) {
  DiskVerdict v;
  v.device = "nvme1n1";
  v.condition = v.raised = true;
  v.upper = v.evidence.upper = "dm-3";
  v.evidence.small_share = 1;
  v.evidence.upper_mean_bio_bytes = 262144;
  const std::string text = Text(CollapseFamilies({v}));
  EXPECT_NE(text.find("mergewatch_merge_collapse{device=\"nvme1n1\",upper=\"dm-3\"} 1"), std::string::npos);
  EXPECT_NE(text.find("mergewatch_collapse_small_request_ratio{device=\"nvme1n1\",upper=\"dm-3\"} 1"), std::string::npos);
  EXPECT_NE(text.find("mergewatch_collapse_upper_bio_bytes{device=\"nvme1n1\",upper=\"dm-3\"} 262144"),
            std::string::npos);
}

}  // namespace
}  // namespace mergewatch
