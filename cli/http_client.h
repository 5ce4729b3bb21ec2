// SPDX-License-Identifier: Apache-2.0
// GETs from the daemon's endpoint with libcurl: plain HTTP or TLS (CA, client certificate) and
// basic auth, the exporter-toolkit web config's client side.
#pragma once

#include <string>

namespace mergewatch::cli {

struct Endpoint {
  std::string base;  // scheme://host[:port], no path
  std::string telemetry_path = "/metrics";
  std::string status_path = "/status";
};

// "http://localhost:9863" or "https://h:9863/mw/metrics": the path, when given and not "/",
// is the telemetry path; /status is beside it (daemon/http/status_path.h). Only http and https.
bool ParseEndpoint(const std::string& url, Endpoint* endpoint, std::string* error);

struct ClientOptions {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  bool insecure_skip_verify = false;
  std::string username;
  std::string password;
  long timeout_ms = 5000;
};

struct Response {
  long status = 0;  // 0: no answer at all
  std::string body;
  std::string error;  // why there is no answer
};

// One GET. Bodies above 64 MiB are refused (a scrape of thousands of devices is a few MiB).
Response Get(const std::string& url, const ClientOptions& options);

}  // namespace mergewatch::cli
