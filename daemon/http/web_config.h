// SPDX-License-Identifier: Apache-2.0
// --web.config.file: TLS and basic authentication for the HTTP endpoint, in the format of the
// Prometheus exporter-toolkit (https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md),
// so fleets can use the file they already have and `promtool check web-config` checks it.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <unordered_set>

namespace mergewatch {

enum class ClientAuth { kNone, kVerifyIfGiven, kRequireAndVerify };

struct WebConfig {
  // Paths as written, resolved against the config file's directory (as exporter-toolkit does).
  std::string cert_file, key_file, client_ca_file;
  ClientAuth client_auth = ClientAuth::kNone;
  std::map<std::string, std::string> users;  // name -> bcrypt hash ($2a$, $2b$, $2y$)
  bool tls() const { return !cert_file.empty(); }
};

// Parses the YAML text. Unknown keys are errors (a typo must not silently turn TLS off), and so
// are the exporter-toolkit settings mergewatchd does not implement (cipher_suites, min_version,
// RequestClientCert, ...): each is named in the error. `base_dir` resolves relative paths.
bool ParseWebConfig(const std::string& yaml, const std::string& base_dir, WebConfig* config, std::string* error);

// The file's certificates and key, read once at start.
struct WebSecrets {
  std::string cert_pem, key_pem, client_ca_pem;
};

// Reads and parses the file, then the PEM files it names.
bool LoadWebConfig(const std::string& path, WebConfig* config, WebSecrets* secrets, std::string* error);

// Checks user and password against the bcrypt hashes. bcrypt costs ~50-300 ms per check by
// design, and Prometheus sends the same credentials every scrape: a successful check is
// remembered (keyed by a SHA-256 of user, password and hash, never the password itself),
// as exporter-toolkit does. Unknown users cost a bcrypt run too, so timing does not say
// which names exist. Thread-safe.
class BasicAuth {
 public:
  explicit BasicAuth(std::map<std::string, std::string> users) : users_(std::move(users)) {}
  bool enabled() const { return !users_.empty(); }
  bool Check(const std::string& user, const std::string& password);

 private:
  const std::map<std::string, std::string> users_;
  std::mutex mutex_;
  std::unordered_set<std::string> verified_;
};

// crypt(3) from libxcrypt on a bcrypt hash; constant-time comparison of the result.
bool VerifyBcrypt(const std::string& password, const std::string& hash);

}  // namespace mergewatch
