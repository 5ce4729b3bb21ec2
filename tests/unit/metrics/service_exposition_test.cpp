// SPDX-License-Identifier: Apache-2.0
// The series the attribution will export, with hostile cgroup names (every byte but '/' and NUL,
// 255-byte components nested to a 4095-byte path, quotes, backslashes, newlines, bytes that are
// not UTF-8), through the daemon's exposition writer: promtool reads the text clean, and the
// command's parser reads back each name as LabelText made it, one label value per cgroup.
// The family is the daemon's own (CollapseFamilies).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "attribution/cgroup_names.h"
#include "attribution/top_services.h"
#include "cli/exposition_parser.h"
#include "metrics/exposition.h"
#include "metrics/state_metrics.h"
#include "tests/unit/attribution/cgroup_tree.h"
#include "text.h"

namespace mergewatch {
namespace {

using attribution_test::CgroupTree;
using prometheus::ClientMetric;
using prometheus::MetricFamily;

const DevicePair kSnapshot{259, 0, 253, 4};
const DevicePair kOrigin{259, 0, 253, 1};
const DevicePair kCalm{259, 0, 253, 7};  // not collapsed: no series
const TimePoint kNow{std::chrono::seconds(100)};

std::string DeviceName(uint32_t major, uint32_t minor) {
  return major == 259 ? "nvme0n1" : "dm-" + std::to_string(minor);
}

// TopServices as the daemon would call it, naming cgroups through the cache.
std::vector<PairServices> Top(const ServiceCounters& window, const std::set<DevicePair>& collapsed, CgroupNames* names) {
  return TopServices(window, collapsed,
                     [names](const CgroupRef& c) { return LabelOf(names->Name(c.id, c.source, kNow)); });
}

// The daemon's family (CollapseFamilies) of verdicts whose condition holds, carrying TopServices' result.
MetricFamily ShareFamily(const std::vector<PairServices>& top) {
  std::vector<DiskVerdict> verdicts;
  for (const PairServices& p : top) {
    DiskVerdict v;
    v.device = DeviceName(p.pair.disk_major, p.pair.disk_minor);
    v.upper = DeviceName(p.pair.upper_major, p.pair.upper_minor);
    v.condition = true;
    v.services = p.services;
    verdicts.push_back(std::move(v));
  }
  for (MetricFamily& family : CollapseFamilies(verdicts))
    if (family.name == "mergewatch_collapse_service_request_ratio") return family;
  ADD_FAILURE() << "CollapseFamilies has no mergewatch_collapse_service_request_ratio";
  return {};
}

std::string AllBytesButSlash() {
  std::string bytes;
  for (int b = 1; b < 256; ++b) {
    if (b != '/') bytes += static_cast<char>(b);
  }
  return bytes;
}

std::string DeepPath() {
  std::string path = "/" + AllBytesButSlash();
  for (char fill = 'a'; path.size() + 256 <= kMaxCgroupPathBytes; ++fill) path += "/" + std::string(255, fill);
  return path;  // 4095 bytes
}

int Promtool(const std::string& text, std::string* out) {
  const std::string path = testing::TempDir() + "/mergewatch_services.prom";
  std::ofstream(path) << text;
  FILE* pipe = popen(("promtool check metrics < " + path + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) *out += buf;
  return pclose(pipe);
}

class ServiceExposition : public testing::Test {
 protected:
  void SetUp() override {
    tree_.Make("/" + AllBytesButSlash(), 500);
    tree_.Make(DeepPath(), 501);
    tree_.Make("/a\"b\\c\nd\xff\xc3(\xed\xa0\x80 \\x5c", 502);
    tree_.Make("/system.slice/backup.service", 11);
    // Deltas of one window, as ServiceWindow gives them.
    window_ = {{{kSnapshot, {500, CgroupSource::kTask}}, 900}, {{kSnapshot, {501, CgroupSource::kTask}}, 800},
               {{kSnapshot, {502, CgroupSource::kTask}}, 700}, {{kSnapshot, {11, CgroupSource::kTask}}, 10},
               {{kSnapshot, {0, CgroupSource::kTask}}, 5},     {{kOrigin, {1, CgroupSource::kWriteback}}, 100},
               {{kOrigin, {1, CgroupSource::kTask}}, 50},      {{kCalm, {11, CgroupSource::kTask}}, 1000}};
  }

  CgroupTree tree_;
  ServiceCounters window_;
};

TEST_F(ServiceExposition, HostileNamesScrapeCleanAndReadBackOneToOne) {
  CgroupNames names(tree_.root(), tree_.Source());
  const std::string text = RenderExposition({ShareFamily(Top(window_, {kSnapshot, kOrigin}, &names))});

  std::string promtool;
  EXPECT_EQ(Promtool(text, &promtool), 0) << "promtool check metrics:\n" << promtool;

  std::vector<cli::Sample> samples;
  std::string error;
  ASSERT_TRUE(cli::ParseExposition(text, &samples, &error)) << error;
  ASSERT_EQ(samples.size(), 3u + 4u) << "the origin: 2 and other; the snapshot pair: 3 and other; calm: none";
  // Pairs in (disk, upper) order: dm-1 (the origin) before dm-4 (the snapshot).
  const std::vector<std::string> expected = {"writeback", "/", "other", "/" + AllBytesButSlash(), DeepPath(),
                                             "/a\"b\\c\nd\xff\xc3(\xed\xa0\x80 \\x5c", "other"};
  std::map<std::string, int> per_pair;
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i].Label("cgroup"), LabelText(expected[i])) << "sample " << i;
    ++per_pair[samples[i].Label("upper")];
  }
  EXPECT_EQ(per_pair, (std::map<std::string, int>{{"dm-4", 4}, {"dm-1", 3}}));
  // One-to-one: the three hostile names stay three label values.
  const std::set<std::string> hostile = {samples[3].Label("cgroup"), samples[4].Label("cgroup"),
                                         samples[5].Label("cgroup")};
  EXPECT_EQ(hostile.size(), 3u);
  EXPECT_DOUBLE_EQ(samples[3].value, 900.0 / 2415.0);
  EXPECT_DOUBLE_EQ(samples[6].value, 15.0 / 2415.0) << "other: backup.service and kernel";
}

// A cgroup v1-only host: every id but 0 is named "", so they are one series (twice the same
// series would fail the whole scrape), beside "kernel" and "other".
TEST_F(ServiceExposition, AV1HostScrapesCleanWithOneUnnamedService) {
  CgroupNames names(std::nullopt, tree_.Source());
  const std::string text = RenderExposition({ShareFamily(Top(window_, {kSnapshot}, &names))});
  std::string promtool;
  EXPECT_EQ(Promtool(text, &promtool), 0) << "promtool check metrics:\n" << promtool;
  std::vector<cli::Sample> samples;
  std::string error;
  ASSERT_TRUE(cli::ParseExposition(text, &samples, &error)) << error;
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].Label("cgroup"), "");
  EXPECT_DOUBLE_EQ(samples[0].value, 2410.0 / 2415.0);
  EXPECT_EQ(samples[1].Label("cgroup"), "kernel");
  EXPECT_EQ(samples[2].Label("cgroup"), "other");
}

}  // namespace
}  // namespace mergewatch
