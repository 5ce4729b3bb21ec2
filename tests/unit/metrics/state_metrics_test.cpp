// SPDX-License-Identifier: Apache-2.0
#include "metrics/state_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <memory>

#include "metrics/exposition.h"
#include "metrics/scrape.h"

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

std::shared_ptr<const Topology> SeedTopology() {
  return std::make_shared<const Topology>(
      Topology::Scan(std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/seed-lvm-snapshot", nullptr));
}

TEST(StateCollector, RendersTheTopologyOncePerPublishedTopology) {
  StateCollector state;
  std::shared_ptr<const Topology> topology = SeedTopology();
  state.Publish(topology, {});
  const std::shared_ptr<const std::string> first = state.TopologyText();
  EXPECT_EQ(*first, RenderExposition(TopologyFamilies(*topology)));
  EXPECT_EQ(state.TopologyText(), first) << "the same topology is not rendered again";
  state.Publish(topology, {});  // a tick: verdicts change, the topology object stays
  EXPECT_EQ(state.TopologyText(), first);
  state.Publish(SeedTopology(), {});  // a rescan: a new object, even with the same content
  const std::shared_ptr<const std::string> rescanned = state.TopologyText();
  EXPECT_NE(rescanned, first);
  EXPECT_EQ(*rescanned, *first);
  for (const prometheus::MetricFamily& f : state.Collect())
    EXPECT_EQ(first->find("# TYPE " + f.name + " "), std::string::npos) << f.name << " rendered twice";
}

TEST(StateCollector, TopologyTextLeavesOutExcludedDevices) {
  DeviceFilter filter;
  std::string error;
  ASSERT_TRUE(DeviceFilter::Make("", "^nvme", &filter, &error)) << error;
  StateCollector state(filter);
  state.Publish(SeedTopology(), {});
  const std::string text = *state.TopologyText();
  EXPECT_EQ(text.find("device=\"nvme"), std::string::npos) << text;
  EXPECT_NE(text.find("mergewatch_device_holder_info{device=\"dm-"), std::string::npos) << text;
}

TEST(RenderScrape, AppendsRenderedFamiliesAfterTheCollected) {
  auto state = std::make_shared<StateCollector>();
  DiskVerdict v;
  v.device = "nvme1n1";
  state->Publish(SeedTopology(), {v});
  const std::string text =
      RenderScrape({state}, {[&state] { return state->TopologyText(); }}, DeviceFilter());
  const size_t collapse = text.find("mergewatch_merge_collapse{device=\"nvme1n1\",upper=\"\"} 0");
  const size_t info = text.find("# TYPE mergewatch_device_info gauge");
  ASSERT_NE(collapse, std::string::npos) << text;
  ASSERT_NE(info, std::string::npos) << text;
  EXPECT_LT(collapse, info);
  EXPECT_EQ(text.find("# TYPE mergewatch_device_info gauge", info + 1), std::string::npos) << "one family, once";
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
