// SPDX-License-Identifier: Apache-2.0
#include "options.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <set>

#include "config_file.h"
#include "flag_args.h"

#ifndef MERGEWATCH_VERSION
#define MERGEWATCH_VERSION "0.0.0-dev"
#endif

namespace mergewatch::cli {
namespace {

constexpr int kExitUsage = 2;

// A password file holds the password and at most a final newline.
bool ReadPassword(const std::string& path, std::string* password, std::string* error) {
  if (!ReadConfigFile(path, password, error)) return false;
  while (!password->empty() && (password->back() == '\n' || password->back() == '\r')) password->pop_back();
  if (password->empty()) {
    *error = "the password file " + path + " is empty";
    return false;
  }
  return true;
}

std::string Resolve(const std::string& path, const std::string& dir) {
  return path.empty() || path[0] == '/' || dir.empty() ? path : dir + "/" + path;
}

bool KnownKeys(const YAML::Node& node, const std::string& where, const std::set<std::string>& keys,
               std::string* error) {
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    if (!keys.count(key)) {
      *error = "unknown setting " + where + key;
      return false;
    }
  }
  return true;
}

}  // namespace

bool ParseSeconds(const std::string& text, double* seconds) {
  std::string number = text;
  double scale = 1;
  if (number.size() > 2 && number.compare(number.size() - 2, 2, "ms") == 0) {
    number.resize(number.size() - 2);
    scale = 1e-3;
  } else if (!number.empty() && number.back() == 's') {
    number.pop_back();
  }
  if (number.empty() || number.find_first_not_of("0123456789.") != std::string::npos) return false;
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(v)) return false;
  *seconds = v * scale;
  return true;
}

bool ApplyClientConfig(const std::string& yaml, const std::string& dir, CommandLine* c, bool url_from_flag,
                       std::string* error) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    *error = std::string("not YAML: ") + e.what();
    return false;
  }
  if (root.IsNull()) return true;
  try {
    if (!root.IsMap()) {
      *error = "expected a mapping of settings";
      return false;
    }
    if (!KnownKeys(root, "", {"url", "tls_config", "basic_auth"}, error)) return false;
    if (root["url"] && !url_from_flag) c->url = root["url"].as<std::string>();
    if (const YAML::Node tls = root["tls_config"]) {
      if (!KnownKeys(tls, "tls_config.", {"ca_file", "cert_file", "key_file", "insecure_skip_verify"}, error))
        return false;
      if (tls["ca_file"] && c->client.ca_file.empty()) c->client.ca_file = Resolve(tls["ca_file"].as<std::string>(), dir);
      if (tls["cert_file"] && c->client.cert_file.empty())
        c->client.cert_file = Resolve(tls["cert_file"].as<std::string>(), dir);
      if (tls["key_file"] && c->client.key_file.empty())
        c->client.key_file = Resolve(tls["key_file"].as<std::string>(), dir);
      if (tls["insecure_skip_verify"] && tls["insecure_skip_verify"].as<bool>()) c->client.insecure_skip_verify = true;
    }
    if (const YAML::Node auth = root["basic_auth"]) {
      if (!KnownKeys(auth, "basic_auth.", {"username", "password", "password_file"}, error)) return false;
      if (auth["password"] && auth["password_file"]) {
        *error = "basic_auth: give password or password_file, not both";
        return false;
      }
      // The flags' user wins, and with it the flags' password file.
      if (c->client.username.empty()) {
        if (!auth["username"]) {
          *error = "basic_auth needs a username";
          return false;
        }
        c->client.username = auth["username"].as<std::string>();
        if (auth["password"]) {
          c->client.password = auth["password"].as<std::string>();
        } else if (auth["password_file"]) {
          if (!ReadPassword(Resolve(auth["password_file"].as<std::string>(), dir), &c->client.password, error))
            return false;
        }
      }
    }
  } catch (const YAML::Exception& e) {
    *error = std::string("a setting of the wrong type: ") + e.what();
    return false;
  }
  return true;
}

namespace {

// What the flags give before it is checked: text the checks turn into CommandLine fields.
struct RawFlags {
  std::string config_file, password_file, timeout = "5s", interval;
  bool show_version = false;
  CLI::App* top = nullptr;
};

void DefineFlags(CLI::App& app, CommandLine& c, RawFlags& raw) {
  app.get_formatter()->column_width(30);
  app.require_subcommand(1);
  app.fallthrough();
  if (const char* env = std::getenv("MERGEWATCH_CONFIG")) raw.config_file = env;
  app.add_option("--url", c.url,
                 "The daemon's endpoint; a path other than / is its --web.telemetry-path (https://host:9863/mw/metrics)")
      ->capture_default_str();
  app.add_option("--config", raw.config_file,
                 "Client config file (YAML: url, tls_config, basic_auth); default $MERGEWATCH_CONFIG");
  app.add_option("--ca-file", c.client.ca_file, "CA certificate(s) that signed the daemon's TLS certificate");
  app.add_option("--cert-file", c.client.cert_file, "Client certificate, when the daemon asks for one");
  app.add_option("--key-file", c.client.key_file, "Key of the client certificate");
  app.add_flag("--insecure", c.client.insecure_skip_verify, "Do not verify the daemon's TLS certificate");
  app.add_option("--user", c.client.username, "Basic auth user (the password comes from --password-file or --config)");
  app.add_option("--password-file", raw.password_file, "File holding the basic auth password");
  app.add_option("--timeout", raw.timeout, "Time allowed for each request")->capture_default_str();
  app.add_flag("--version", raw.show_version, "Print the version and exit");
  CLI::App* status = app.add_subcommand(
      "status", "One look: two scrapes --interval apart. Exit 0 nothing active, 1 a merge collapse active, "
                "3 only queue findings, 2 the daemon unreachable or unusable");
  status->add_flag("--json", c.json, "JSON for scripts, with the raw counters of both scrapes beside the rates");
  status->add_option("--interval", raw.interval, "Time between the two scrapes (default 2s)");
  status->add_flag("--all", c.all, "Every block device, not only the stacks with I/O or findings");
  raw.top = app.add_subcommand("top", "Live view, refreshed every --interval; q quits");
  raw.top->add_option("--interval", raw.interval, "Time between refreshes (default 1s)");
  raw.top->add_flag("--all", c.all, "Every block device, not only the ones with I/O or findings");
}

// The password and the client config file; "" or what is wrong.
std::string ApplyCredentials(const RawFlags& raw, bool url_from_flag, CommandLine& c) {
  std::string error;
  if (!raw.password_file.empty() && c.client.username.empty()) return "--password-file needs --user";
  if (!raw.password_file.empty()) {
    if (!ReadPassword(raw.password_file, &c.client.password, &error)) return "--password-file: " + error;
  } else if (!c.client.username.empty() && raw.config_file.empty()) {
    return "--user needs --password-file (a password is never taken on the command line)";
  } else if (!raw.config_file.empty()) {
    std::string text;
    const size_t slash = raw.config_file.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : raw.config_file.substr(0, slash);
    if (!ReadConfigFile(raw.config_file, &text, &error) || !ApplyClientConfig(text, dir, &c, url_from_flag, &error))
      return "--config " + raw.config_file + ": " + error;
  }
  return "";
}

// The durations, the endpoint and what goes together; "" or what is wrong.
std::string CheckSettings(const RawFlags& raw, CommandLine& c) {
  double timeout_seconds = 0;
  if (!ParseSeconds(raw.timeout, &timeout_seconds) || timeout_seconds <= 0 || timeout_seconds > 3600)
    return "--timeout must be a duration like 5s or 500ms, got \"" + raw.timeout + "\"";
  c.client.timeout_ms = static_cast<long>(timeout_seconds * 1000);
  c.interval_seconds = c.command == Command::kTop ? 1 : 2;
  if (!raw.interval.empty() &&
      (!ParseSeconds(raw.interval, &c.interval_seconds) || c.interval_seconds < 0.1 || c.interval_seconds > 3600))
    return "--interval must be a duration from 100ms to 1h like 2s or 500ms, got \"" + raw.interval + "\"";
  if (!c.client.username.empty() && c.client.password.empty())
    return "basic auth user " + c.client.username + " has no password (--password-file, or basic_auth in --config)";
  if (c.client.cert_file.empty() != c.client.key_file.empty()) return "--cert-file and --key-file go together";
  std::string error;
  if (!ParseEndpoint(c.url, &c.endpoint, &error)) return error;
  if (c.json && c.command == Command::kTop) return "--json is for status";
  return "";
}

}  // namespace

ParsedCommandLine ParseCommandLine(int argc, const char* const* argv) {
  ParsedCommandLine result;
  CommandLine& c = result.command_line;
  CLI::App app{"mergewatch: what mergewatchd sees on this host, for the person on call: the block device\n"
               "stack with request rates, sizes, merges and latency, and every merge collapse or queue\n"
               "finding with its evidence, cause and remedy. Needs only the running daemon.",
               "mergewatch"};
  RawFlags raw;
  DefineFlags(app, c, raw);
  try {
    const FlagArgs args(argc, argv);
    app.parse(args.argc(), args.argv());
  } catch (const CLI::CallForHelp&) {
    result.output = app.help();
    return result;
  } catch (const CLI::CallForAllHelp&) {
    result.output = app.help("", CLI::AppFormatMode::All);
    return result;
  } catch (const CLI::ParseError& e) {
    if (raw.show_version) {
      result.output = std::string("mergewatch ") + MERGEWATCH_VERSION + "\n";
      return result;
    }
    result.exit_code = kExitUsage;
    result.output = std::string("mergewatch: ") + e.what() + "\nRun 'mergewatch --help' for the commands and flags.\n";
    return result;
  }
  c.command = raw.top->parsed() ? Command::kTop : Command::kStatus;
  std::string error = ApplyCredentials(raw, app.count("--url") > 0, c);
  if (error.empty()) error = CheckSettings(raw, c);
  if (!error.empty()) {
    result.exit_code = kExitUsage;
    result.output = "mergewatch: " + error + "\n";
    return result;
  }
  result.run = true;
  return result;
}

}  // namespace mergewatch::cli
