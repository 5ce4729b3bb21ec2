// SPDX-License-Identifier: Apache-2.0
#include "config.h"

#include <arpa/inet.h>
#include <sys/utsname.h>

#include <CLI/CLI.hpp>
#include <regex>

#include "exit_codes.h"
#include "flag_args.h"
#include "http/listen.h"

#ifndef MERGEWATCH_VERSION
#define MERGEWATCH_VERSION "0.0.0-dev"
#endif

namespace mergewatch {

#ifndef MERGEWATCH_BRANCH
#define MERGEWATCH_BRANCH ""
#endif
#ifndef MERGEWATCH_REVISION
#define MERGEWATCH_REVISION ""
#endif
#ifndef MERGEWATCH_BUILD_DATE
#define MERGEWATCH_BUILD_DATE ""
#endif
#ifndef MERGEWATCH_TOOLCHAIN
#define MERGEWATCH_TOOLCHAIN ""
#endif

std::string VersionString() { return MERGEWATCH_VERSION; }

std::string VersionReport() {
  auto or_unknown = [](const char* s) { return std::string(*s != '\0' ? s : "unknown"); };
  std::string machine = "unknown";
  if (utsname uts{}; uname(&uts) == 0) machine = uts.machine;
  // node_exporter's layout (prometheus/common/version), so fleet tooling that parses one parses both.
  return "mergewatchd, version " + VersionString() + " (branch: " + or_unknown(MERGEWATCH_BRANCH) +
         ", revision: " + or_unknown(MERGEWATCH_REVISION) + ")\n" +
         "  build date:       " + or_unknown(MERGEWATCH_BUILD_DATE) + "\n" +
         "  toolchain:        " + or_unknown(MERGEWATCH_TOOLCHAIN) + "\n" +
         "  platform:         linux/" + machine + "\n";
}

namespace {

bool ValidRegex(const std::string& pattern) {
  try {
    std::regex compiled(pattern, std::regex::extended);
    return true;
  } catch (const std::regex_error&) {
    return false;
  }
}

}  // namespace

namespace {

// The flags given as text, before CheckFlags turns them into Config fields.
struct RawFlags {
  std::string log_level = "info", log_format = "logfmt", refresh = "1m";
  std::string source = "auto", program_type = "auto", request_clock = "auto";  // CLI11's IsMember admits only the enums' names
  std::string devices_include, devices_exclude = kDefaultDeviceExclude;
  std::string require_upper = "dm", window = "10s", raise_after = "5s", clear_after = "30s";
  bool both_device_flags = false;  // --devices.include and --devices.exclude both given
  bool show_version = false;
};

// --web.*, --path.*: where it serves and what it reads.
void DefineEndpointFlags(CLI::App& app, Config& config) {
  app.add_option("--web.listen-address", config.listen_addresses,
                 "Address to serve metrics on, host:port: :9863 (every interface), 127.0.0.1:9863, [::1]:9863; "
                 "repeat for several")
      ->default_str(":9863");
  app.add_option("--web.config.file", config.web_config_file,
                 "Web config file (exporter-toolkit format) for TLS and basic auth; empty: plain HTTP, no auth")
      ->capture_default_str();
  app.add_option("--web.allowed-hosts", config.allowed_hosts,
                 "Host header names the endpoint answers (comma-separated, port ignored; a request naming "
                 "another gets 400, against DNS rebinding); empty: any")
      ->delimiter(',');
  app.add_flag("--web.systemd-socket", config.systemd_socket,
               "Use the sockets systemd passes (socket activation) instead of --web.listen-address");
  app.add_flag("--web.disable-exporter-metrics", config.disable_exporter_metrics,
               "Leave out the exporter's own metrics (process_*, mergewatch_bpf_program_run*)");
  app.add_option("--web.telemetry-path", config.telemetry_path, "Path under which to expose metrics")
      ->capture_default_str();
  app.add_option("--path.sysfs", config.sysfs_root, "sysfs mount point, for device names and topology")
      ->capture_default_str();
  app.add_option("--path.btf", config.btf_path, "Kernel BTF file used for CO-RE relocation")
      ->capture_default_str();
  app.add_option("--path.procfs", config.procfs_root,
                 "procfs mount point, for diskstats (the diskstats source reads /sys/block/*/stat where it is hidden) and "
                 "self/mountinfo (where the cgroup2 tree that names services is mounted)")
      ->capture_default_str();
}

// --source, --log.*, --bpf.*, --devices.*, --topology.*.
void DefineRunFlags(CLI::App& app, Config& config, RawFlags& raw) {
  app.add_option("--source", raw.source,
                 "Where the evidence comes from: bpf (exit if BPF cannot load), diskstats (no BPF at all: reduced "
                 "evidence), or auto: BPF, else diskstats with the reason in the log and mergewatch_detection_info")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bpf", "diskstats"}));
  app.add_option("--log.level", raw.log_level, "Log level: debug, info, warn, error")->capture_default_str();
  app.add_option("--log.format", raw.log_format,
                 "Log format: logfmt, or json (one JSON object per line, without the journal's priority prefix)")
      ->capture_default_str();
  app.add_option("--bpf.inflight-entries", config.inflight_entries,
                 "Slots of the in-flight table (rounded up to a power of two); requests finding theirs busy are "
                 "counted as dropped")
      ->capture_default_str()
      ->check(CLI::Range(64u, 1u << 22));
  app.add_option("--bpf.program-type", raw.program_type,
                 "auto: tp_btf, falling back to raw_tp where the kernel refuses it; tp_btf or raw_tp: only that "
                 "one (raw_tp reads each field with bpf_probe_read_kernel, slower)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "tp_btf", "raw_tp"}));
  app.add_option("--bpf.request-clock", raw.request_clock,
                 "How requests on queues without an I/O scheduler are timed: auto (the kernel's dispatch stamp where "
                 "it is within 1 us of the dispatch, else the dispatch's own clock, stored without a read), dispatch "
                 "(always the dispatch's own clock), or table (the in-flight table, as on queues with a scheduler)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "dispatch", "table"}));
  app.add_option("--devices.include", raw.devices_include,
                 "Regex (ECMAScript, searched in the kernel name) of the devices to export; only these get series. "
                 "Mutually exclusive with --devices.exclude")
      ->capture_default_str();
  app.add_option("--devices.exclude", raw.devices_exclude,
                 "Regex (ECMAScript, searched in the kernel name) of the devices that get no series; an excluded "
                 "device still shows as the upper device of a page")
      ->capture_default_str();
  app.add_option("--topology.refresh-interval", raw.refresh,
                 "How often sysfs is rescanned regardless of events (devices added, removed or changed are rescanned on "
                 "their uevent, a changed queue setting at the next tick, also on SIGHUP and unknown devices)")
      ->capture_default_str();
}

// --collapse.*: the detector's policy.
void DefineCollapseFlags(CLI::App& app, Config& config, RawFlags& raw) {
  CollapsePolicy& policy = config.collapse;
  app.add_option("--collapse.lower-devices", policy.lower_devices,
                 "Regex (POSIX extended) on the kernel names of the disks the detector watches")
      ->capture_default_str();
  app.add_option("--collapse.require-upper", raw.require_upper,
                 "dm: only disks with a dm device stacked on them; any: dm or md; none: any disk")
      ->capture_default_str();
  app.add_option("--collapse.window", raw.window, "Sliding window the evidence is computed over")->capture_default_str();
  app.add_option("--collapse.raise-after", raw.raise_after, "Raise after the pattern held this long")
      ->capture_default_str();
  app.add_option("--collapse.clear-after", raw.clear_after, "Clear after the disk was healthy this long")
      ->capture_default_str();
  app.add_option("--collapse.min-requests-per-second", policy.min_requests_per_second,
                 "Below this dispatch rate a disk never raises")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--collapse.min-small-share", policy.min_small_share,
                 "Deprecated, ignored (accepted so old command lines still start): the size rule is "
                 "--collapse.min-run-size-ratio")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--collapse.min-missed-share", policy.min_missed_share,
                 "Share of requests that were missed merges needed")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--collapse.max-merge-share", policy.max_merge_share,
                 "Largest share of merged bios that still counts as no merging")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--collapse.min-upper-size-ratio", policy.min_upper_size_ratio,
                 "How much larger the upper device's bios must be than the disk's requests")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--collapse.min-run-size-ratio", policy.min_run_size_ratio,
                 "How much larger than the disk's mean request the requests merging would have built must be "
                 "(the contiguous runs the missed merges formed)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

// The values no CLI11 check covers; "" or the first thing wrong.
std::string CheckFlags(const RawFlags& raw, Config& config) {
  std::string error;
  ListenAddress unused;
  CollapsePolicy& policy = config.collapse;
  if (!ParseSourceChoice(raw.source, &config.source)) {
    error = "--source must be auto, bpf or diskstats, got \"" + raw.source + "\"";
  } else if (!ParseRequestClock(raw.request_clock, &config.request_clock)) {
    error = "--bpf.request-clock must be auto, dispatch or table, got \"" + raw.request_clock + "\"";
  } else if (!ParseProgramType(raw.program_type, &config.program_type)) {
    error = "--bpf.program-type must be auto, tp_btf or raw_tp, got \"" + raw.program_type + "\"";
  } else if (!ParseLogLevel(raw.log_level, &config.log_level)) {
    error = "--log.level must be one of debug, info, warn, error, got \"" + raw.log_level + "\"";
  } else if (!ParseLogFormat(raw.log_format, &config.log_format)) {
    error = "--log.format must be logfmt or json, got \"" + raw.log_format + "\"";
  } else if (config.listen_addresses.empty() && !config.systemd_socket) {
    error = "--web.listen-address: at least one address is needed";
  } else if (!ParseDuration(raw.refresh, &config.topology_refresh) || config.topology_refresh.count() <= 0) {
    error = "--topology.refresh-interval must be a duration like 5s or 500ms, got \"" + raw.refresh + "\"";
  } else if (!ParseUpperRequirement(raw.require_upper, &policy.require_upper)) {
    error = "--collapse.require-upper must be dm, any or none, got \"" + raw.require_upper + "\"";
  } else if (!ParseDuration(raw.window, &policy.window) || policy.window.count() <= 0) {
    error = "--collapse.window must be a positive duration like 10s, got \"" + raw.window + "\"";
  } else if (!ParseDuration(raw.raise_after, &policy.raise_after)) {
    error = "--collapse.raise-after must be a duration like 5s, got \"" + raw.raise_after + "\"";
  } else if (!ParseDuration(raw.clear_after, &policy.clear_after)) {
    error = "--collapse.clear-after must be a duration like 30s, got \"" + raw.clear_after + "\"";
  } else if (raw.both_device_flags && !raw.devices_include.empty() && !raw.devices_exclude.empty()) {
    error = "--devices.include and --devices.exclude are mutually exclusive";
  } else if (!DeviceFilter::Make(raw.devices_include, raw.devices_include.empty() ? raw.devices_exclude : "",
                                 &config.devices, &error)) {
    // error set
  } else if (!ValidRegex(policy.lower_devices)) {
    error = "--collapse.lower-devices is not a valid extended regular expression: \"" + policy.lower_devices + "\"";
  } else if (config.telemetry_path.empty() || config.telemetry_path[0] != '/' || config.telemetry_path == "/") {
    error = "--web.telemetry-path must start with / and not be / itself, got \"" + config.telemetry_path + "\"";
  }
  for (std::string& host : config.allowed_hosts) {
    for (char& c : host) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    if (error.empty() && (host.empty() || host.find_first_of(" /@") != std::string::npos ||
                           (host[0] != '[' && host.find(':') != std::string::npos)))
      error = "--web.allowed-hosts: \"" + host + "\" is not a host name (no port, no scheme; IPv6 in brackets)";
  }
  for (const std::string& address : config.listen_addresses) {
    if (!error.empty()) break;
    if (!ParseListenAddress(address, &unused, &error)) error = "--web.listen-address: " + error;
  }
  return error;
}

}  // namespace

ParseResult ParseFlags(int argc, const char* const* argv) {
  ParseResult result;
  Config& config = result.config;
  CLI::App app{
      "mergewatchd: per-device block I/O request sizes, latencies and merges from eBPF,\n"
      "exported for Prometheus; detects merge collapse (small non-merged dispatch).",
      "mergewatchd"};
  app.get_formatter()->column_width(34);
  RawFlags raw;
  DefineEndpointFlags(app, config);
  DefineRunFlags(app, config, raw);
  DefineCollapseFlags(app, config, raw);
  app.add_flag("--version", raw.show_version, "Print the version and exit");
  app.add_option("--debug.fail-after-ticks", config.fail_after_ticks)->group("");  // tests only, not in --help
  app.add_option("--debug.bpf-loader-hang", config.bpf_loader_hangs)->group("");  // tests only, not in --help

  try {
    const FlagArgs args(argc, argv);
    app.parse(args.argc(), args.argv());
  } catch (const CLI::CallForHelp&) {
    result.output = app.help();
    return result;
  } catch (const CLI::ParseError& e) {
    result.exit_code = kExitUsage;
    result.output = std::string("mergewatchd: ") + e.what() + "\nRun 'mergewatchd --help' for the flags.\n";
    return result;
  }
  if (app.count("--collapse.min-small-share") > 0)
    config.deprecated_flags.push_back(
        "--collapse.min-small-share is deprecated and ignored: the detector compares the requests' size with "
        "what merging would have built (--collapse.min-run-size-ratio), so that 8 and 16 KiB pieces count too");
  if (raw.show_version) {
    result.output = VersionReport();
    return result;
  }
  raw.both_device_flags = app.count("--devices.include") > 0 && app.count("--devices.exclude") > 0;
  const std::string error = CheckFlags(raw, config);
  if (!error.empty()) {
    result.exit_code = kExitUsage;
    result.output = "mergewatchd: " + error + "\n";
    return result;
  }
  config.collapse.excluded_device = [devices = config.devices](const std::string& name) {
    return devices.Excluded(name);
  };
  result.run = true;
  return result;
}

}  // namespace mergewatch
