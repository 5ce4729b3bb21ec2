// SPDX-License-Identifier: Apache-2.0
#include "config.h"

#include <gtest/gtest.h>

#include <vector>

#include "exit_codes.h"
#include "http/listen.h"

#include <unistd.h>

namespace mergewatch {
namespace {

ParseResult Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "mergewatchd");
  return ParseFlags(static_cast<int>(args.size()), args.data());
}

TEST(ParseFlags, DefaultsRun) {
  ParseResult r = Parse({});
  ASSERT_TRUE(r.run);
  EXPECT_EQ(r.config.listen_addresses, std::vector<std::string>{":9863"});
  EXPECT_TRUE(r.config.web_config_file.empty());
  EXPECT_FALSE(r.config.systemd_socket);
  EXPECT_FALSE(r.config.disable_exporter_metrics);
  EXPECT_EQ(r.config.telemetry_path, "/metrics");
  EXPECT_EQ(r.config.sysfs_root, "/sys");
  EXPECT_EQ(r.config.program_type, ProgramType::kAuto);
  EXPECT_EQ(r.config.source, SourceChoice::kAuto);
  EXPECT_EQ(r.config.inflight_entries, 65536u);  // docs/operations.md and mergewatch_bpf_inflight_capacity say so
}

TEST(ParseFlags, AnEmptyValueAfterEqualsIsEmptyAndEatsNoArgument) {
  // "--devices.exclude=" keeps every device; CLI11 alone took the next flag as the pattern.
  ParseResult r = Parse({"--devices.exclude=", "--web.listen-address=127.0.0.1:9101"});
  ASSERT_TRUE(r.run) << r.output;
  EXPECT_TRUE(r.config.devices.KeepsEveryDevice());
  EXPECT_EQ(r.config.listen_addresses, std::vector<std::string>{"127.0.0.1:9101"});
  r = Parse({"--web.listen-address="});  // an empty value is still checked as one
  EXPECT_FALSE(r.run);
  EXPECT_EQ(r.exit_code, kExitUsage) << r.output;
  r = Parse({"--collapse.window=", "--log.level=debug"});
  EXPECT_FALSE(r.run);
  EXPECT_EQ(r.exit_code, kExitUsage) << r.output;
}

TEST(ParseFlags, ProgramTypeCanBePinned) {
  for (ProgramType type : {ProgramType::kAuto, ProgramType::kTpBtf, ProgramType::kRawTp}) {
    const std::string flag = std::string("--bpf.program-type=") + ProgramTypeName(type);
    ParseResult r = Parse({flag.c_str()});
    ASSERT_TRUE(r.run) << r.output;
    EXPECT_EQ(r.config.program_type, type);
  }
  EXPECT_FALSE(Parse({"--bpf.program-type=kprobe"}).run);
  for (SourceChoice choice : {SourceChoice::kBpf, SourceChoice::kDiskstats}) {
    ParseResult r = Parse({choice == SourceChoice::kBpf ? "--source=bpf" : "--source=diskstats"});
    ASSERT_TRUE(r.run) << r.output;
    EXPECT_EQ(r.config.source, choice);
  }
}

TEST(ParseFlags, AcceptsPrometheusStyleFlags) {
  ParseResult r = Parse({"--web.listen-address=127.0.0.1:9100", "--path.sysfs", "/tmp/sys", "--log.level=debug"});
  ASSERT_TRUE(r.run) << r.output;
  EXPECT_EQ(r.config.listen_addresses, std::vector<std::string>{"127.0.0.1:9100"});
  EXPECT_EQ(r.config.sysfs_root, "/tmp/sys");
  EXPECT_EQ(r.config.log_level, LogLevel::kDebug);
}

TEST(ParseFlags, UnknownFlagIsAUsageError) {
  ParseResult r = Parse({"--web.listen-adress=:1"});
  EXPECT_FALSE(r.run);
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.output.find("--web.listen-adress"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--help"), std::string::npos);
}

TEST(ParseFlags, BadValuesSayWhatIsWrong) {
  for (auto args : std::vector<std::vector<const char*>>{{"--log.level=loud"},
                                                          {"--web.listen-address=9863"},
                                                          {"--web.listen-address=:99999"},
                                                          {"--web.listen-address=::1:9863"},
                                                          {"--web.listen-address=[::1]9863"},
                                                          {"--web.listen-address=[nope]:9863"},
                                                          {"--web.telemetry-path=metrics"},
                                                          {"--bpf.inflight-entries=1"},
                                                          {"--bpf.program-type=kprobe"}}) {
    ParseResult r = Parse(args);
    EXPECT_FALSE(r.run) << args[0];
    EXPECT_EQ(r.exit_code, kExitUsage) << args[0];
    EXPECT_NE(r.output.find("mergewatchd: "), std::string::npos) << r.output;
  }
}

TEST(ParseFlags, HelpAndVersionExitZero) {
  ParseResult help = Parse({"--help"});
  EXPECT_FALSE(help.run);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--web.listen-address"), std::string::npos);
  ParseResult version = Parse({"--version"});
  EXPECT_FALSE(version.run);
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.output.rfind("mergewatchd, version ", 0), 0u);
  for (const char* field : {" (branch: ", ", revision: ", "\n  build date:", "\n  toolchain:", "\n  platform:"})
    EXPECT_NE(version.output.find(field), std::string::npos) << field;
}

TEST(ParseFlags, ListenAddressRepeatsAndTakesIpv6) {
  ParseResult r = Parse({"--web.listen-address=[::1]:9100", "--web.listen-address=127.0.0.1:9101"});
  ASSERT_TRUE(r.run) << r.output;
  EXPECT_EQ(r.config.listen_addresses, (std::vector<std::string>{"[::1]:9100", "127.0.0.1:9101"}));
}

TEST(ParseFlags, HiddenTestFlagIsNotInHelp) {
  EXPECT_EQ(Parse({"--help"}).output.find("debug.fail"), std::string::npos);
  ParseResult r = Parse({"--debug.fail-after-ticks=3"});
  ASSERT_TRUE(r.run) << r.output;
  EXPECT_EQ(r.config.fail_after_ticks, 3u);
}

TEST(ParseListenAddress, ExporterForms) {
  ListenAddress a;
  std::string error;
  ASSERT_TRUE(ParseListenAddress(":9863", &a, &error)) << error;
  EXPECT_EQ(a.host, "");
  EXPECT_EQ(a.port, 9863);
  ASSERT_TRUE(ParseListenAddress("[::]:9863", &a, &error)) << error;
  EXPECT_EQ(a.host, "::");
  ASSERT_TRUE(ParseListenAddress("[::1]:0", &a, &error)) << error;
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 0);
  ASSERT_TRUE(ParseListenAddress("localhost:1", &a, &error)) << error;
  EXPECT_EQ(a.host, "localhost");
  EXPECT_FALSE(ParseListenAddress("::1:80", &a, &error));
  EXPECT_NE(error.find("brackets"), std::string::npos) << error;
  EXPECT_FALSE(ParseListenAddress("[::1]", &a, &error));
  EXPECT_FALSE(ParseListenAddress("1.2.3.4:65536", &a, &error));
}

TEST(OpenListener, Ipv6LoopbackAcceptsAndNamesItself) {
  ListenAddress a;
  std::string error;
  ASSERT_TRUE(ParseListenAddress("[::1]:0", &a, &error));
  const int fd = OpenListener(a, &error);
  ASSERT_GE(fd, 0) << error;
  const std::string name = SocketName(fd);
  EXPECT_EQ(name.rfind("[::1]:", 0), 0u) << name;
  close(fd);
}

}  // namespace
}  // namespace mergewatch
