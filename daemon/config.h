// SPDX-License-Identifier: Apache-2.0
// Command-line configuration, in the Prometheus exporters' flag style.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <linux/types.h>

#include "detector/detector.h"
#include "log.h"
#include "metrics/device_filter.h"
#include "source/bpf_loader.h"
#include "source/source.h"
#include "mergewatch/abi.h"

namespace mergewatch {

struct Config {
  // host:port each (listen.h); ":9863" is every interface, IPv6 and IPv4.
  std::vector<std::string> listen_addresses = {":9863"};
  std::string web_config_file;     // exporter-toolkit web config: TLS, basic auth (web_config.h)
  std::vector<std::string> allowed_hosts;  // Host header names answered (lower case); empty: any
  bool systemd_socket = false;     // accept on the sockets systemd passes instead of listen_addresses
  bool disable_exporter_metrics = false;  // no process_* and BPF program cost families
  std::string telemetry_path = "/metrics";
  std::string sysfs_root = "/sys";
  std::string btf_path = "/sys/kernel/btf/vmlinux";
  std::string procfs_root = "/proc";
  SourceChoice source = SourceChoice::kAuto;  // --source
  LogLevel log_level = LogLevel::kInfo;
  LogFormat log_format = LogFormat::kLogfmt;
  uint32_t inflight_entries = MW_DEFAULT_INFLIGHT_ENTRIES;
  ProgramType program_type = ProgramType::kAuto;  // --bpf.program-type
  RequestClock request_clock = RequestClock::kAuto;  // --bpf.request-clock
  // A safety net: device add/remove/change arrive as uevents; what has none (queue/ settings
  // written by an admin) shows within this.
  Duration topology_refresh = std::chrono::minutes(1);
  CollapsePolicy collapse;
  DeviceFilter devices;  // --devices.include / --devices.exclude
  // Tests only (hidden flag): the main loop returns an error after this many ticks, so the
  // error exit path runs with scrapes in flight.
  uint32_t fail_after_ticks = 0;
  // Tests only (hidden flag): the first this many BPF loader processes sleep instead of loading,
  // so the daemon's bound on a hung load (kLoaderTimeout), its retries and the recovery run for real.
  uint32_t bpf_loader_hangs = 0;
  // Flags given that no longer do anything: logged at start as warnings.
  std::vector<std::string> deprecated_flags;
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

std::string VersionString();
// --version: version, branch, revision, build date, toolchain and platform, as node_exporter prints them.
std::string VersionReport();

}  // namespace mergewatch
