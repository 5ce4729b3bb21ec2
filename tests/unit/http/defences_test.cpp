// SPDX-License-Identifier: Apache-2.0
// The pure cores of the endpoint's defences: client keys, connection caps, the gate in
// front of bcrypt, the request-target and Host checks, and the start-up hash checks.
#include <arpa/inet.h>
#include <crypt.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <chrono>
#include <string>

#include "http/defences.h"
#include "http/web_config.h"

namespace mergewatch {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string KeyOf4(const char* text) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, text, &a.sin_addr);
  return ClientKey(reinterpret_cast<const sockaddr*>(&a));
}

std::string KeyOf6(const char* text) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  inet_pton(AF_INET6, text, &a.sin6_addr);
  return ClientKey(reinterpret_cast<const sockaddr*>(&a));
}

TEST(Defences, ClientKeyIsTheIpv4AddressOrTheIpv6Slash64) {
  EXPECT_EQ(KeyOf4("127.0.0.2"), "127.0.0.2");
  EXPECT_EQ(KeyOf6("::ffff:192.0.2.7"), "192.0.2.7");  // a dual-stack socket's IPv4 client
  EXPECT_EQ(KeyOf6("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::/64");
  EXPECT_EQ(KeyOf6("2001:db8:1:2::1"), KeyOf6("2001:db8:1:2:ffff::9"));  // one host's /64 is one client
  EXPECT_NE(KeyOf6("2001:db8:1:2::1"), KeyOf6("2001:db8:1:3::1"));
  EXPECT_EQ(ClientKey(nullptr), "other");
}

TEST(Defences, ConnectionCapsPerAddressThenInTotal) {
  ConnectionCaps caps(2, 3);
  EXPECT_EQ(caps.Check("a"), ConnectionCaps::Verdict::kAdmit);
  caps.Add("a");
  caps.Add("a");
  EXPECT_EQ(caps.Check("a"), ConnectionCaps::Verdict::kPerAddress);
  EXPECT_EQ(caps.Check("b"), ConnectionCaps::Verdict::kAdmit);
  caps.Add("b");
  EXPECT_EQ(caps.Check("c"), ConnectionCaps::Verdict::kTotal);
  // The address's own cap first: at the total cap too, a client at its own never makes room for itself.
  EXPECT_EQ(caps.Check("a"), ConnectionCaps::Verdict::kPerAddress);
  caps.Remove("a");
  EXPECT_EQ(caps.open(), 2u);
  EXPECT_EQ(caps.Check("a"), ConnectionCaps::Verdict::kAdmit);
  caps.Remove("nobody");  // not counted: nothing happens
  EXPECT_EQ(caps.open(), 2u);
}

TEST(Defences, WaitOrderGivesTheConnectionThatHasWaitedLongest) {
  WaitOrder<int> waiting;
  int chosen = 0;
  EXPECT_FALSE(waiting.Longest(&chosen));  // none waits: the new connection is refused
  waiting.Wait(1);  // accepted, in this order
  waiting.Wait(2);
  waiting.Wait(3);
  ASSERT_TRUE(waiting.Longest(&chosen));
  EXPECT_EQ(chosen, 1);
  waiting.Leave(1);  // its request is being answered: never chosen
  ASSERT_TRUE(waiting.Longest(&chosen));
  EXPECT_EQ(chosen, 2);
  waiting.Wait(1);  // answered: it waits again, from now on, behind the others
  waiting.Wait(2);  // and 2 too
  ASSERT_TRUE(waiting.Longest(&chosen));
  EXPECT_EQ(chosen, 3);
  waiting.Leave(3);
  waiting.Leave(3);  // leaving twice (cut, then closed) is nothing
  waiting.Leave(7);  // nor is one that never waited
  ASSERT_TRUE(waiting.Longest(&chosen));
  EXPECT_EQ(chosen, 1);
  EXPECT_EQ(waiting.size(), 2u);
  waiting.Leave(1);
  waiting.Leave(2);
  EXPECT_FALSE(waiting.Longest(&chosen));
  EXPECT_EQ(waiting.size(), 0u);
}

TEST(Defences, AuthGateRunsOneCheckAtATimeAndCoolsDownAfterAFailure) {
  AuthGate gate;
  const SteadyTime t0{seconds(1000)};
  SteadyDuration retry{};
  ASSERT_EQ(gate.Admit("a", t0, &retry), AuthGate::Verdict::kRun);
  EXPECT_EQ(gate.Admit("b", t0, &retry), AuthGate::Verdict::kBusy);  // one at a time
  gate.Done("a", false, t0, t0 + milliseconds(50));
  // Shut for as long as the failed check took: b waits until t0 + 100 ms.
  EXPECT_EQ(gate.Admit("b", t0 + milliseconds(99), &retry), AuthGate::Verdict::kBusy);
  EXPECT_EQ(retry, milliseconds(1));
  ASSERT_EQ(gate.Admit("b", t0 + milliseconds(100), &retry), AuthGate::Verdict::kRun);
  gate.Done("b", true, t0 + milliseconds(100), t0 + milliseconds(150));
  // A success does not shut the gate.
  ASSERT_EQ(gate.Admit("b", t0 + milliseconds(150), &retry), AuthGate::Verdict::kRun);
  gate.Done("b", true, t0 + milliseconds(150), t0 + milliseconds(200));
}

TEST(Defences, AuthGateSlowsEachFailingAddressDoublingToTheMaximum) {
  AuthGate gate(AuthGate::Policy{milliseconds(100), seconds(1), 4096});
  SteadyTime now{seconds(1000)};
  SteadyDuration retry{};
  const SteadyDuration expected[] = {milliseconds(100), milliseconds(200), milliseconds(400), milliseconds(800),
                                     seconds(1), seconds(1)};
  for (SteadyDuration delay : expected) {
    ASSERT_EQ(gate.Admit("a", now, &retry), AuthGate::Verdict::kRun);
    gate.Done("a", false, now, now);  // a check of no CPU time: no cool-down for others
    EXPECT_EQ(gate.Admit("a", now + delay - milliseconds(1), &retry), AuthGate::Verdict::kThrottled);
    EXPECT_EQ(retry, milliseconds(1));
    EXPECT_EQ(gate.Admit("b", now, &retry), AuthGate::Verdict::kRun) << "another address is not slowed";
    gate.Done("b", true, now, now);
    now += delay;
  }
  // A success forgets the failures.
  ASSERT_EQ(gate.Admit("a", now, &retry), AuthGate::Verdict::kRun);
  gate.Done("a", true, now, now);
  ASSERT_EQ(gate.Admit("a", now, &retry), AuthGate::Verdict::kRun);
  gate.Done("a", false, now, now);
  EXPECT_EQ(gate.Admit("a", now + milliseconds(100), &retry), AuthGate::Verdict::kRun);
  gate.Done("a", true, now, now);
}

TEST(Defences, AuthGateRemembersABoundedNumberOfAddresses) {
  AuthGate gate(AuthGate::Policy{milliseconds(100), seconds(10), 3});
  const SteadyTime t0{seconds(1000)};
  SteadyDuration retry{};
  for (const char* c : {"a", "b", "c"}) {
    ASSERT_EQ(gate.Admit(c, t0, &retry), AuthGate::Verdict::kRun);
    gate.Done(c, false, t0, t0);
  }
  EXPECT_EQ(gate.Admit("d", t0 + milliseconds(50), &retry), AuthGate::Verdict::kBusy);  // full, all still waiting
  ASSERT_EQ(gate.Admit("d", t0 + milliseconds(100), &retry), AuthGate::Verdict::kRun);   // their delays are over
  gate.Done("d", false, t0 + milliseconds(100), t0 + milliseconds(100));
}

TEST(Defences, TargetProblemRefusesNulAndTargetsNotStartingWithASlash) {
  EXPECT_EQ(TargetProblem("/metrics"), "");
  EXPECT_EQ(TargetProblem("/metrics?x=1&y=%41"), "");
  EXPECT_EQ(TargetProblem("/met%72ics"), "");
  EXPECT_NE(TargetProblem("/metrics%00.json"), "");
  EXPECT_NE(TargetProblem("/metrics?x=%00"), "");
  EXPECT_NE(TargetProblem(std::string("/metrics\0.json", 14)), "");
  EXPECT_NE(TargetProblem("%2fmetrics"), "");
  EXPECT_NE(TargetProblem("metrics"), "");
  EXPECT_NE(TargetProblem(""), "");
  EXPECT_EQ(TargetProblem("/%30%30"), "");  // "00" encoded is not a NUL
}

TEST(Defences, HostAllowedComparesNamesWithoutPortOrCase) {
  const std::vector<std::string> allowed = {"metrics.example", "[::1]", "127.0.0.1"};
  EXPECT_TRUE(HostAllowed("anything", {}));
  EXPECT_TRUE(HostAllowed("metrics.example", allowed));
  EXPECT_TRUE(HostAllowed("METRICS.Example:9863", allowed));
  EXPECT_TRUE(HostAllowed("metrics.example.", allowed));
  EXPECT_TRUE(HostAllowed("[::1]:9863", allowed));
  EXPECT_TRUE(HostAllowed("127.0.0.1:9863", allowed));
  EXPECT_FALSE(HostAllowed("evil.example", allowed));
  EXPECT_FALSE(HostAllowed("metrics.example.evil", allowed));
  EXPECT_FALSE(HostAllowed("", allowed));
}

TEST(Defences, StartUpRefusesHighCostsAndHashesLibxcryptCannotVerify) {
  // A real cost-4 hash (fast), made here with libxcrypt itself.
  crypt_data data{};
  char salt[64];
  ASSERT_NE(crypt_gensalt_rn("$2b$", 4, nullptr, 0, salt, sizeof(salt)), nullptr);
  const std::string good = crypt_r("pw", salt, &data);
  ASSERT_EQ(good.size(), 60u);
  EXPECT_EQ(BcryptHashProblem(good), "");
  std::string cost31 = good;
  cost31.replace(4, 2, "31");
  EXPECT_NE(BcryptHashProblem(cost31).find("bcrypt cost 31 is above the maximum of 12"), std::string::npos);
  std::string cost13 = good;
  cost13.replace(4, 2, "13");
  EXPECT_NE(BcryptHashProblem(cost13).find("above the maximum"), std::string::npos);
  const std::string garbage = "$2y$04$" + std::string(53, '!');
  EXPECT_NE(BcryptHashProblem(garbage).find("libxcrypt cannot verify"), std::string::npos);
  std::string no_cost = good;
  no_cost.replace(4, 2, "x1");
  EXPECT_NE(BcryptHashProblem(no_cost).find("no two-digit cost"), std::string::npos);
  // And through the parser, with the user named.
  WebConfig config;
  std::string error;
  EXPECT_FALSE(ParseWebConfig("basic_auth_users:\n  prom: '" + cost31 + "'\n", ".", &config, &error));
  EXPECT_NE(error.find("basic_auth_users.prom: bcrypt cost 31"), std::string::npos) << error;
  EXPECT_TRUE(ParseWebConfig("basic_auth_users:\n  prom: '" + good + "'\n", ".", &config, &error)) << error;
}

TEST(Defences, CountersAreExportedByReason) {
  HttpDefenceCounts counts;
  counts.auth_wrong = 3;
  counts.refused_per_address = 7;
  counts.refused_total = 1;
  counts.evicted = 6;
  counts.open_connections = 2;
  counts.timed_out_request = 5;
  counts.timed_out_response = 4;
  const auto families = DefenceFamilies(counts, 32, 1024);
  ASSERT_EQ(families.size(), 5u);
  EXPECT_EQ(families[0].name, "mergewatch_http_auth_failures_total");
  EXPECT_EQ(families[0].metric[1].label[0].value, "wrong");
  EXPECT_EQ(families[0].metric[1].counter.value, 3);
  EXPECT_EQ(families[1].name, "mergewatch_http_connections_refused_total");
  ASSERT_EQ(families[1].metric.size(), 3u);
  EXPECT_EQ(families[1].metric[0].label[0].value, "per_address");
  EXPECT_EQ(families[1].metric[0].counter.value, 7);
  EXPECT_EQ(families[1].metric[1].label[0].value, "total");
  EXPECT_EQ(families[1].metric[1].counter.value, 1);
  EXPECT_EQ(families[1].metric[2].label[0].value, "evicted");
  EXPECT_EQ(families[1].metric[2].counter.value, 6);
  EXPECT_EQ(families[3].name, "mergewatch_http_connections_timed_out_total");
  EXPECT_EQ(families[3].metric[0].label[0].value, "request");
  EXPECT_EQ(families[3].metric[0].counter.value, 5);
  EXPECT_EQ(families[3].metric[1].label[0].value, "response");
  EXPECT_EQ(families[3].metric[1].counter.value, 4);
  EXPECT_EQ(families[4].metric[0].gauge.value, 2);
}

}  // namespace
}  // namespace mergewatch
