#include "config.h"

#include <gtest/gtest.h>

#include <vector>

#include "exit_codes.h"

namespace mergewatch {
namespace {

ParseResult Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "mergewatchd");
  return ParseFlags(static_cast<int>(args.size()), args.data());
}

TEST(ParseFlags, DefaultsRun) {
  ParseResult r = Parse({});
  ASSERT_TRUE(r.run);
  EXPECT_EQ(r.config.listen_address, ":9863");
  EXPECT_EQ(r.config.telemetry_path, "/metrics");
  EXPECT_EQ(r.config.sysfs_root, "/sys");
  EXPECT_EQ(r.config.program_type, "auto");
  EXPECT_EQ(r.config.inflight_entries, 65536u);  // README and mergewatch_bpf_inflight_capacity say so
}

TEST(ParseFlags, ProgramTypeCanBePinned) {
  for (const char* type : {"auto", "tp_btf", "raw_tp"}) {
    const std::string flag = std::string("--bpf.program-type=") + type;
    ParseResult r = Parse({flag.c_str()});
    ASSERT_TRUE(r.run) << r.output;
    EXPECT_EQ(r.config.program_type, type);
  }
}

TEST(ParseFlags, AcceptsPrometheusStyleFlags) {
  ParseResult r = Parse({"--web.listen-address=127.0.0.1:9100", "--path.sysfs", "/tmp/sys", "--log.level=debug"});
  ASSERT_TRUE(r.run) << r.output;
  EXPECT_EQ(r.config.listen_address, "127.0.0.1:9100");
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
                                                          {"--web.listen-address=[::1]:9863"},
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
  EXPECT_EQ(version.output.rfind("mergewatchd ", 0), 0u);
}

TEST(NormalizeListenAddress, MapsEmptyHostToAllInterfaces) {
  std::string port, error;
  ASSERT_TRUE(NormalizeListenAddress(":9863", &port, &error));
  EXPECT_EQ(port, "0.0.0.0:9863");
  ASSERT_TRUE(NormalizeListenAddress("localhost:1", &port, &error));
  EXPECT_EQ(port, "127.0.0.1:1");
  EXPECT_FALSE(NormalizeListenAddress("example.com:80", &port, &error));
  EXPECT_NE(error.find("IPv4"), std::string::npos);
}

}  // namespace
}  // namespace mergewatch
