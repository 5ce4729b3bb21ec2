// SPDX-License-Identifier: Apache-2.0
// The pure parts of the `mergewatch` command: the exposition parser, the figures from two
// scrapes, the exit status, what status and top print, and the command line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/device_view.h"
#include "cli/exposition_parser.h"
#include "cli/http_client.h"
#include "cli/options.h"
#include "cli/render.h"
#include "cli/status_doc.h"
#include "metrics/status_json.h"

namespace mergewatch::cli {
namespace {

std::vector<Sample> Parse(const std::string& text) {
  std::vector<Sample> samples;
  std::string error;
  EXPECT_TRUE(ParseExposition(text, &samples, &error)) << error;
  return samples;
}

TEST(ExpositionParser, ReadsSamplesLabelsEscapesAndSpecialValues) {
  const std::vector<Sample> s = Parse(
      "# HELP a_total Help with \\ and \"quotes\".\n# TYPE a_total counter\n"
      "a_total 12\n"
      "b{device=\"dm-\\\\x5c\\\"q\\\"\\n\",op=\"read\",} 1.5e+06 1700000000000\n"
      "\n"
      "c_bucket{le=\"+Inf\"} +Inf\n"
      "d -Inf\n"
      "e NaN\r\n"
      "f { x = \"1\" } 3\n");
  ASSERT_EQ(s.size(), 6u);
  EXPECT_EQ(s[0].name, "a_total");
  EXPECT_EQ(s[0].value, 12);
  EXPECT_TRUE(s[0].labels.empty());
  EXPECT_EQ(s[1].Label("device"), "dm-\\x5c\"q\"\n");
  EXPECT_EQ(s[1].Label("op"), "read");
  EXPECT_EQ(s[1].Label("absent"), "");
  EXPECT_EQ(s[1].value, 1.5e6);
  EXPECT_TRUE(std::isinf(s[2].value) && s[2].value > 0);
  EXPECT_EQ(s[2].Label("le"), "+Inf");
  EXPECT_TRUE(std::isinf(s[3].value) && s[3].value < 0);
  EXPECT_TRUE(std::isnan(s[4].value));
  EXPECT_EQ(s[5].Label("x"), "1");
}

// Hostile input is normal input: every malformed line fails the parse and says where.
TEST(ExpositionParser, RefusesMalformedLinesWithTheLineNumber) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ok 1\n9lives 1\n", "line 2: expected a metric name"},
      {"a{x=\"1\" 1\n", "line 1: expected ',' or '}'"},
      {"a{x=\"1} 1\n", "line 1: unterminated value of label x"},
      {"a{x=1} 1\n", "line 1: expected =\" after label x"},
      {"a{x=\"\\t\"} 1\n", "line 1: unknown escape \\t"},
      {"a{x=\"1\",x=\"2\"} 1\n", "line 1: label x given twice"},
      {"a\n", "line 1: expected a blank and a value after a"},
      {"a 0x10\n", "line 1: not a number"},
      {"a inf\n", "line 1: not a number"},
      {"a 1 2 3\n", "line 1: unexpected text after the timestamp"},
      {"a 1 x\n", "line 1: unexpected text after the value"},
      {std::string("a 1\0\n", 5), "line 1: a NUL byte"},
      {"<html>404</html>\n", "line 1: expected a metric name"},
  };
  for (const auto& [text, expected] : cases) {
    std::vector<Sample> samples;
    std::string error;
    EXPECT_FALSE(ParseExposition(text, &samples, &error)) << text;
    EXPECT_EQ(error.rfind(expected, 0), 0u) << text << " -> " << error;
  }
}

// A loop disk with a dm device on it: requests below, bios above.
std::string Scrape(double requests, double missed, double back_merges, double bios, int nomerges, bool collapse) {
  const double small = requests * 0.75;  // 3/4 of requests <= 4 KiB, the rest <= 8 KiB
  char text[4096];
  snprintf(text, sizeof(text),
           "mergewatch_build_info{version=\"1.0\",kernel=\"6.1\"} 1\n"
           "mergewatch_device_info{device=\"loop7\",kind=\"loop\",disk=\"loop7\",dm_name=\"\",lvm_vg=\"\",lvm_lv=\"\",lvm_layer=\"\"} 1\n"
           "mergewatch_device_info{device=\"dm-0\",kind=\"dm\",disk=\"dm-0\",dm_name=\"vg-snap\",lvm_vg=\"vg\",lvm_lv=\"snap\",lvm_layer=\"\"} 1\n"
           "mergewatch_device_info{device=\"loop9\",kind=\"loop\",disk=\"loop9\",dm_name=\"\",lvm_vg=\"\",lvm_lv=\"\",lvm_layer=\"\"} 1\n"
           "mergewatch_device_holder_info{device=\"loop7\",holder=\"dm-0\"} 1\n"
           "mergewatch_queue_nomerges{device=\"loop7\"} %d\n"
           "mergewatch_queue_max_sectors_bytes{device=\"loop7\"} 131072\n"
           "mergewatch_queue_rotational{device=\"loop7\"} 0\n"
           "mergewatch_queue_scheduler_info{device=\"loop7\",scheduler=\"none\"} 1\n"
           "mergewatch_request_size_bytes_bucket{device=\"loop7\",op=\"read\",le=\"2048\"} 0\n"
           "mergewatch_request_size_bytes_bucket{device=\"loop7\",op=\"read\",le=\"4096\"} %.0f\n"
           "mergewatch_request_size_bytes_bucket{device=\"loop7\",op=\"read\",le=\"8192\"} %.0f\n"
           "mergewatch_request_size_bytes_bucket{device=\"loop7\",op=\"read\",le=\"+Inf\"} %.0f\n"
           "mergewatch_request_size_bytes_sum{device=\"loop7\",op=\"read\"} %.0f\n"
           "mergewatch_request_size_bytes_count{device=\"loop7\",op=\"read\"} %.0f\n"
           "mergewatch_request_latency_seconds_bucket{device=\"loop7\",op=\"read\",le=\"0.0001\"} %.0f\n"
           "mergewatch_request_latency_seconds_bucket{device=\"loop7\",op=\"read\",le=\"0.0002\"} %.0f\n"
           "mergewatch_request_latency_seconds_bucket{device=\"loop7\",op=\"read\",le=\"+Inf\"} %.0f\n"
           "mergewatch_request_latency_seconds_sum{device=\"loop7\",op=\"read\"} 1\n"
           "mergewatch_request_latency_seconds_count{device=\"loop7\",op=\"read\"} %.0f\n"
           "mergewatch_missed_merges_total{device=\"loop7\",op=\"read\"} %.0f\n"
           "mergewatch_bio_merges_total{device=\"loop7\",op=\"read\",kind=\"back\"} %.0f\n"
           "mergewatch_bio_merges_total{device=\"loop7\",op=\"read\",kind=\"front\"} 0\n"
           "mergewatch_bio_size_bytes_bucket{device=\"dm-0\",op=\"read\",le=\"524288\"} %.0f\n"
           "mergewatch_bio_size_bytes_bucket{device=\"dm-0\",op=\"read\",le=\"+Inf\"} %.0f\n"
           "mergewatch_bio_size_bytes_sum{device=\"dm-0\",op=\"read\"} %.0f\n"
           "mergewatch_bio_size_bytes_count{device=\"dm-0\",op=\"read\"} %.0f\n"
           "mergewatch_merge_collapse{device=\"loop7\",upper=\"dm-0\"} %d\n",
           nomerges, small, requests, requests, small * 4096 + (requests - small) * 8192, requests, requests * 0.5,
           requests, requests, requests, missed, back_merges, bios, bios, bios * 524288, bios, collapse ? 1 : 0);
  return text;
}

View TwoScrapes(const StatusDoc& status, bool all = false) {
  const ScrapeFacts before = ReadScrape(Parse(Scrape(1000, 900, 10, 10, 2, true)));
  const ScrapeFacts after = ReadScrape(Parse(Scrape(21000, 20650, 10, 210, 2, true)));
  return BuildView(before, after, 2.0, status, all);
}

StatusDoc CollapsedStatus() {
  DiskVerdict v;
  v.device = "loop7";
  v.upper = "dm-0";
  v.condition = v.raised = true;
  v.evidence_text = "10000 requests/s, 98% missed merges";
  v.cause = "nomerges=2 on loop7 (the block layer attempts no merge at all)";
  v.remedy = "echo 0 > /sys/block/loop7/queue/nomerges";
  DiskVerdict idle;
  idle.device = "loop9";
  StatusDoc doc;
  std::string error;
  // Through the daemon's own writer: the command reads what the daemon serves.
  EXPECT_TRUE(ParseStatusDoc(StatusJson({"1.0", {v, idle}, {}}), &doc, &error)) << error;
  return doc;
}

TEST(DeviceView, RatesSizesLatencyAndQueueFromTwoScrapes) {
  const View view = TwoScrapes(CollapsedStatus());
  // loop9 has no I/O series: not shown; dm-0 below loop7 as lsblk draws it.
  ASSERT_EQ(view.tree.size(), 2u);
  const DeviceRow& disk = view.tree[0];
  const DeviceRow& dm = view.tree[1];
  EXPECT_EQ(disk.name, "loop7");
  EXPECT_EQ(dm.name, "dm-0");
  EXPECT_EQ(dm.dm_name, "vg-snap");
  EXPECT_EQ(dm.tree_prefix, "└─");
  EXPECT_DOUBLE_EQ(disk.requests_per_second, 10000);
  EXPECT_DOUBLE_EQ(disk.mean_request_bytes, 0.75 * 4096 + 0.25 * 8192);
  EXPECT_DOUBLE_EQ(disk.missed_merges_per_second, 9875);
  EXPECT_DOUBLE_EQ(disk.missed_merge_ratio, 19750.0 / 20000);
  EXPECT_DOUBLE_EQ(disk.merges_per_second, 0);
  ASSERT_EQ(disk.request_sizes.size(), 2u);
  EXPECT_EQ(disk.request_sizes[0], std::make_pair(4096.0, 0.75));
  EXPECT_EQ(disk.request_sizes[1], std::make_pair(8192.0, 0.25));
  // Half the requests <= 100 us: p50 is the bound, p99 interpolated within (100, 200] us.
  EXPECT_NEAR(disk.latency_p50_seconds, 0.0001, 1e-12);
  EXPECT_NEAR(disk.latency_p99_seconds, 0.0001 + 0.0001 * (0.99 - 0.5) / 0.5, 1e-12);
  EXPECT_EQ(disk.queue.nomerges, 2);
  EXPECT_EQ(disk.queue.scheduler, "none");
  EXPECT_DOUBLE_EQ(disk.queue.max_sectors_kb, 128);
  EXPECT_EQ(disk.queue.rotational, 0);
  EXPECT_TRUE(disk.collapsed);
  EXPECT_FALSE(dm.collapsed);
  EXPECT_DOUBLE_EQ(dm.bios_per_second, 100);
  EXPECT_DOUBLE_EQ(dm.mean_bio_bytes, 524288);
  EXPECT_FALSE(dm.request_based);
  EXPECT_EQ(disk.before.request_size.count, 1000);
  EXPECT_EQ(disk.after.request_size.count, 21000);
  EXPECT_EQ(ExitStatusOf(view), 1);
  EXPECT_EQ(TwoScrapes(CollapsedStatus(), true).tree.size(), 3u);  // --all: loop9 too
}

TEST(DeviceView, ExitStatusZeroNothingOneCollapseThreeOnlyFindings) {
  StatusDoc none;
  none.served = true;
  EXPECT_EQ(ExitStatusOf(TwoScrapes(none)), 0);
  EXPECT_EQ(ExitStatusOf(TwoScrapes(CollapsedStatus())), 1);
  StatusDoc findings = none;
  findings.findings.push_back({"loop7", "nomerges_set", "nomerges=2", "echo 0 > x", {}});
  EXPECT_EQ(ExitStatusOf(TwoScrapes(findings)), 3);
  StatusDoc both = CollapsedStatus();
  both.findings = findings.findings;
  EXPECT_EQ(ExitStatusOf(TwoScrapes(both)), 1);
  // Pending (pattern seen, not raised) is not active.
  StatusDoc pending = CollapsedStatus();
  pending.verdicts[0].active = false;
  pending.verdicts[0].state = "pending";
  EXPECT_EQ(ExitStatusOf(TwoScrapes(pending)), 0);
  // A daemon without /status: the collapse gauge decides.
  EXPECT_EQ(ExitStatusOf(TwoScrapes(StatusDoc{})), 1);
}

TEST(DeviceView, QuantilesLikeHistogramQuantileAndTheBucketlessSource) {
  Histogram h;
  h.cumulative = {{1, 10}, {2, 20}, {HUGE_VAL, 20}};
  h.count = 20;
  EXPECT_DOUBLE_EQ(Quantile(h, 0.5), 1);
  EXPECT_DOUBLE_EQ(Quantile(h, 0.75), 1.5);
  h.cumulative = {{1, 0}, {2, 10}, {HUGE_VAL, 20}};
  EXPECT_DOUBLE_EQ(Quantile(h, 0.99), 2);  // in +Inf: the highest finite bound
  Histogram only_inf;  // the diskstats source: counts and sums, no buckets
  only_inf.cumulative = {{HUGE_VAL, 5}};
  only_inf.count = 5;
  EXPECT_TRUE(std::isnan(Quantile(only_inf, 0.5)));
  EXPECT_TRUE(std::isnan(Quantile(Histogram{}, 0.5)));
  // A counter that went down is a restarted daemon: from zero.
  Histogram before, after;
  before.count = 100;
  before.cumulative = {{1, 100}};
  after.count = 7;
  after.cumulative = {{1, 7}};
  EXPECT_EQ(Delta(before, after).count, 7);
}

TEST(Render, StatusNamesTheDeviceCollapseQueueSettingsAndRemedy) {
  const std::string text = RenderStatus(TwoScrapes(CollapsedStatus()), "http://localhost:9863/metrics");
  EXPECT_NE(text.find("! loop7"), std::string::npos) << text;
  EXPECT_NE(text.find("  └─dm-0 (vg-snap)"), std::string::npos) << text;
  EXPECT_NE(text.find("loop7: nomerges 2, scheduler none, max_sectors_kb 128, rotational 0"), std::string::npos);
  EXPECT_NE(text.find("MERGE COLLAPSE on loop7 (under dm-0): active"), std::string::npos) << text;
  EXPECT_NE(text.find("  cause:    nomerges=2 on loop7 (the block layer attempts no merge at all)"), std::string::npos);
  EXPECT_NE(text.find("  remedy:   echo 0 > /sys/block/loop7/queue/nomerges"), std::string::npos);
  EXPECT_NE(text.find("loop7 requests: <=4K 75%  <=8K 25%"), std::string::npos) << text;
  EXPECT_NE(text.find("dm-0 bios: <=512K 100%"), std::string::npos) << text;
  // The device table fits 80 columns.
  for (size_t start = 0, end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    const std::string line = text.substr(start, end - start);
    if (line.find("evidence:") != std::string::npos || line.find("cause:") != std::string::npos) continue;
    size_t columns = 0;
    for (unsigned char c : line) columns += (c & 0xC0) != 0x80;
    EXPECT_LE(columns, 80u) << line;
  }
  StatusDoc none;
  none.served = true;
  EXPECT_NE(RenderStatus(TwoScrapes(none), "u").find("no merge collapse and no queue finding active"),
            std::string::npos);
}

// A volume (dm-0) with its requests at the disk below it: its request columns come from the
// remapped_* families by origin; the services behind the collapse from /status, in words.
TEST(Render, AVolumeShowsItsRequestsAndTheCollapseItsServices) {
  const auto volume = [](double requests, double slow) {
    char text[1024];
    snprintf(text, sizeof(text),
             "mergewatch_remapped_dispatched_requests_total{device=\"loop7\",origin=\"dm-0\",op=\"read\"} %.0f\n"
             "mergewatch_remapped_dispatched_bytes_total{device=\"loop7\",origin=\"dm-0\",op=\"read\"} %.0f\n"
             "mergewatch_remapped_request_latency_seconds_bucket{device=\"loop7\",origin=\"dm-0\",op=\"read\",le=\"0.001\"} %.0f\n"
             "mergewatch_remapped_request_latency_seconds_bucket{device=\"loop7\",origin=\"dm-0\",op=\"read\",le=\"0.01\"} %.0f\n"
             "mergewatch_remapped_request_latency_seconds_bucket{device=\"loop7\",origin=\"dm-0\",op=\"read\",le=\"+Inf\"} %.0f\n"
             "mergewatch_remapped_request_latency_seconds_sum{device=\"loop7\",origin=\"dm-0\",op=\"read\"} 1\n"
             "mergewatch_remapped_request_latency_seconds_count{device=\"loop7\",origin=\"dm-0\",op=\"read\"} %.0f\n",
             requests, requests * 4096, requests - slow, requests, requests, requests);
    return std::string(text);
  };
  const ScrapeFacts before = ReadScrape(Parse(Scrape(1000, 900, 10, 10, 2, true) + volume(1000, 0)));
  const ScrapeFacts after = ReadScrape(Parse(Scrape(21000, 20650, 10, 210, 2, true) + volume(11000, 10000)));
  DiskVerdict v;
  v.device = "loop7";
  v.upper = "dm-0";
  v.condition = v.raised = true;
  v.services = {{false, "/system.slice/backup.service", 9700, 0.97}, {false, "/db.slice", 300, 0.03},
                {true, "other", 0, 0}};
  StatusDoc status;
  std::string error;
  ASSERT_TRUE(ParseStatusDoc(StatusJson({"1.0", {v}, {}}), &status, &error)) << error;
  EXPECT_EQ(status.verdicts[0].services, "97% /system.slice/backup.service, 3% /db.slice");
  const View view = BuildView(before, after, 2.0, status, false);
  ASSERT_EQ(view.tree.size(), 2u);
  const DeviceRow& dm = view.tree[1];
  EXPECT_TRUE(dm.volume);
  EXPECT_DOUBLE_EQ(dm.requests_per_second, 5000);
  EXPECT_DOUBLE_EQ(dm.mean_request_bytes, 4096);
  EXPECT_GT(dm.latency_p50_seconds, 0.001) << "every request of the interval took 1-10 ms";
  EXPECT_LE(dm.latency_p99_seconds, 0.01);
  const std::string text = RenderStatus(view, "u");
  EXPECT_NE(text.find("  from:     97% /system.slice/backup.service, 3% /db.slice"), std::string::npos) << text;
  std::string top;
  for (const std::string& line : RenderTop(view, "mergewatch top", 120, 40)) top += line + "\n";
  EXPECT_NE(top.find("from: 97% /system.slice/backup.service"), std::string::npos) << top;
  EXPECT_NE(top.find("dm-0"), std::string::npos) << top;
}

// The diskstats source has histograms with only the +Inf bucket: the host is shown
// with what it has, means and no percentiles, never a made-up distribution.
TEST(Render, ASourceWithoutBucketsShowsMeansAndNoPercentiles) {
  const auto scrape = [](double requests) {
    return "mergewatch_build_info{version=\"1\",kernel=\"k\"} 1\n"
           "mergewatch_device_info{device=\"sda\",kind=\"scsi\",disk=\"sda\",dm_name=\"\"} 1\n"
           "mergewatch_request_size_bytes_bucket{device=\"sda\",op=\"read\",le=\"+Inf\"} " + std::to_string(requests) + "\n"
           "mergewatch_request_size_bytes_sum{device=\"sda\",op=\"read\"} " + std::to_string(requests * 8192) + "\n"
           "mergewatch_request_size_bytes_count{device=\"sda\",op=\"read\"} " + std::to_string(requests) + "\n"
           "mergewatch_request_latency_seconds_bucket{device=\"sda\",op=\"read\",le=\"+Inf\"} " + std::to_string(requests) + "\n"
           "mergewatch_request_latency_seconds_count{device=\"sda\",op=\"read\"} " + std::to_string(requests) + "\n";
  };
  StatusDoc none;
  none.served = true;
  const View view = BuildView(ReadScrape(Parse(scrape(100))), ReadScrape(Parse(scrape(300))), 2, none, false);
  ASSERT_EQ(view.tree.size(), 1u);
  EXPECT_DOUBLE_EQ(view.tree[0].requests_per_second, 100);
  EXPECT_DOUBLE_EQ(view.tree[0].mean_request_bytes, 8192);
  EXPECT_TRUE(std::isnan(view.tree[0].latency_p99_seconds));
  const std::string text = RenderStatus(view, "u");
  EXPECT_NE(text.find("  sda requests: mean 8K (this source has no size buckets)"), std::string::npos) << text;
  EXPECT_EQ(text.find("larger"), std::string::npos) << text;
}

TEST(Render, JsonCarriesRawCountersBesideTheRates) {
  const nlohmann::json doc = nlohmann::json::parse(RenderJson(TwoScrapes(CollapsedStatus()), "u", 1));
  EXPECT_EQ(doc["exit_status"], 1);
  EXPECT_EQ(doc["interval_seconds"], 2.0);
  const nlohmann::json& disk = doc["devices"][0];
  EXPECT_EQ(disk["name"], "loop7");
  EXPECT_EQ(disk["collapsed"], true);
  EXPECT_EQ(disk["queue"]["nomerges"], 2);
  EXPECT_EQ(disk["rates"]["requests_per_second"], 10000.0);
  EXPECT_EQ(disk["counters"]["before"]["request_size_bytes"]["count"], 1000.0);
  EXPECT_EQ(disk["counters"]["after"]["request_size_bytes"]["count"], 21000.0);
  EXPECT_EQ(disk["counters"]["after"]["missed_merges"], 20650.0);
  EXPECT_EQ(doc["devices"][1]["slaves"], nlohmann::json::array({"loop7"}));
  EXPECT_EQ(doc["verdicts"][0]["remedy"], "echo 0 > /sys/block/loop7/queue/nomerges");
  // NaN (no request in the interval) is null, never an invalid document.
  EXPECT_TRUE(doc["devices"][1]["rates"]["mean_request_bytes"].is_null());
}

TEST(Render, TopFitsTheTerminalAndMarksTheCollapse) {
  const View view = TwoScrapes(CollapsedStatus());
  for (int width : {200, 80, 60, 40, kTopMinWidth}) {
    const std::vector<std::string> lines = RenderTop(view, "mergewatch top", width, 24);
    for (const std::string& line : lines) {
      size_t columns = 0;
      for (unsigned char c : line) columns += (c & 0xC0) != 0x80;
      EXPECT_LE(columns, static_cast<size_t>(width)) << line;
    }
    bool marked = false;
    for (const std::string& line : lines) marked |= line.rfind("! loop7", 0) == 0;
    EXPECT_TRUE(marked) << width;
    const bool narrow_note = lines[1].rfind("narrow terminal, hidden:", 0) == 0;
    EXPECT_EQ(narrow_note, width < 80) << width << ": " << lines[1];
  }
  const std::vector<std::string> wide = RenderTop(view, "t", 80, 24);
  EXPECT_EQ(wide[1], "  DEVICE       REQ/S  REQSZ  BIOSZ MERGE/S  MISS/S    P50    P99 NM SCHED      ");
  EXPECT_EQ(wide[2].rfind("! loop7        10.0k     5K      -       0    9875  100us  198us  2 none", 0), 0u) << wide[2];
  // Busiest first: the disk's 10k requests/s above the dm device's 100 bios/s.
  EXPECT_EQ(wide[3].rfind("  dm-0", 0), 0u) << wide[3];
  bool remedy = false;
  for (const std::string& line : wide) remedy |= line == "  remedy: echo 0 > /sys/block/loop7/queue/nomerges";
  EXPECT_TRUE(remedy);
  const std::vector<std::string> tiny = RenderTop(view, "t", kTopMinWidth - 1, 24);
  ASSERT_EQ(tiny.size(), 1u);
  EXPECT_EQ(tiny[0].rfind("terminal too narrow", 0), 0u);
  // Never more lines than the terminal has, the active collapse kept over device rows.
  const std::vector<std::string> short_screen = RenderTop(view, "t", 80, 6);
  EXPECT_LE(short_screen.size(), 6u);
}

TEST(Render, CompactFigures) {
  EXPECT_EQ(FormatBytes(4096), "4K");
  EXPECT_EQ(FormatBytes(524288), "512K");
  EXPECT_EQ(FormatBytes(5120), "5K");
  EXPECT_EQ(FormatBytes(5200), "5.1K");
  EXPECT_EQ(FormatBytes(1536), "1.5K");
  EXPECT_EQ(FormatBytes(NAN), "-");
  EXPECT_EQ(FormatRate(15234), "15.2k");
  EXPECT_EQ(FormatRate(264000), "264k");
  EXPECT_EQ(FormatRate(2.5), "2.5");
  EXPECT_EQ(FormatSeconds(31e-6), "31us");
  EXPECT_EQ(FormatSeconds(3.9e-3), "3.9ms");
  EXPECT_EQ(FormatSeconds(NAN), "-");
}

TEST(StatusDoc, RefusesWhatIsNotAStatusDocument) {
  StatusDoc doc;
  std::string error;
  EXPECT_FALSE(ParseStatusDoc("<html>", &doc, &error));
  EXPECT_FALSE(ParseStatusDoc("[]", &doc, &error));
  EXPECT_FALSE(ParseStatusDoc("{\"verdicts\": {}}", &doc, &error));
  EXPECT_FALSE(ParseStatusDoc("{\"verdicts\": [{\"device\": 3}], \"findings\": []}", &doc, &error));
  EXPECT_TRUE(ParseStatusDoc("{\"verdicts\": [], \"findings\": []}", &doc, &error)) << error;
  EXPECT_TRUE(doc.served);
}

TEST(Endpoint, TheUrlsPathIsTheTelemetryPathAndStatusSitsBesideIt) {
  Endpoint e;
  std::string error;
  ASSERT_TRUE(ParseEndpoint("http://localhost:9863", &e, &error)) << error;
  EXPECT_EQ(e.base, "http://localhost:9863");
  EXPECT_EQ(e.telemetry_path, "/metrics");
  EXPECT_EQ(e.status_path, "/status");
  ASSERT_TRUE(ParseEndpoint("https://[::1]:9863/mw/metrics", &e, &error)) << error;
  EXPECT_EQ(e.base, "https://[::1]:9863");
  EXPECT_EQ(e.telemetry_path, "/mw/metrics");
  EXPECT_EQ(e.status_path, "/mw/status");
  EXPECT_FALSE(ParseEndpoint("localhost:9863", &e, &error));
  EXPECT_FALSE(ParseEndpoint("file:///etc/passwd", &e, &error));
  EXPECT_FALSE(ParseEndpoint("http://", &e, &error));
  EXPECT_FALSE(ParseEndpoint("http://h/metrics?x=1", &e, &error));
}

ParsedCommandLine Parsed(std::vector<const char*> args) {
  args.insert(args.begin(), "mergewatch");
  return ParseCommandLine(static_cast<int>(args.size()), args.data());
}

std::string TempFile(const std::string& text) {
  char path[] = "/tmp/mergewatch-cli-test-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  return path;
}

TEST(CommandLine, AnEmptyValueAfterEqualsIsEmptyAndEatsNoArgument) {
  // CLI11 alone would take "status" as --ca-file's value and run no command.
  ParsedCommandLine p = Parsed({"--ca-file=", "status", "--url=http://127.0.0.1:1/metrics"});
  ASSERT_TRUE(p.run) << p.output;
  EXPECT_EQ(p.command_line.command, Command::kStatus);
  EXPECT_EQ(p.command_line.client.ca_file, "");
  EXPECT_EQ(p.command_line.endpoint.base, "http://127.0.0.1:1");
}

TEST(CommandLine, DefaultsSubcommandsAndIntervals) {
  ParsedCommandLine p = Parsed({"status"});
  ASSERT_TRUE(p.run) << p.output;
  EXPECT_EQ(p.command_line.command, Command::kStatus);
  EXPECT_EQ(p.command_line.endpoint.base, "http://localhost:9863");
  EXPECT_EQ(p.command_line.interval_seconds, 2);
  p = Parsed({"top", "--url", "http://127.0.0.1:1/x/metrics", "--interval", "500ms"});
  ASSERT_TRUE(p.run) << p.output;
  EXPECT_EQ(p.command_line.command, Command::kTop);
  EXPECT_EQ(p.command_line.endpoint.status_path, "/x/status");
  EXPECT_DOUBLE_EQ(p.command_line.interval_seconds, 0.5);
  p = Parsed({"--url", "http://h:1", "status", "--json"});  // flags before the subcommand too
  ASSERT_TRUE(p.run) << p.output;
  EXPECT_TRUE(p.command_line.json);
  EXPECT_EQ(Parsed({}).exit_code, 2);
  EXPECT_EQ(Parsed({"status", "--interval", "soon"}).exit_code, 2);
  EXPECT_EQ(Parsed({"status", "--url", "ftp://h"}).exit_code, 2);
  EXPECT_EQ(Parsed({"--help"}).exit_code, 0);
  EXPECT_NE(Parsed({"--help"}).output.find("status"), std::string::npos);
}

TEST(CommandLine, APasswordNeverComesFromTheCommandLine) {
  ParsedCommandLine p = Parsed({"status", "--user", "prometheus"});
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.output.find("--user needs --password-file"), std::string::npos) << p.output;
  EXPECT_EQ(Parsed({"status", "--user", "u", "--password", "secret"}).exit_code, 2);  // no such flag
  const std::string password = TempFile("s3cret\n");
  p = Parsed({"status", "--user", "prometheus", "--password-file", password.c_str()});
  ASSERT_TRUE(p.run) << p.output;
  EXPECT_EQ(p.command_line.client.password, "s3cret");
  const std::string empty = TempFile("\n");
  EXPECT_EQ(Parsed({"status", "--user", "u", "--password-file", empty.c_str()}).exit_code, 2);
  EXPECT_EQ(Parsed({"status", "--user", "u", "--password-file", "/nonexistent"}).exit_code, 2);
  p = Parsed({"status", "--user", "u", "--password-file", "/tmp"});  // a stream read a directory as empty
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.output.find("cannot read /tmp: a directory, not a file"), std::string::npos) << p.output;
  p = Parsed({"status", "--config", "/tmp"});
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.output.find("--config /tmp: cannot read /tmp: a directory, not a file"), std::string::npos) << p.output;
  unlink(password.c_str());
  unlink(empty.c_str());
}

TEST(CommandLine, TheConfigFileGivesTlsAndBasicAuthTheFlagsOverride) {
  const std::string password = TempFile("from-file\n");
  const std::string config = TempFile("url: https://h:9863/mw/metrics\ntls_config:\n  ca_file: ca.crt\n"
                                      "  cert_file: /abs/c.crt\n  key_file: c.key\n"
                                      "basic_auth:\n  username: prometheus\n  password_file: " + password + "\n");
  ParsedCommandLine p = Parsed({"status", "--config", config.c_str()});
  ASSERT_TRUE(p.run) << p.output;
  EXPECT_EQ(p.command_line.endpoint.base, "https://h:9863");
  EXPECT_EQ(p.command_line.endpoint.telemetry_path, "/mw/metrics");
  EXPECT_EQ(p.command_line.client.ca_file, "/tmp/ca.crt");  // relative to the config file
  EXPECT_EQ(p.command_line.client.cert_file, "/abs/c.crt");
  EXPECT_EQ(p.command_line.client.key_file, "/tmp/c.key");
  EXPECT_EQ(p.command_line.client.username, "prometheus");
  EXPECT_EQ(p.command_line.client.password, "from-file");
  p = Parsed({"status", "--config", config.c_str(), "--url", "http://other:1"});
  ASSERT_TRUE(p.run) << p.output;
  EXPECT_EQ(p.command_line.endpoint.base, "http://other:1");

  CommandLine c;
  std::string error;
  EXPECT_FALSE(ApplyClientConfig("tls_config:\n  ca_fille: x\n", "/", &c, false, &error));
  EXPECT_EQ(error, "unknown setting tls_config.ca_fille");
  EXPECT_FALSE(ApplyClientConfig("basic_auth:\n  password: x\n", "/", &c, false, &error));
  EXPECT_FALSE(ApplyClientConfig("[1, 2]", "/", &c, false, &error));
  EXPECT_FALSE(ApplyClientConfig("url: [1\n", "/", &c, false, &error));
  EXPECT_TRUE(ApplyClientConfig("", "/", &c, false, &error));
  unlink(password.c_str());
  unlink(config.c_str());
}

}  // namespace
}  // namespace mergewatch::cli
