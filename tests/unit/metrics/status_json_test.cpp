// SPDX-License-Identifier: Apache-2.0
// /status: the detector's state as JSON, where it is served and what it holds.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "http/http_server.h"
#include "metrics/status_json.h"
#include "http/status_path.h"

namespace mergewatch {
namespace {

DiskVerdict Collapsed() {
  DiskVerdict v;
  v.device = "nvme0n1";
  v.condition = true;
  v.raised = true;
  v.upper = "vg0-snap";
  v.evidence.window_seconds = 10;
  v.evidence.requests = 152340;
  v.evidence.requests_per_second = 15234;
  v.evidence.small_share = 1;
  v.evidence.missed_share = 0.97;
  v.evidence.mean_request_bytes = 4096;
  v.evidence.merged_request_bytes = 131072;
  v.evidence.runs_reported = true;
  v.evidence.upper = "vg0-snap";
  v.evidence.upper_mean_bio_bytes = 524288;
  v.evidence.upper_request_share = 1;
  v.evidence_text = "15234 requests/s, 97% missed merges";
  v.cause = "nomerges=2 on nvme0n1 (the block layer attempts no merge at all)";
  v.remedy = "echo 0 > /sys/block/nvme0n1/queue/nomerges";
  return v;
}

TEST(StatusPath, BesideTheTelemetryPath) {
  EXPECT_EQ(StatusPathFor("/metrics"), "/status");
  EXPECT_EQ(StatusPathFor("/mw/metrics"), "/mw/status");
  EXPECT_EQ(StatusPathFor("/mw/"), "/mw/status");
  // The telemetry path itself is never shadowed.
  EXPECT_EQ(StatusPathFor("/status"), "/status.json");
  EXPECT_EQ(StatusPathFor("/a/status"), "/a/status.json");
}

TEST(StatusJson, EveryVerdictWithEvidenceCauseAndRemedy) {
  DiskVerdict ok;
  ok.device = "nvme1n1";
  ok.evidence.requests_per_second = 12;
  DiskVerdict pending = Collapsed();
  pending.device = "nvme2n1";
  pending.raised = false;
  DiskVerdict clearing = Collapsed();
  clearing.device = "nvme3n1";
  clearing.condition = false;
  const nlohmann::json doc = nlohmann::json::parse(StatusJson(
      {"1.2.3", {Collapsed(), ok, pending, clearing}, {{"sda", "nomerges_set", "nomerges=2 on sda", "echo 0 > x"}}}));
  EXPECT_EQ(doc["version"], "1.2.3");
  ASSERT_EQ(doc["verdicts"].size(), 4u);
  const nlohmann::json& v = doc["verdicts"][0];
  EXPECT_EQ(v["kind"], "merge_collapse");
  EXPECT_EQ(v["device"], "nvme0n1");
  EXPECT_EQ(v["upper"], "vg0-snap");
  EXPECT_EQ(v["state"], "collapsed");
  EXPECT_EQ(v["active"], true);
  EXPECT_EQ(v["condition"], true);
  EXPECT_EQ(v["evidence"]["requests"], 152340);
  EXPECT_EQ(v["evidence"]["requests_per_second"], 15234.0);
  EXPECT_EQ(v["evidence"]["missed_merge_ratio"], 0.97);
  EXPECT_EQ(v["evidence"]["mean_request_bytes"], 4096.0);
  EXPECT_EQ(v["evidence"]["merged_request_bytes"], 131072.0);
  EXPECT_EQ(v["evidence"]["merged_from_runs"], true);
  EXPECT_EQ(v["evidence"]["upper_bio_bytes"], 524288.0);
  EXPECT_EQ(v["evidence"]["text"], "15234 requests/s, 97% missed merges");
  EXPECT_EQ(v["cause"], "nomerges=2 on nvme0n1 (the block layer attempts no merge at all)");
  EXPECT_EQ(v["remedy"], "echo 0 > /sys/block/nvme0n1/queue/nomerges");
  EXPECT_EQ(doc["verdicts"][1]["state"], "ok");
  EXPECT_EQ(doc["verdicts"][1]["active"], false);
  EXPECT_EQ(doc["verdicts"][1]["cause"], "");
  EXPECT_EQ(doc["verdicts"][2]["state"], "pending");
  EXPECT_EQ(doc["verdicts"][2]["active"], false);
  EXPECT_EQ(doc["verdicts"][3]["state"], "clearing");
  EXPECT_EQ(doc["verdicts"][3]["active"], true);
  ASSERT_EQ(doc["findings"].size(), 1u);
  EXPECT_EQ(doc["findings"][0]["device"], "sda");
  EXPECT_EQ(doc["findings"][0]["finding"], "nomerges_set");
  EXPECT_EQ(doc["findings"][0]["evidence"], "nomerges=2 on sda");
  EXPECT_EQ(doc["findings"][0]["remedy"], "echo 0 > x");
}

// Hostile names (a dm name may hold any byte but '/') and ratios without a value still give a
// document every JSON parser takes, with the names as the metric labels spell them.
TEST(StatusJson, InvalidUtf8AndNonFiniteNumbersStayValidJson) {
  DiskVerdict v = Collapsed();
  v.device = std::string("dm-\xff\"\\\n");
  v.evidence.missed_share = std::numeric_limits<double>::quiet_NaN();
  v.evidence.requests_per_second = std::numeric_limits<double>::infinity();
  const std::string text = StatusJson({"", {v}, {}});
  const nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["verdicts"][0]["device"], "dm-\\xff\"\\x5c\n");
  EXPECT_TRUE(doc["verdicts"][0]["evidence"]["missed_merge_ratio"].is_null());
  EXPECT_TRUE(doc["verdicts"][0]["evidence"]["requests_per_second"].is_null());
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n'), text.size() - 1);  // one line
}

// The services behind a collapsed pair, in their order, hostile cgroup paths as their labels spell them;
// a verdict without them has an empty list.
TEST(StatusJson, ServicesOfACollapsedPairInOrder) {
  DiskVerdict v = Collapsed();
  v.services = {{false, "/backup.slice", 970, 0.97}, {false, "/a\"\xff", 30, 0.03}, {true, "other", 0, 0}};
  const nlohmann::json doc = nlohmann::json::parse(StatusJson({"", {v, Collapsed()}, {}}));
  const nlohmann::json& services = doc["verdicts"][0]["services"];
  ASSERT_EQ(services.size(), 3u);
  EXPECT_EQ(services[0]["cgroup"], "/backup.slice");
  EXPECT_DOUBLE_EQ(services[0]["share"].get<double>(), 0.97);
  EXPECT_EQ(services[0]["requests"], 970);
  EXPECT_EQ(services[1]["cgroup"], "/a\"\\xff");
  EXPECT_EQ(services[2]["cgroup"], "other");
  EXPECT_TRUE(doc["verdicts"][1]["services"].is_array());
  EXPECT_TRUE(doc["verdicts"][1]["services"].empty());
}

TEST(StatusJson, NothingJudgedYetIsEmptyLists) {
  const nlohmann::json doc = nlohmann::json::parse(StatusJson({"v", {}, {}}));
  EXPECT_TRUE(doc["verdicts"].is_array());
  EXPECT_TRUE(doc["verdicts"].empty());
  EXPECT_TRUE(doc["findings"].is_array());
}

std::string Get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return "";
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) return "";
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, static_cast<size_t>(n));
  close(fd);
  return response;
}

int Listen(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return -1;
  *port = ntohs(addr.sin_port);
  return fd;
}

TEST(HttpServer, ServesStatusBesideANonDefaultTelemetryPath) {
  int port = 0;
  const int fd = Listen(&port);
  ASSERT_GE(fd, 0) << strerror(errno);
  HttpOptions options;
  options.telemetry_path = "/mw/metrics";
  options.status = [] { return StatusJson({"v", {Collapsed()}, {}}); };
  std::string error;
  std::unique_ptr<HttpServer> server = HttpServer::Start({fd}, options, [] { return "m 1\n"; }, &error);
  ASSERT_NE(server, nullptr) << error;
  const std::string response = Get(port, "/mw/status");
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("Content-Type: application/json"), std::string::npos) << response;
  const nlohmann::json doc = nlohmann::json::parse(response.substr(response.find("\r\n\r\n") + 4));
  EXPECT_EQ(doc["verdicts"][0]["remedy"], "echo 0 > /sys/block/nvme0n1/queue/nomerges");
  EXPECT_EQ(Get(port, "/status").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_NE(Get(port, "/mw/metrics").find("\r\n\r\nm 1\n"), std::string::npos);
}

TEST(HttpServer, NoStatusWithoutAHandler) {
  int port = 0;
  const int fd = Listen(&port);
  ASSERT_GE(fd, 0) << strerror(errno);
  std::string error;
  std::unique_ptr<HttpServer> server = HttpServer::Start({fd}, HttpOptions{}, [] { return "m 1\n"; }, &error);
  ASSERT_NE(server, nullptr) << error;
  EXPECT_EQ(Get(port, "/status").rfind("HTTP/1.1 404", 0), 0u);
}

}  // namespace
}  // namespace mergewatch
