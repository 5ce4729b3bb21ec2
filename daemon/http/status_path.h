// SPDX-License-Identifier: Apache-2.0
// Where /status is served, from the telemetry path: beside it, in the same folder ("/metrics" ->
// "/status", "/mw/metrics" -> "/mw/status"). A telemetry path that is that very name keeps it
// and the status moves to "<path>.json" ("/status" -> "/status.json"). Header-only: the daemon
// serves this path and the `mergewatch` command (cli/) asks for it, from the same function.
#pragma once

#include <string>

namespace mergewatch {

inline std::string StatusPathFor(const std::string& telemetry_path) {
  const size_t slash = telemetry_path.rfind('/');
  const std::string beside =
      (slash == std::string::npos ? std::string("/") : telemetry_path.substr(0, slash + 1)) + "status";
  return beside == telemetry_path ? telemetry_path + ".json" : beside;
}

}  // namespace mergewatch
