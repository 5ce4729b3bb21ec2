// SPDX-License-Identifier: Apache-2.0
// What keeps one client (or a few) from taking the endpoint away from Prometheus:
// connection caps per client address and in total, a gate in front of bcrypt, and the counters
// that show them working. Pure cores: the clock and the client's address are parameters.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

namespace mergewatch {

using SteadyTime = std::chrono::steady_clock::time_point;
using SteadyDuration = std::chrono::steady_clock::duration;

// The key one client's connections and failed logins are counted under: the IPv4 address
// (an IPv4-mapped IPv6 address is its IPv4 address), or the IPv6 /64 (one host is given a
// whole /64, and picks any address in it). "other" for any other family.
std::string ClientKey(const sockaddr* address);

// Connections open at once, per client key and in total. The total is below the listen
// backlog (SOMAXCONN, 4096): connections are accepted at once, never left waiting in the
// kernel's queue, where they would delay the scrapes queued behind them. One past its key's cap
// is closed at once; at the total cap the server makes room (WaitOrder) or closes it.
class ConnectionCaps {
 public:
  enum class Verdict { kAdmit, kPerAddress, kTotal };
  ConnectionCaps(unsigned per_address, unsigned total) : per_address_(per_address), total_(total) {}
  // The key's own cap first: a client at its cap never makes room for itself by closing another's.
  Verdict Check(const std::string& key) const;
  void Add(const std::string& key);
  void Remove(const std::string& key);
  size_t open() const;

 private:
  const unsigned per_address_, total_;
  mutable std::mutex mutex_;
  std::map<std::string, unsigned> open_;
  size_t total_open_ = 0;
};

// The connections waiting for a request, in the order they began to wait (accepted, or their last
// response sent): the front has waited longest without sending a complete request. At the total
// cap, a new connection closes the front one rather than being refused; a connection whose
// request is being answered is in none of it, so when every open connection has sent its request
// there is nothing to close and the new one is refused. Not thread-safe.
template <typename T>
class WaitOrder {
 public:
  // `item` (again) begins to wait: it goes to the back.
  void Wait(T item) {
    Leave(item);
    where_.emplace(item, order_.insert(order_.end(), item));
  }
  // `item` no longer waits (its request is being answered; it is closed, or being closed).
  void Leave(T item) {
    const auto it = where_.find(item);
    if (it == where_.end()) return;
    order_.erase(it->second);
    where_.erase(it);
  }
  // The one that has waited longest; false if none waits.
  bool Longest(T* item) const {
    if (order_.empty()) return false;
    *item = order_.front();
    return true;
  }
  size_t size() const { return order_.size(); }

 private:
  std::list<T> order_;
  std::unordered_map<T, typename std::list<T>::iterator> where_;
};

// In front of every bcrypt run (a check the success cache could not answer). bcrypt costs
// 50 ms at cost 10 by design, so failed checks are the attack: at most one runs at a time;
// after a failed one the gate stays shut for as long again (failed checks take at most half
// of one CPU, however many clients send them); and each client key that failed waits
// first_delay, doubling with each further failure up to max_delay, before its next check.
// A success forgets the key's failures. Thread-safe.
class AuthGate {
 public:
  struct Policy {
    SteadyDuration first_delay = std::chrono::milliseconds(100);
    SteadyDuration max_delay = std::chrono::seconds(10);
    size_t max_clients = 4096;  // keys remembered; past it, new keys are refused until some expire
  };
  enum class Verdict {
    kRun,        // run the check now, then call Done()
    kThrottled,  // this client failed recently: refuse without a check
    kBusy,       // another check runs, or the gate cools down after a failed one
  };
  AuthGate() : AuthGate(Policy{}) {}
  explicit AuthGate(Policy policy) : policy_(policy) {}
  // `retry_after`: when the client may try again (for Retry-After), unless kRun.
  Verdict Admit(const std::string& client, SteadyTime now, SteadyDuration* retry_after);
  // `started`: when the check began, or `ended` less the CPU time it took (the cool-down lasts
  // as long as the check's cost).
  void Done(const std::string& client, bool ok, SteadyTime started, SteadyTime ended);

 private:
  struct Failures {
    unsigned count = 0;
    SteadyTime next_allowed{};
  };
  const Policy policy_;
  std::mutex mutex_;
  bool running_ = false;
  SteadyTime shut_until_{};
  std::map<std::string, Failures> failures_;
};

// What the defences did, for /metrics (mergewatch_http_*).
struct HttpDefenceCounts {
  std::atomic<uint64_t> auth_missing{0};    // no or malformed Authorization header
  std::atomic<uint64_t> auth_wrong{0};      // bcrypt said no (unknown users included)
  std::atomic<uint64_t> auth_throttled{0};  // refused without a check: the client failed recently
  std::atomic<uint64_t> auth_busy{0};       // refused without a check: the gate was shut
  std::atomic<uint64_t> refused_per_address{0};
  std::atomic<uint64_t> refused_total{0};   // at the total cap, and no open connection waits for a request
  std::atomic<uint64_t> evicted{0};         // waited longest, closed at the total cap to make room for a new one
  std::atomic<uint64_t> bad_requests{0};    // 400s of the strictness checks (target, Host)
  std::atomic<uint64_t> timed_out_request{0};   // no complete request in time (idle, or a byte now and then)
  std::atomic<uint64_t> timed_out_response{0};  // a response the client read nothing of for too long
  std::atomic<int64_t> open_connections{0};
};

std::vector<prometheus::MetricFamily> DefenceFamilies(const HttpDefenceCounts& counts, unsigned per_address_cap,
                                                      unsigned total_cap);

// mergewatch_http_* for every scrape, always (not part of --web.disable-exporter-metrics: they
// are how an operator sees an attack and the defences working).
class DefenceCollector final : public prometheus::Collectable {
 public:
  DefenceCollector(std::shared_ptr<const HttpDefenceCounts> counts, unsigned per_address_cap, unsigned total_cap)
      : counts_(std::move(counts)), per_address_cap_(per_address_cap), total_cap_(total_cap) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return DefenceFamilies(*counts_, per_address_cap_, total_cap_);
  }

 private:
  std::shared_ptr<const HttpDefenceCounts> counts_;
  unsigned per_address_cap_, total_cap_;
};

// The raw request target (before %-decoding): "" if acceptable, else why it is refused (400).
// It must be origin-form (start with '/'), so "%2fmetrics" is refused, and hold no NUL, raw or
// as %00 anywhere (path or query), so no decoded path is ever cut short.
std::string TargetProblem(const std::string& raw_target);

// Whether a Host header value (host[:port], [v6]:port) names one of `allowed` (lower-case
// names, compared without the port, case-insensitively). An empty list allows any.
bool HostAllowed(const std::string& host_header, const std::vector<std::string>& allowed);

}  // namespace mergewatch
