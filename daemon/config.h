// Command-line configuration, in the Prometheus exporters' flag style.
#pragma once

#include <cstdint>
#include <string>

#include <linux/types.h>

#include "detector.h"
#include "log.h"
#include "mergewatch/abi.h"

namespace mergewatch {

struct Config {
  std::string listen_address = ":9863";  // host:port; empty host = all IPv4 interfaces
  std::string telemetry_path = "/metrics";
  std::string sysfs_root = "/sys";
  std::string btf_path = "/sys/kernel/btf/vmlinux";
  LogLevel log_level = LogLevel::kInfo;
  uint32_t inflight_entries = MW_DEFAULT_INFLIGHT_ENTRIES;
  std::string program_type = "auto";  // auto (tp_btf, else raw_tp), tp_btf or raw_tp
  // A safety net: device add/remove/change arrive as uevents; what has none (queue/ settings
  // written by an admin) shows within this.
  Duration topology_refresh = std::chrono::minutes(1);
  CollapsePolicy collapse;
};

// Outcome of parsing: run with `config`, or exit with `exit_code` after printing
// `output` (help/version text to stdout when exit_code is 0, an error to stderr otherwise).
struct ParseResult {
  bool run = false;
  int exit_code = 0;
  std::string output;
  Config config;
};

ParseResult ParseFlags(int argc, const char* const* argv);

// "host:port" -> civetweb's listening_ports value ("0.0.0.0:9863" for ":9863").
// Returns false with a reason for anything civetweb would misread (IPv6 is not built in).
bool NormalizeListenAddress(const std::string& address, std::string* civet_port, std::string* error);

std::string VersionString();

}  // namespace mergewatch
