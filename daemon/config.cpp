#include "config.h"

#include <arpa/inet.h>

#include <CLI/CLI.hpp>
#include <sstream>

#include "exit_codes.h"

#ifndef MERGEWATCH_VERSION
#define MERGEWATCH_VERSION "0.0.0-dev"
#endif

namespace mergewatch {

std::string VersionString() { return MERGEWATCH_VERSION; }

bool NormalizeListenAddress(const std::string& address, std::string* civet_port, std::string* error) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    *error = "expected host:port (e.g. :9863 or 127.0.0.1:9863), got \"" + address + "\"";
    return false;
  }
  std::string host = address.substr(0, colon);
  std::string port = address.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoul(port) > 65535) {
    *error = "port must be a number from 0 to 65535, got \"" + port + "\"";
    return false;
  }
  if (host.empty()) host = "0.0.0.0";
  if (host == "localhost") host = "127.0.0.1";
  in_addr parsed{};
  if (inet_pton(AF_INET, host.c_str(), &parsed) != 1) {
    *error = "host must be an IPv4 address (this HTTP server has no IPv6 or name lookup), got \"" + host + "\"";
    return false;
  }
  *civet_port = host + ":" + port;
  return true;
}

ParseResult ParseFlags(int argc, const char* const* argv) {
  ParseResult result;
  Config& config = result.config;
  CLI::App app{
      "mergewatchd: per-device block I/O request sizes, latencies and merges from eBPF,\n"
      "exported for Prometheus; detects merge collapse (small non-merged dispatch).",
      "mergewatchd"};
  app.get_formatter()->column_width(34);
  std::string log_level = "info";
  bool show_version = false;
  app.add_option("--web.listen-address", config.listen_address,
                 "Address to serve metrics on, host:port (IPv4)")
      ->capture_default_str();
  app.add_option("--web.telemetry-path", config.telemetry_path, "Path under which to expose metrics")
      ->capture_default_str();
  app.add_option("--path.sysfs", config.sysfs_root, "sysfs mount point, for device names and topology")
      ->capture_default_str();
  app.add_option("--path.btf", config.btf_path, "Kernel BTF file used for CO-RE relocation")
      ->capture_default_str();
  app.add_option("--log.level", log_level, "Log level: debug, info, warn, error")->capture_default_str();
  app.add_option("--bpf.inflight-entries", config.inflight_entries,
                 "Requests tracked in flight at once; more are counted as dropped")
      ->capture_default_str()
      ->check(CLI::Range(64u, 1u << 22));
  app.add_flag("--version", show_version, "Print the version and exit");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    result.output = app.help();
    return result;
  } catch (const CLI::ParseError& e) {
    result.exit_code = kExitUsage;
    result.output = std::string("mergewatchd: ") + e.what() + "\nRun 'mergewatchd --help' for the flags.\n";
    return result;
  }
  if (show_version) {
    result.output = "mergewatchd " + VersionString() + "\n";
    return result;
  }
  std::string error, unused;
  if (!ParseLogLevel(log_level, &config.log_level)) {
    error = "--log.level must be one of debug, info, warn, error, got \"" + log_level + "\"";
  } else if (!NormalizeListenAddress(config.listen_address, &unused, &error)) {
    error = "--web.listen-address: " + error;
  } else if (config.telemetry_path.empty() || config.telemetry_path[0] != '/' || config.telemetry_path == "/") {
    error = "--web.telemetry-path must start with / and not be / itself, got \"" + config.telemetry_path + "\"";
  }
  if (!error.empty()) {
    result.exit_code = kExitUsage;
    result.output = "mergewatchd: " + error + "\n";
    return result;
  }
  result.run = true;
  return result;
}

}  // namespace mergewatch
