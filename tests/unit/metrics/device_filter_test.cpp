// SPDX-License-Identifier: Apache-2.0
#include "metrics/device_filter.h"

#include <gtest/gtest.h>

namespace mergewatch {
namespace {

prometheus::ClientMetric Series(std::vector<std::pair<std::string, std::string>> labels) {
  prometheus::ClientMetric metric;
  for (auto& [name, value] : labels) metric.label.push_back({name, value});
  return metric;
}

TEST(DeviceFilter, DefaultExcludesRamZramAndFloppyOnly) {
  DeviceFilter filter;
  std::string error;
  ASSERT_TRUE(DeviceFilter::Make("", kDefaultDeviceExclude, &filter, &error)) << error;
  for (const char* name : {"ram0", "zram12", "fd0"}) EXPECT_TRUE(filter.Excluded(name)) << name;
  for (const char* name : {"loop3", "nvme0n1", "sda", "dm-0", "md127", "framdisk1", "ram"})
    EXPECT_FALSE(filter.Excluded(name)) << name;
}

TEST(DeviceFilter, IncludeAndExcludeFollowNodeExporter) {
  DeviceFilter filter;
  std::string error;
  ASSERT_TRUE(DeviceFilter::Make("^nvme\\d+n\\d+$", "", &filter, &error)) << error;
  EXPECT_FALSE(filter.Excluded("nvme0n1"));
  EXPECT_TRUE(filter.Excluded("nvme0n1p1"));
  EXPECT_TRUE(filter.Excluded("sda"));
  ASSERT_TRUE(DeviceFilter::Make("", "loop", &filter, &error)) << error;  // searched, not anchored, as Go's
  EXPECT_TRUE(filter.Excluded("loop7"));
  EXPECT_FALSE(filter.Excluded("sda"));
  EXPECT_FALSE(DeviceFilter::Make("a", "b", &filter, &error));
  EXPECT_NE(error.find("mutually exclusive"), std::string::npos);
  EXPECT_FALSE(DeviceFilter::Make("", "(", &filter, &error));
  EXPECT_NE(error.find("--devices.exclude is not a valid regular expression"), std::string::npos) << error;
}

TEST(DeviceFilter, DropsSeriesByTheDeviceLabelOnlySoAnExcludedUpperStays) {
  DeviceFilter filter;
  std::string error;
  ASSERT_TRUE(DeviceFilter::Make("", "^(dm-0|loop1)$", &filter, &error)) << error;
  std::vector<prometheus::MetricFamily> families(2);
  families[0].name = "mergewatch_merge_collapse";
  families[0].metric = {Series({{"device", "nvme0n1"}, {"upper", "dm-0"}}), Series({{"device", "dm-0"}})};
  families[1].name = "mergewatch_build_info";
  families[1].metric = {Series({{"version", "x"}}), Series({{"device", "loop1"}, {"origin", "dm-0"}})};
  DropExcludedDevices(filter, &families);
  ASSERT_EQ(families[0].metric.size(), 1u);
  EXPECT_EQ(families[0].metric[0].label[1].value, "dm-0");  // the page on nvme0n1 still names its upper
  ASSERT_EQ(families[1].metric.size(), 1u);
  EXPECT_EQ(families[1].metric[0].label[0].name, "version");
}

TEST(DeviceFilter, RepeatedAndInterleavedDevicesKeepTheirAnswerWhileSeriesMove) {
  DeviceFilter filter;
  std::string error;
  ASSERT_TRUE(DeviceFilter::Make("", kDefaultDeviceExclude, &filter, &error)) << error;
  std::vector<prometheus::MetricFamily> families(2);
  // remove_if moves the kept series over the dropped ones: a remembered name must not follow them.
  for (const char* device : {"zram0", "zram0", "loop1", "zram0", "loop1", "loop1", "ram3", "sda", "zram0"})
    families[0].metric.push_back(Series({{"op", "read"}, {"device", device}}));
  // The next family in another order: the answer at the same place in the family before is not this one's.
  for (const char* device : {"loop1", "zram0", "sda", "loop1", "ram3", "zram0", "sda"})
    families[1].metric.push_back(Series({{"op", "write"}, {"device", device}}));
  for (int scrape = 0; scrape < 2; ++scrape) {
    std::vector<prometheus::MetricFamily> copy = families;
    DropExcludedDevices(filter, &copy);
    std::vector<std::string> kept[2];
    for (int f = 0; f < 2; ++f)
      for (const auto& metric : copy[f].metric) kept[f].push_back(metric.label[1].value);
    EXPECT_EQ(kept[0], (std::vector<std::string>{"loop1", "loop1", "loop1", "sda"})) << "scrape " << scrape;
    EXPECT_EQ(kept[1], (std::vector<std::string>{"loop1", "sda", "loop1", "sda"})) << "scrape " << scrape;
  }
}

TEST(DeviceFilter, AnswersStayTheSamePastTheMemosBoundAndInCopies) {
  DeviceFilter filter;
  std::string error;
  ASSERT_TRUE(DeviceFilter::Make("^sd", "", &filter, &error)) << error;
  DeviceFilter copy = filter;  // as Config copies it: the copies agree
  for (int i = 0; i < 10000; ++i) {  // past the memo's bound: it starts again, the answers do not change
    std::string name = (i % 2 ? "sd" : "loop") + std::to_string(i);
    ASSERT_EQ(filter.Excluded(name), i % 2 == 0) << name;
    ASSERT_EQ(copy.Excluded(name), i % 2 == 0) << name;
  }
  EXPECT_FALSE(DeviceFilter().Excluded("zram0"));
  EXPECT_TRUE(DeviceFilter().KeepsEveryDevice());
}

}  // namespace
}  // namespace mergewatch
