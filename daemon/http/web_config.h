// SPDX-License-Identifier: Apache-2.0
// --web.config.file: TLS and basic authentication for the HTTP endpoint, in the format of the
// Prometheus exporter-toolkit (https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md),
// so fleets can use the file they already have and `promtool check web-config` checks it.
#pragma once

#include <gnutls/gnutls.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace mergewatch {

// exporter-toolkit's client_auth_type values (Go's tls.ClientAuthType).
enum class ClientAuth { kNone, kRequest, kRequireAny, kVerifyIfGiven, kRequireAndVerify };

// TLS protocol versions as exporter-toolkit names them (TLS10 ... TLS13).
enum class TlsVersion { kTls10 = 0, kTls11, kTls12, kTls13 };

struct WebConfig {
  // Paths as written, resolved against the config file's directory (as exporter-toolkit does).
  std::string cert_file, key_file, client_ca_file;
  ClientAuth client_auth = ClientAuth::kNone;
  std::map<std::string, std::string> users;  // name -> bcrypt hash ($2a$, $2b$, $2y$)
  bool tls() const { return !cert_file.empty(); }
  // exporter-toolkit's floor is TLS 1.2: TLS 1.0 and 1.1 only when min_version asks for them.
  TlsVersion min_version = TlsVersion::kTls12, max_version = TlsVersion::kTls13;
  std::vector<std::string> cipher_suites;      // Go names, as written (TLS 1.2 and lower)
  std::vector<std::string> curve_preferences;  // Go names, as written, in order
  bool prefer_server_cipher_suites = true;     // exporter-toolkit's default
  // http_server_config.headers: added to every response (only the names exporter-toolkit allows).
  std::map<std::string, std::string> headers;
};

// The GnuTLS priority string for the TLS settings of `config` ("NORMAL" narrowed by min/max
// version, cipher suites and curves). False with `error` naming the key when GnuTLS cannot
// express the setting (a cipher_suites list that is not a whole product of key exchanges,
// ciphers and MACs: GnuTLS selects by those three, not by suite).
bool TlsPriorities(const WebConfig& config, std::string* priorities, std::string* error);

// Parses the YAML text. Unknown keys are errors (a typo must not silently turn TLS off), and so
// are the exporter-toolkit settings mergewatchd does not implement (client_allowed_sans, inline
// cert/key, ...): each is named in the error. `base_dir` resolves relative paths.
bool ParseWebConfig(const std::string& yaml, const std::string& base_dir, WebConfig* config, std::string* error);

// The file's certificates and key, as read from disk (again whenever they change: HttpServer).
struct WebSecrets {
  std::string cert_pem, key_pem, client_ca_pem;
};

// What a TLS session of one web config needs: GnuTLS credentials (certificate, key, client CA
// list), priorities and the client certificate request. Immutable once made, shared: a session
// holds its context while it lives, so a reload never frees what a handshake in progress uses.
class TlsContext {
 public:
  static std::shared_ptr<const TlsContext> Create(const WebConfig& config, const WebSecrets& secrets,
                                                  std::string* error);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  // Sets credentials, priorities and the certificate request on a server session before its handshake.
  bool Apply(gnutls_session_t session) const;

 private:
  TlsContext() = default;
  gnutls_certificate_credentials_t credentials_ = nullptr;
  gnutls_priority_t priorities_ = nullptr;
  ClientAuth client_auth_ = ClientAuth::kNone;
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
  // Only the cache of successful checks: no bcrypt run (answers the scrapes of a Prometheus
  // that logged in once, whatever else is going on; see AuthGate in defences.h).
  bool Remembered(const std::string& user, const std::string& password);

 private:
  const std::map<std::string, std::string> users_;
  std::mutex mutex_;
  std::unordered_set<std::string> verified_;
};

// The highest bcrypt cost accepted: 12 is about 0.2 s a check here (4x cost 10). Any client
// can make the daemon run a check, so a higher cost turns each wrong password into seconds of
// CPU; exporter-toolkit and promtool accept up to 31 (hours a check).
constexpr int kMaxBcryptCost = 12;

// Why a hash that passed the "$2?$" and length checks cannot be used ("" if it can): its cost
// is above kMaxBcryptCost, or libxcrypt cannot verify a password against it (checked by
// verifying one, once, at start).
std::string BcryptHashProblem(const std::string& hash);

// crypt(3) from libxcrypt on a bcrypt hash; constant-time comparison of the result.
bool VerifyBcrypt(const std::string& password, const std::string& hash);

}  // namespace mergewatch
