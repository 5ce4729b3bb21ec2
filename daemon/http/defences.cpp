// SPDX-License-Identifier: Apache-2.0
#include "http/defences.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace mergewatch {

std::string ClientKey(const sockaddr* address) {
  if (address == nullptr) return "other";
  char text[INET6_ADDRSTRLEN] = "";
  if (address->sa_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    return text;
  }
  if (address->sa_family == AF_INET6) {
    in6_addr a = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      in_addr v4{};
      memcpy(&v4, &a.s6_addr[12], 4);
      inet_ntop(AF_INET, &v4, text, sizeof(text));
      return text;
    }
    memset(&a.s6_addr[8], 0, 8);
    inet_ntop(AF_INET6, &a, text, sizeof(text));
    return std::string(text) + "/64";
  }
  return "other";
}

ConnectionCaps::Verdict ConnectionCaps::Check(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = open_.find(key);
  if (it != open_.end() && it->second >= per_address_) return Verdict::kPerAddress;
  if (total_open_ >= total_) return Verdict::kTotal;
  return Verdict::kAdmit;
}

void ConnectionCaps::Add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++open_[key];
  ++total_open_;
}

void ConnectionCaps::Remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = open_.find(key);
  if (it == open_.end()) return;
  if (--it->second == 0) open_.erase(it);
  --total_open_;
}

size_t ConnectionCaps::open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_open_;
}

AuthGate::Verdict AuthGate::Admit(const std::string& client, SteadyTime now, SteadyDuration* retry_after) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = failures_.find(client);
  if (it != failures_.end() && now < it->second.next_allowed) {
    *retry_after = it->second.next_allowed - now;
    return Verdict::kThrottled;
  }
  if (running_ || now < shut_until_) {
    *retry_after = running_ ? policy_.first_delay : shut_until_ - now;
    return Verdict::kBusy;
  }
  if (it == failures_.end() && failures_.size() >= policy_.max_clients) {
    // Full: forget the keys that may try again anyway (their delay is over).
    for (auto f = failures_.begin(); f != failures_.end();) f = now >= f->second.next_allowed ? failures_.erase(f) : ++f;
    if (failures_.size() >= policy_.max_clients) {
      *retry_after = policy_.max_delay;
      return Verdict::kBusy;
    }
  }
  running_ = true;
  return Verdict::kRun;
}

void AuthGate::Done(const std::string& client, bool ok, SteadyTime started, SteadyTime ended) {
  std::lock_guard<std::mutex> lock(mutex_);
  running_ = false;
  if (ok) {
    failures_.erase(client);
    return;
  }
  shut_until_ = ended + (ended - started);
  Failures& f = failures_[client];
  SteadyDuration delay = policy_.first_delay;
  for (unsigned i = 0; i < f.count && delay < policy_.max_delay; ++i) delay *= 2;
  f.count = std::min(f.count + 1, 64u);
  f.next_allowed = ended + std::min(delay, policy_.max_delay);
}

namespace {

prometheus::ClientMetric Counter(const std::string& label, const std::string& value, double v) {
  prometheus::ClientMetric m;
  m.label.push_back({label, value});
  m.counter.value = v;
  return m;
}

prometheus::ClientMetric Gauge(double v) {
  prometheus::ClientMetric m;
  m.gauge.value = v;
  return m;
}

// A counter family of one series without labels.
prometheus::MetricFamily SingleCounter(const std::string& name, const std::string& help, double v) {
  prometheus::MetricFamily family{name, help, prometheus::MetricType::Counter, {}};
  prometheus::ClientMetric m;
  m.counter.value = v;
  family.metric = {m};
  return family;
}

}  // namespace

std::vector<prometheus::MetricFamily> DefenceFamilies(const HttpDefenceCounts& c, unsigned per_address_cap,
                                                      unsigned total_cap) {
  prometheus::MetricFamily auth{"mergewatch_http_auth_failures_total",
                                "Requests refused by basic authentication, by reason: missing (no credentials), "
                                "wrong (bcrypt said no, unknown users included), throttled (the client address "
                                "failed recently and must wait), busy (another check ran or the gate cooled down "
                                "after a failed one). Only wrong cost a bcrypt run.",
                                prometheus::MetricType::Counter,
                                {}};
  auth.metric = {Counter("reason", "missing", c.auth_missing), Counter("reason", "wrong", c.auth_wrong),
                 Counter("reason", "throttled", c.auth_throttled), Counter("reason", "busy", c.auth_busy)};
  prometheus::MetricFamily refused{
      "mergewatch_http_connections_refused_total",
      "Connections closed by the caps: per_address (closed as soon as accepted: " + std::to_string(per_address_cap) +
          " open connections per client IPv4 address or IPv6 /64), evicted (at the total cap of " +
          std::to_string(total_cap) +
          ", the open connection that had waited longest without sending a complete request, closed to make room "
          "for a new one) or total (closed as soon as accepted: the total cap was reached and every open connection "
          "had sent a complete request).",
      prometheus::MetricType::Counter,
      {}};
  refused.metric = {Counter("reason", "per_address", c.refused_per_address),
                    Counter("reason", "total", c.refused_total), Counter("reason", "evicted", c.evicted)};
  prometheus::MetricFamily bad = SingleCounter(
      "mergewatch_http_bad_requests_total",
      "Requests answered 400 by the daemon's own checks: a NUL or %00 in the target, a target not starting with /, "
      "HTTP/1.1 without Host, a Host not in --web.allowed-hosts.",
      c.bad_requests);
  prometheus::MetricFamily timed_out{
      "mergewatch_http_connections_timed_out_total",
      "Connections closed by a deadline: request (no complete request within the request timeout, 3 s, of accept or "
      "of the previous response: idle keep-alive connections, clients sending a byte now and then) or response (the "
      "client read nothing of its response for 10 s).",
      prometheus::MetricType::Counter,
      {}};
  timed_out.metric = {Counter("reason", "request", c.timed_out_request),
                      Counter("reason", "response", c.timed_out_response)};
  prometheus::MetricFamily open{"mergewatch_http_connections_open", "HTTP connections open now, this scrape's included.",
                                prometheus::MetricType::Gauge,
                                {}};
  open.metric = {Gauge(static_cast<double>(c.open_connections))};
  return {auth, refused, bad, timed_out, open};
}

std::string TargetProblem(const std::string& raw_target) {
  if (raw_target.find('\0') != std::string::npos) return "a NUL byte in the request target";
  for (size_t i = 0; i + 2 < raw_target.size(); ++i)
    if (raw_target[i] == '%' && raw_target[i + 1] == '0' && raw_target[i + 2] == '0')
      return "%00 (an encoded NUL) in the request target";
  if (raw_target.empty() || raw_target[0] != '/') return "the request target does not start with /";
  return "";
}

bool HostAllowed(const std::string& host_header, const std::vector<std::string>& allowed) {
  if (allowed.empty()) return true;
  std::string host = host_header;
  if (!host.empty() && host[0] == '[') {
    const size_t close = host.find(']');
    host = close == std::string::npos ? host : host.substr(0, close + 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    host.resize(colon);
  }
  std::transform(host.begin(), host.end(), host.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (!host.empty() && host.back() == '.') host.pop_back();  // "localhost." is "localhost"
  return std::find(allowed.begin(), allowed.end(), host) != allowed.end();
}

}  // namespace mergewatch
