// SPDX-License-Identifier: Apache-2.0
// The HTTP endpoint's pure parts and the label and number formatting the scrape depends on.
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <zlib.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <chrono>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <fstream>
#include <unistd.h>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <regex>
#include <set>

#include "metrics/exporter.h"
#include "http/http_server.h"
#include "metrics/exposition.h"
#include "metrics/self_metrics.h"
#include "http/web_config.h"

namespace mergewatch {
namespace {

std::string Gunzip(const std::string& data) {
  z_stream stream{};
  EXPECT_EQ(inflateInit2(&stream, 15 + 16), Z_OK);
  std::string out(1 << 20, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  stream.avail_in = static_cast<uInt>(data.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(inflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  inflateEnd(&stream);
  return out;
}

using prometheus::ClientMetric;

TEST(FormatFloatLikeGo, MatchesStrconvGMinusOne) {
  // Expected strings are what Go 1.19 prints for strconv.FormatFloat(v, 'g', -1, 64).
  const std::vector<std::pair<double, std::string>> cases = {
      {8192 / 1e9, "8.192e-06"},  // the serializer's %.16g wrote 8.192000000000001e-06
      {8388608 / 1e9, "0.008388608"}, {8589934592 / 1e9, "8.589934592"},
      {4096, "4096"},             {524288, "524288"},   {1048576, "1.048576e+06"},
      {0.0001, "0.0001"},         {0.00001, "1e-05"},   {0.1 + 0.2, "0.30000000000000004"},
      {0, "0"},                   {-2.5, "-2.5"},       {1e21, "1e+21"},
  };
  for (const auto& [value, expected] : cases) EXPECT_EQ(FormatFloatLikeGo(value), expected) << expected;
  EXPECT_EQ(FormatFloatLikeGo(INFINITY), "+Inf");
  EXPECT_EQ(FormatFloatLikeGo(NAN), "NaN");
}

TEST(BucketLabels, EveryLatencyBoundIsTheShortestRoundTrip) {
  __u64 slots[MW_LAT_SLOTS] = {};
  ClientMetric::Histogram h = Log2Histogram(slots, MW_LAT_SLOTS, 0, MW_LAT_MIN_SHIFT, 1e9);
  prometheus::MetricFamily family{"x_seconds", "h", prometheus::MetricType::Histogram, {}};
  prometheus::ClientMetric m;
  m.label = {{"device", "x,le=\"1"}};  // must not be rewritten
  m.histogram = h;
  family.metric.push_back(m);
  const std::string text = RenderExposition({family});
  EXPECT_NE(text.find("le=\"8.192e-06\""), std::string::npos) << text;
  EXPECT_NE(text.find("le=\"0.008388608\""), std::string::npos) << text;
  EXPECT_NE(text.find("device=\"x,le=\\\"1\""), std::string::npos) << text;
  std::regex le("[{,]le=\"([^\"]+)\"");
  size_t checked = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), le); it != std::sregex_iterator(); ++it) {
    const std::string label = (*it)[1];
    if (label == "+Inf") continue;
    ASSERT_LT(checked, h.bucket.size());
    EXPECT_EQ(std::strtod(label.c_str(), nullptr), h.bucket[checked].upper_bound) << label;  // reads back
    EXPECT_EQ(label, FormatFloatLikeGo(h.bucket[checked].upper_bound));
    char shortest[64];
    const auto r = std::to_chars(shortest, shortest + sizeof(shortest), h.bucket[checked].upper_bound);
    EXPECT_LE(label.size(), static_cast<size_t>(r.ptr - shortest) + 4) << label;  // at most "e-0X" longer
    ++checked;
  }
  EXPECT_EQ(checked, h.bucket.size());
}

TEST(BucketLabels, SizeBoundsAreExactIntegers) {
  __u64 slots[MW_SIZE_SLOTS] = {};
  ClientMetric::Histogram h = Log2Histogram(slots, MW_SIZE_SLOTS, 0, MW_SIZE_MIN_SHIFT, 1.0);
  for (const auto& b : h.bucket) EXPECT_EQ(b.upper_bound, std::floor(b.upper_bound));
}

TEST(LabelText, ValidUtf8PassesUnchanged) {
  for (const std::string s : {"nvme0n1", "vg0-root", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x92\xbe", ""})
    EXPECT_EQ(LabelText(s), s);
}

TEST(LabelText, InvalidBytesBecomeHexEscapes) {
  EXPECT_EQ(LabelText("latin\xff"), "latin\\xff");
  EXPECT_EQ(LabelText("\xc3"), "\\xc3");                  // cut-off sequence
  EXPECT_EQ(LabelText("\xc0\xaf"), "\\xc0\\xaf");         // overlong '/'
  EXPECT_EQ(LabelText("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // surrogate
  EXPECT_EQ(LabelText("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(LabelText("a\x80" "b"), "a\\x80b");
}

TEST(LabelText, DistinctNamesStayDistinct) {
  // A literal backslash is escaped too, or "latin\xff" typed by hand would equal byte 0xff.
  EXPECT_EQ(LabelText("a\\b"), "a\\x5cb");
  std::set<std::string> out;
  const std::vector<std::string> names = {"latin\xff", "latin\\xff", "latin\xfe", "latin\\x5cxff", "latin"};
  for (const std::string& n : names) out.insert(LabelText(n));
  EXPECT_EQ(out.size(), names.size());
}

TEST(LabelText, MakeLabelsUtf8FixesEveryFamily) {
  prometheus::MetricFamily f{"mergewatch_device_info", "h", prometheus::MetricType::Gauge, {}};
  prometheus::ClientMetric m;
  m.label = {{"device", "dm-0"}, {"dm_name", "latin\xff"}};
  f.metric.push_back(m);
  std::vector<prometheus::MetricFamily> families = {f};
  MakeLabelsUtf8(&families);
  EXPECT_EQ(families[0].metric[0].label[0].value, "dm-0");
  EXPECT_EQ(families[0].metric[0].label[1].value, "latin\\xff");
}

TEST(Gzip, RoundTripsAndHonoursAcceptEncoding) {
  const std::string text(10000, 'x');
  std::string compressed;
  ASSERT_TRUE(Gzip(text, &compressed));
  EXPECT_LT(compressed.size(), text.size() / 10);
  EXPECT_EQ(Gunzip(compressed), text);
  EXPECT_TRUE(AcceptsGzip("gzip"));
  EXPECT_TRUE(AcceptsGzip("deflate, GZip;q=0.5"));  // Prometheus: "gzip"; curl --compressed: "deflate, gzip, br, zstd"
  EXPECT_TRUE(AcceptsGzip("*"));
  EXPECT_FALSE(AcceptsGzip("identity"));
  EXPECT_FALSE(AcceptsGzip("gzip;q=0"));
  EXPECT_FALSE(AcceptsGzip("gzip; q=0.000"));
  EXPECT_FALSE(AcceptsGzip(""));
}

// A listening socket on 127.0.0.1 with a port of the kernel's choice.
int ListenOnLoopback(int* port) {
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

// One HTTP/1.1 request with Connection: close; the whole response, headers and body.
std::string Request(int port, const std::string& headers) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return "";
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers + "\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) return "";
  std::string response;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, static_cast<size_t>(n));
  close(fd);
  return response;
}

// The scrape body reaches the client whole, as given or gzip'd when asked: the server hands the
// handler's string to libmicrohttpd and compresses at its own level.
TEST(HttpServer, ServesTheScrapeBodyWholePlainAndGzipped) {
  std::string text;
  for (int i = 0; text.size() < 300000; ++i)
    text += "mergewatch_request_size_bytes_bucket{device=\"loop" + std::to_string(i % 97) + "\",le=\"" +
            std::to_string(1 << (i % 17)) + "\"} " + std::to_string(i * 7919 % 100003) + "\n";
  int port = 0;
  const int fd = ListenOnLoopback(&port);
  ASSERT_GE(fd, 0) << strerror(errno);
  std::string error;
  std::unique_ptr<HttpServer> server = HttpServer::Start({fd}, HttpOptions{}, [&text] { return text; }, &error);
  ASSERT_NE(server, nullptr) << error;
  for (const bool gzip : {false, true, false, true}) {
    const std::string response = Request(port, gzip ? "Accept-Encoding: gzip\r\n" : "");
    const size_t end = response.find("\r\n\r\n");
    ASSERT_NE(end, std::string::npos) << response.substr(0, 200);
    const std::string head = response.substr(0, end);
    const std::string body = response.substr(end + 4);
    EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
    EXPECT_EQ(head.find("Content-Encoding: gzip") != std::string::npos, gzip) << head;
    if (gzip) {
      EXPECT_LT(body.size(), text.size() / 4);
      EXPECT_EQ(Gunzip(body), text);
    } else {
      EXPECT_EQ(body.size(), text.size());
      EXPECT_TRUE(body == text);
    }
  }
}

// The watchdog's heartbeat (daemon.cpp feeds systemd only while it holds): an event loop stuck
// in a handler stops answering it, and answers again once the handler returns.
TEST(HttpServer, WorkersAliveFailsWhileAHandlerIsStuck) {
  int port = 0;
  const int fd = ListenOnLoopback(&port);
  ASSERT_GE(fd, 0) << strerror(errno);
  std::mutex mutex;
  std::condition_variable release;
  bool released = false;
  std::string error;
  std::unique_ptr<HttpServer> server = HttpServer::Start(
      {fd}, HttpOptions{},
      [&] {
        std::unique_lock<std::mutex> lock(mutex);
        release.wait(lock, [&] { return released; });
        return std::string("x 1\n");
      },
      &error);
  ASSERT_NE(server, nullptr) << error;
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(server->WorkersAlive(std::chrono::milliseconds(500)));
  std::thread client([port] { Request(port, ""); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_FALSE(server->WorkersAlive(std::chrono::milliseconds(500)));
  {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
  }
  release.notify_all();
  client.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(server->WorkersAlive(std::chrono::milliseconds(500)));
}

// A socket connected to 127.0.0.1:port (receive buffer `rcvbuf` if not 0), or -1.
int ConnectTo(int port, int rcvbuf = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (rcvbuf != 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (end of stream, or reset) within `wait`.
bool ClosedWithin(int fd, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) > 0) {
      char byte;
      const ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

// Polls `condition` for up to 10 s.
bool Eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Sends a scrape and waits until its answer begins: from then on the request is being answered
// (the client reads nothing of a body far larger than the socket buffers, so it stays so).
bool StartScrape(int fd) {
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) return false;
  pollfd p{fd, POLLIN, 0};
  char byte;
  return poll(&p, 1, 10000) > 0 && recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
}

// At the total cap a new connection closes the one that has waited longest without sending a
// request, never one whose request is being answered; when every open connection is being
// answered, the new one is refused.
TEST(HttpServer, AtTheTotalCapTheLongestWaitingConnectionMakesRoom) {
  const std::string body(8 << 20, 'x');  // far more than the socket buffers hold
  int port = 0;
  const int fd = ListenOnLoopback(&port);
  ASSERT_GE(fd, 0) << strerror(errno);
  HttpOptions options;
  options.limits.connection_limit = 3;
  options.limits.connections_per_address = 10;
  options.limits.request_timeout = std::chrono::seconds(60);  // no deadline cut in this test, however slow
  options.limits.response_stall_timeout = std::chrono::seconds(60);
  options.limits.drain_timeout = std::chrono::seconds(1);
  options.counts = std::make_shared<HttpDefenceCounts>();
  const HttpDefenceCounts& counts = *options.counts;
  std::string error;
  std::unique_ptr<HttpServer> server = HttpServer::Start({fd}, options, [&body] { return body; }, &error);
  ASSERT_NE(server, nullptr) << error;
  auto open_now = [&counts](int64_t n) { return Eventually([&counts, n] { return counts.open_connections == n; }); };

  const int answered = ConnectTo(port, 4096);  // the oldest, but its request is being answered
  ASSERT_GE(answered, 0);
  ASSERT_TRUE(StartScrape(answered));
  const int idle1 = ConnectTo(port);
  ASSERT_TRUE(open_now(2));
  const int idle2 = ConnectTo(port);
  ASSERT_TRUE(open_now(3));
  const int idle3 = ConnectTo(port);  // the cap is full: idle1 makes room
  ASSERT_GE(idle3, 0);
  EXPECT_TRUE(ClosedWithin(idle1, std::chrono::seconds(10)));
  EXPECT_TRUE(open_now(3));
  EXPECT_EQ(counts.evicted, 1u);
  EXPECT_EQ(counts.refused_total, 0u);
  EXPECT_FALSE(ClosedWithin(idle2, std::chrono::milliseconds(0)));

  // Every open connection being answered: nothing to close, the new one is refused.
  ASSERT_TRUE(StartScrape(idle2));
  ASSERT_TRUE(StartScrape(idle3));
  const int refused = ConnectTo(port);
  ASSERT_GE(refused, 0);
  EXPECT_TRUE(ClosedWithin(refused, std::chrono::seconds(10)));
  EXPECT_EQ(counts.refused_total, 1u);
  EXPECT_EQ(counts.evicted, 1u);
  EXPECT_EQ(counts.refused_per_address, 0u);
  for (int c : {answered, idle1, idle2, idle3, refused}) close(c);
}

TEST(HttpServer, AFailedStartClosesTheListeningSocketsItWasGiven) {
  // A certificate that is no PEM: the web state fails before any libmicrohttpd daemon starts.
  int port = 0;
  const int fd = ListenOnLoopback(&port);
  ASSERT_GE(fd, 0) << strerror(errno);
  HttpOptions options;
  options.web.cert_file = "/nonexistent/cert.pem";
  options.web.key_file = "/nonexistent/key.pem";
  options.secrets.cert_pem = "not a certificate";
  options.secrets.key_pem = "not a key";
  std::string error;
  EXPECT_EQ(HttpServer::Start({fd}, options, [] { return std::string(); }, &error), nullptr);
  EXPECT_FALSE(error.empty());
  errno = 0;
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "the socket was left open";
  EXPECT_EQ(errno, EBADF);
}

const char kHash[] = "$2b$10$1zX7PKoFQz4PGZNr7ZZy0uzewTCTteSDg8IukNQ.b7uiSVBdCsUk6";  // "not-a-password-anyone-uses"

TEST(WebConfig, ParsesTheExporterToolkitFormat) {
  WebConfig c;
  std::string error;
  ASSERT_TRUE(ParseWebConfig(std::string("tls_server_config:\n  cert_file: tls/server.crt\n  key_file: /etc/k.key\n"
                                         "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
                                         "basic_auth_users:\n  prometheus: ") + kHash + "\n",
                             "/etc/mergewatch", &c, &error))
      << error;
  EXPECT_EQ(c.cert_file, "/etc/mergewatch/tls/server.crt");
  EXPECT_EQ(c.key_file, "/etc/k.key");
  EXPECT_EQ(c.client_ca_file, "/etc/mergewatch/ca.crt");
  EXPECT_EQ(c.client_auth, ClientAuth::kRequireAndVerify);
  EXPECT_EQ(c.users.at("prometheus"), kHash);
  WebConfig empty;
  EXPECT_TRUE(ParseWebConfig("", "/", &empty, &error));
  EXPECT_FALSE(empty.tls());
}

TEST(WebConfig, RefusesWhatItCannotHonour) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tls_server_config:\n  cert_file: a\n", "cert_file and key_file"},
      {"tls_server_config:\n  cert_fille: a\n  key_file: b\n", "unknown setting tls_server_config.cert_fille"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS9\n", "min_version: unknown TLS version"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n  max_version: TLS12\n",
       "max_version is below tls_server_config.min_version"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_allowed_sans: [x]\n",
       "client_allowed_sans is not supported"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n",
       "cipher_suites: TLS_RSA_WITH_RC4_128_SHA is not supported"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  curve_preferences: [CurveP224]\n",
       "curve_preferences: unknown curve"},
      {"http_server_config:\n  headers:\n    Server: x\n", "HTTP header \"Server\" can not be configured"},
      {"http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "invalid value for X-Frame-Options"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
       "needs client_ca_file"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: VerifyClientCertIfGiven\n",
       "needs client_ca_file"},
      {"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Sometimes\n", "unknown value"},
      {"basic_auth_users:\n  u: plaintext\n", "not a bcrypt hash"},
      {"basic_auth:\n  u: x\n", "unknown setting basic_auth"},
      {"[1, 2", "not valid YAML"},
  };
  for (const auto& [yaml, expected] : cases) {
    WebConfig c;
    std::string error;
    EXPECT_FALSE(ParseWebConfig(yaml, "/", &c, &error)) << yaml;
    EXPECT_NE(error.find(expected), std::string::npos) << yaml << " -> " << error;
  }
}

TEST(WebConfig, TlsPrioritiesFollowExporterToolkitSettings) {
  WebConfig c;
  std::string priorities, error;
  ASSERT_TRUE(TlsPriorities(c, &priorities, &error)) << error;
  // The default floor is TLS 1.2, as exporter-toolkit's.
  EXPECT_EQ(priorities, "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:%SERVER_PRECEDENCE");
  c.min_version = TlsVersion::kTls10;
  c.max_version = TlsVersion::kTls12;
  c.prefer_server_cipher_suites = false;
  c.cipher_suites = {"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"};
  c.curve_preferences = {"X25519", "CurveP256"};
  ASSERT_TRUE(TlsPriorities(c, &priorities, &error)) << error;
  EXPECT_EQ(priorities,
            "NORMAL:-VERS-ALL:+VERS-TLS1.2:+VERS-TLS1.1:+VERS-TLS1.0:-KX-ALL:+ECDHE-RSA:+ECDHE-ECDSA:-CIPHER-ALL:"
            "+AES-128-GCM:-MAC-ALL:+AEAD:-GROUP-ALL:+GROUP-X25519:+GROUP-SECP256R1");
  // Two suites that differ in both key exchange and cipher would let in the two crossed ones.
  c.cipher_suites = {"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"};
  EXPECT_FALSE(TlsPriorities(c, &priorities, &error));
  EXPECT_NE(error.find("tls_server_config.cipher_suites"), std::string::npos) << error;
}

TEST(WebConfig, ParsesEveryClientAuthTypeAndHeaders) {
  const std::vector<std::pair<std::string, ClientAuth>> types = {
      {"NoClientCert", ClientAuth::kNone},
      {"RequestClientCert", ClientAuth::kRequest},
      {"RequireAnyClientCert", ClientAuth::kRequireAny},
      {"VerifyClientCertIfGiven", ClientAuth::kVerifyIfGiven},
      {"RequireAndVerifyClientCert", ClientAuth::kRequireAndVerify}};
  for (const auto& [name, value] : types) {
    WebConfig c;
    std::string error;
    const std::string ca = name.find("Verify") != std::string::npos ? "  client_ca_file: ca.crt\n" : "";
    ASSERT_TRUE(ParseWebConfig("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: " + name +
                                   "\n" + ca + "http_server_config:\n  headers:\n    X-Frame-Options: SAMEORIGIN\n",
                               "/", &c, &error))
        << name << ": " << error;
    EXPECT_EQ(c.client_auth, value) << name;
    EXPECT_EQ(c.headers.at("X-Frame-Options"), "SAMEORIGIN");
  }
}

TEST(WebConfig, LoadSaysWhichFileIsWrongBeforeAnyServerStarts) {
  const std::string dir = testing::TempDir() + "/webcfg-" + std::to_string(getpid());
  ASSERT_EQ(system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/web.yml") << "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";
  WebConfig c;
  WebSecrets secrets;
  std::string error;
  EXPECT_FALSE(LoadWebConfig(dir + "/web.yml", &c, &secrets, &error));
  EXPECT_EQ(error, "cannot read " + dir + "/server.crt: No such file or directory");  // relative to the file's directory
  std::ofstream(dir + "/server.crt") << "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n";
  std::ofstream(dir + "/server.key") << "garbage\n";
  c = WebConfig();
  EXPECT_FALSE(LoadWebConfig(dir + "/web.yml", &c, &secrets, &error));
  EXPECT_NE(error.find(dir + "/server.crt, " + dir + "/server.key: not a matching PEM certificate and key"),
            std::string::npos)
      << error;
  ASSERT_EQ(system(("rm -rf " + dir).c_str()), 0);
}

TEST(BasicAuth, ChecksBcryptAndRemembersOnlySuccess) {
  EXPECT_TRUE(VerifyBcrypt("not-a-password-anyone-uses", kHash));
  EXPECT_FALSE(VerifyBcrypt("not-a-password-anyone-use", kHash));
  EXPECT_FALSE(VerifyBcrypt("x", "*0"));
  BasicAuth auth(std::map<std::string, std::string>{{"prometheus", kHash}});
  EXPECT_TRUE(auth.Check("prometheus", "not-a-password-anyone-uses"));
  EXPECT_TRUE(auth.Check("prometheus", "not-a-password-anyone-uses"));  // from the cache
  EXPECT_FALSE(auth.Check("prometheus", "wrong"));
  EXPECT_FALSE(auth.Check("someone", "not-a-password-anyone-uses"));
  EXPECT_FALSE(auth.Check("", ""));
}

TEST(ProcessStats, ParsesProcStatWithOddCommandNames) {
  // Fields from a real /proc/self/stat, comm changed to hold spaces and a ')'.
  const std::string stat =
      "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1203 0 0 0 150 50 0 0 20 0 3 0 5000 123456789 2048 "
      "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
  ProcessStats s;
  ASSERT_TRUE(ParseProcStat(stat, 100, 4096, 1700000000.0, &s));
  EXPECT_DOUBLE_EQ(s.cpu_seconds, 2.0);            // (150 + 50) / 100
  EXPECT_DOUBLE_EQ(s.start_time_seconds, 1700000050.0);  // boot + 5000 / 100
  EXPECT_DOUBLE_EQ(s.virtual_bytes, 123456789.0);
  EXPECT_DOUBLE_EQ(s.resident_bytes, 2048.0 * 4096);
  EXPECT_FALSE(ParseProcStat("4242 (x) S 1 2", 100, 4096, 0, &s));
}

// process_open_fds from stat()'s size (6.2+) must be the count the listing gives; before 6.2
// the stat path must say it cannot tell (the listing is used then).
TEST(ProcessStats, OpenFdsByStatAreTheListedOnes) {
  std::vector<int> extra;
  for (int i = 0; i < 5; ++i) extra.push_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
  const double listed = CountOpenFdsByListing();
  const double by_stat = CountOpenFdsByStat();
  for (int fd : extra) close(fd);
  ASSERT_GE(listed, 8);  // stdio and the five above
  utsname u{};
  ASSERT_EQ(uname(&u), 0);
  int major = 0, minor = 0;
  ASSERT_EQ(sscanf(u.release, "%d.%d", &major, &minor), 2) << u.release;
  if (major > 6 || (major == 6 && minor >= 2)) {
    EXPECT_EQ(by_stat, listed);
    EXPECT_EQ(CountOpenFds(), CountOpenFdsByListing());
  } else {
    EXPECT_EQ(by_stat, -1) << u.release;
  }
}

TEST(ProcessStats, SelfIsPlausible) {
  ProcessStats s;
  std::string error;
  ASSERT_TRUE(ReadSelfStats(&s, &error)) << error;
  EXPECT_GT(s.resident_bytes, 0);
  EXPECT_GE(s.open_fds, 3);
  EXPECT_GE(s.max_fds, s.open_fds);
  EXPECT_GT(s.start_time_seconds, 1.6e9);
}

}  // namespace
}  // namespace mergewatch
