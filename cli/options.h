// SPDX-License-Identifier: Apache-2.0
// The command line of `mergewatch` and its client config file (YAML, the keys of a Prometheus
// scrape config: tls_config and basic_auth). A password is read from a file or the config
// file, never taken from the command line, where every user of the host can read it (ps).
#pragma once

#include <string>

#include "http_client.h"

namespace mergewatch::cli {

enum class Command { kStatus, kTop };

struct CommandLine {
  Command command = Command::kStatus;
  std::string url = "http://localhost:9863";
  Endpoint endpoint;
  ClientOptions client;
  bool json = false;
  bool all = false;
  double interval_seconds = 0;  // between the two scrapes (status), between refreshes (top)
};

// Exit 2 for a usage error, like every other failure to say anything about the host.
struct ParsedCommandLine {
  bool run = false;
  int exit_code = 0;
  std::string output;  // help to stdout (exit 0), an error to stderr
  CommandLine command_line;
};

ParsedCommandLine ParseCommandLine(int argc, const char* const* argv);

// Applies a config file's text (relative paths from `dir`) to what the flags did not set.
bool ApplyClientConfig(const std::string& yaml, const std::string& dir, CommandLine* command_line,
                       bool url_from_flag, std::string* error);

// "2s", "500ms", "1.5" (seconds) -> seconds; false on anything else.
bool ParseSeconds(const std::string& text, double* seconds);

}  // namespace mergewatch::cli
