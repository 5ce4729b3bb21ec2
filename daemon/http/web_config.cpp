// SPDX-License-Identifier: Apache-2.0
#include "http/web_config.h"

#include <crypt.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <yaml-cpp/yaml.h>

#include <strings.h>

#include <cctype>
#include <set>

#include "config_file.h"

namespace mergewatch {
namespace {

std::string Resolve(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return base_dir + "/" + path;
}

bool CheckKeys(const YAML::Node& node, const std::string& where, const std::set<std::string>& known,
               const std::set<std::string>& unsupported, std::string* error) {
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    if (unsupported.count(key)) {
      *error = where + key + " is not supported by mergewatchd";
      return false;
    }
    if (!known.count(key)) {
      *error = "unknown setting " + where + key;
      return false;
    }
  }
  return true;
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// A valid bcrypt hash of nothing anyone knows, for unknown users (cost 10, like htpasswd -B).
constexpr char kDummyHash[] = "$2b$10$1zX7PKoFQz4PGZNr7ZZy0uzewTCTteSDg8IukNQ.b7uiSVBdCsUk6";

gnutls_datum_t Datum(const std::string& pem) {
  return gnutls_datum_t{reinterpret_cast<unsigned char*>(const_cast<char*>(pem.data())),
                        static_cast<unsigned>(pem.size())};
}

bool ParseTlsVersion(const YAML::Node& node, const std::string& key, TlsVersion* version, std::string* error) {
  if (!node || node.IsNull()) return true;
  static const std::map<std::string, TlsVersion> kNames = {{"TLS10", TlsVersion::kTls10},
                                                           {"TLS11", TlsVersion::kTls11},
                                                           {"TLS12", TlsVersion::kTls12},
                                                           {"TLS13", TlsVersion::kTls13}};
  const auto it = kNames.find(node.as<std::string>());
  if (it == kNames.end()) {
    *error = "tls_server_config." + key + ": unknown TLS version \"" + node.as<std::string>() +
             "\" (TLS10, TLS11, TLS12 or TLS13)";
    return false;
  }
  *version = it->second;
  return true;
}

bool ParseList(const YAML::Node& node, const std::string& key, std::vector<std::string>* out, std::string* error) {
  if (!node || node.IsNull()) return true;
  if (!node.IsSequence()) {
    *error = "tls_server_config." + key + " must be a list";
    return false;
  }
  for (const auto& item : node) out->push_back(item.as<std::string>());
  return true;
}

// exporter-toolkit's list: only these headers, some only with these values (web/handler.go).
bool ParseHeaders(const YAML::Node& node, WebConfig* config, std::string* error) {
  if (!node || node.IsNull()) return true;
  if (!node.IsMap()) {
    *error = "http_server_config.headers must map header names to values";
    return false;
  }
  static const std::map<std::string, std::vector<std::string>> kAllowed = {
      {"Strict-Transport-Security", {}},
      {"X-Content-Type-Options", {"nosniff"}},
      {"X-Frame-Options", {"deny", "sameorigin"}},
      {"X-XSS-Protection", {}},
      {"Content-Security-Policy", {}},
  };
  for (const auto& entry : node) {
    const std::string name = entry.first.as<std::string>();
    const std::string value = entry.second.as<std::string>();
    const auto allowed = kAllowed.find(name);
    if (allowed == kAllowed.end()) {
      *error = "http_server_config.headers: HTTP header \"" + name + "\" can not be configured";
      return false;
    }
    bool value_ok = allowed->second.empty();
    for (const std::string& v : allowed->second) value_ok = value_ok || strcasecmp(v.c_str(), value.c_str()) == 0;
    if (!value_ok || value.find_first_of("\r\n") != std::string::npos) {
      *error = "http_server_config.headers: invalid value for " + name + ": \"" + value + "\"";
      return false;
    }
    config->headers[name] = value;
  }
  return true;
}

// A TLS 1.2-and-lower suite of Go's crypto/tls as GnuTLS's key exchange, cipher and MAC.
struct Suite {
  const char* kx;
  const char* cipher;
  const char* mac;
};

const std::map<std::string, Suite>& GoSuites() {
  static const std::map<std::string, Suite> kSuites = {
      {"TLS_RSA_WITH_AES_128_CBC_SHA", {"RSA", "AES-128-CBC", "SHA1"}},
      {"TLS_RSA_WITH_AES_256_CBC_SHA", {"RSA", "AES-256-CBC", "SHA1"}},
      {"TLS_RSA_WITH_AES_128_CBC_SHA256", {"RSA", "AES-128-CBC", "SHA256"}},
      {"TLS_RSA_WITH_AES_128_GCM_SHA256", {"RSA", "AES-128-GCM", "AEAD"}},
      {"TLS_RSA_WITH_AES_256_GCM_SHA384", {"RSA", "AES-256-GCM", "AEAD"}},
      {"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", {"ECDHE-ECDSA", "AES-128-CBC", "SHA1"}},
      {"TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", {"ECDHE-ECDSA", "AES-256-CBC", "SHA1"}},
      {"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", {"ECDHE-ECDSA", "AES-128-CBC", "SHA256"}},
      {"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", {"ECDHE-ECDSA", "AES-128-GCM", "AEAD"}},
      {"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", {"ECDHE-ECDSA", "AES-256-GCM", "AEAD"}},
      {"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", {"ECDHE-ECDSA", "CHACHA20-POLY1305", "AEAD"}},
      {"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", {"ECDHE-ECDSA", "CHACHA20-POLY1305", "AEAD"}},
      {"TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", {"ECDHE-RSA", "AES-128-CBC", "SHA1"}},
      {"TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", {"ECDHE-RSA", "AES-256-CBC", "SHA1"}},
      {"TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", {"ECDHE-RSA", "AES-128-CBC", "SHA256"}},
      {"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", {"ECDHE-RSA", "AES-128-GCM", "AEAD"}},
      {"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", {"ECDHE-RSA", "AES-256-GCM", "AEAD"}},
      {"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", {"ECDHE-RSA", "CHACHA20-POLY1305", "AEAD"}},
      {"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", {"ECDHE-RSA", "CHACHA20-POLY1305", "AEAD"}},
  };
  return kSuites;
}

std::string Join(const std::vector<std::string>& items, const std::string& prefix) {
  std::string out;
  for (const std::string& item : items) out += ":" + prefix + item;
  return out;
}

void AddUnique(std::vector<std::string>* items, const std::string& item) {
  for (const std::string& existing : *items)
    if (existing == item) return;
  items->push_back(item);
}

}  // namespace

bool TlsPriorities(const WebConfig& config, std::string* priorities, std::string* error) {
  static const char* kVersions[] = {"VERS-TLS1.0", "VERS-TLS1.1", "VERS-TLS1.2", "VERS-TLS1.3"};
  std::string out = "NORMAL:-VERS-ALL";
  // Highest first: GnuTLS offers them in this order.
  for (int v = static_cast<int>(config.max_version); v >= static_cast<int>(config.min_version); --v)
    out += std::string(":+") + kVersions[v];
  if (!config.cipher_suites.empty()) {
    std::vector<std::string> kxs, ciphers, macs;
    std::set<std::string> wanted;
    for (const std::string& name : config.cipher_suites) {
      const auto it = GoSuites().find(name);
      if (it == GoSuites().end()) {
        *error = "tls_server_config.cipher_suites: " + name +
                 " is not supported by mergewatchd (GnuTLS); supported: the ECDHE and RSA suites with AES or "
                 "ChaCha20 of Go's crypto/tls";
        return false;
      }
      AddUnique(&kxs, it->second.kx);
      AddUnique(&ciphers, it->second.cipher);
      AddUnique(&macs, it->second.mac);
      wanted.insert(std::string(it->second.kx) + "/" + it->second.cipher + "/" + it->second.mac);
    }
    // GnuTLS allows every suite made of an allowed key exchange, cipher and MAC: refuse a list that
    // would let in suites it does not name.
    for (const auto& [name, suite] : GoSuites()) {
      const std::string key = std::string(suite.kx) + "/" + suite.cipher + "/" + suite.mac;
      bool in_product = false;
      for (const auto& kx : kxs)
        for (const auto& cipher : ciphers)
          for (const auto& mac : macs) in_product = in_product || key == kx + "/" + cipher + "/" + mac;
      if (in_product && !wanted.count(key)) {
        *error = "tls_server_config.cipher_suites: GnuTLS selects suites by key exchange, cipher and MAC, so this "
                 "list would also allow " + name + "; add it or narrow the list";
        return false;
      }
    }
    out += ":-KX-ALL" + Join(kxs, "+") + ":-CIPHER-ALL" + Join(ciphers, "+") + ":-MAC-ALL" + Join(macs, "+");
  }
  if (!config.curve_preferences.empty()) {
    static const std::map<std::string, std::string> kCurves = {
        {"CurveP256", "GROUP-SECP256R1"}, {"CurveP384", "GROUP-SECP384R1"},
        {"CurveP521", "GROUP-SECP521R1"}, {"X25519", "GROUP-X25519"}};
    std::vector<std::string> groups;
    for (const std::string& name : config.curve_preferences) {
      const auto it = kCurves.find(name);
      if (it == kCurves.end()) {
        *error = "tls_server_config.curve_preferences: unknown curve \"" + name +
                 "\" (CurveP256, CurveP384, CurveP521 or X25519)";
        return false;
      }
      AddUnique(&groups, it->second);
    }
    out += ":-GROUP-ALL" + Join(groups, "+");
  }
  if (config.prefer_server_cipher_suites) out += ":%SERVER_PRECEDENCE";
  const char* where = nullptr;
  gnutls_priority_t parsed = nullptr;
  const int rc = gnutls_priority_init(&parsed, out.c_str(), &where);
  if (rc != GNUTLS_E_SUCCESS) {
    *error = "tls_server_config: GnuTLS refuses the priorities \"" + out + "\" at \"" + (where ? where : "") +
             "\": " + gnutls_strerror(rc);
    return false;
  }
  gnutls_priority_deinit(parsed);
  *priorities = out;
  return true;
}

std::shared_ptr<const TlsContext> TlsContext::Create(const WebConfig& config, const WebSecrets& secrets,
                                                     std::string* error) {
  std::shared_ptr<TlsContext> context(new TlsContext);
  context->client_auth_ = config.client_auth;
  std::string priorities;
  if (!TlsPriorities(config, &priorities, error)) return nullptr;
  if (gnutls_priority_init(&context->priorities_, priorities.c_str(), nullptr) != GNUTLS_E_SUCCESS) {
    context->priorities_ = nullptr;
    *error = "GnuTLS: cannot set the priorities " + priorities;
    return nullptr;
  }
  if (gnutls_certificate_allocate_credentials(&context->credentials_) != GNUTLS_E_SUCCESS) {
    context->credentials_ = nullptr;
    *error = "GnuTLS: cannot allocate credentials";
    return nullptr;
  }
  const gnutls_datum_t cert = Datum(secrets.cert_pem), key = Datum(secrets.key_pem);
  int rc = gnutls_certificate_set_x509_key_mem(context->credentials_, &cert, &key, GNUTLS_X509_FMT_PEM);
  if (rc < 0) {
    *error = config.cert_file + ", " + config.key_file + ": not a matching PEM certificate and key (" +
             gnutls_strerror(rc) + ")";
    return nullptr;
  }
  if (!secrets.client_ca_pem.empty()) {
    const gnutls_datum_t ca = Datum(secrets.client_ca_pem);
    rc = gnutls_certificate_set_x509_trust_mem(context->credentials_, &ca, GNUTLS_X509_FMT_PEM);
    if (rc <= 0) {
      *error = config.client_ca_file + ": no usable PEM certificate in it";
      return nullptr;
    }
  }
  return context;
}

TlsContext::~TlsContext() {
  if (credentials_ != nullptr) gnutls_certificate_free_credentials(credentials_);
  if (priorities_ != nullptr) gnutls_priority_deinit(priorities_);
}

bool TlsContext::Apply(gnutls_session_t session) const {
  if (gnutls_priority_set(session, priorities_) != GNUTLS_E_SUCCESS) return false;
  if (gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, credentials_) != GNUTLS_E_SUCCESS) return false;
  // Asked for, never demanded in the handshake: whether a certificate was needed and whether it is
  // valid is answered per request (403 with the reason), for every client_auth_type alike.
  gnutls_certificate_server_set_request(session,
                                        client_auth_ == ClientAuth::kNone ? GNUTLS_CERT_IGNORE : GNUTLS_CERT_REQUEST);
  return true;
}

std::string BcryptHashProblem(const std::string& hash) {
  // The cost is two decimal digits after "$2?$" (the length and prefix are checked before).
  if (!isdigit(static_cast<unsigned char>(hash[4])) || !isdigit(static_cast<unsigned char>(hash[5])) || hash[6] != '$')
    return "not a bcrypt hash: no two-digit cost after $2?$ (e.g. $2y$10$...)";
  const int cost = (hash[4] - '0') * 10 + (hash[5] - '0');
  if (cost > kMaxBcryptCost)
    return "bcrypt cost " + std::to_string(cost) + " is above the maximum of " + std::to_string(kMaxBcryptCost) +
           ": each check costs 2^" + std::to_string(cost) +
           " rounds (cost 10: about 50 ms), and failed checks (any client can send them) would hold the HTTP threads "
           "(promtool accepts it; mergewatchd does not); rehash with htpasswd -nBC 10";
  // A body libxcrypt cannot read (characters outside bcrypt's base64, a cut-off salt) would
  // start "with basic auth" and then answer 401 to everyone: verify a password once now.
  crypt_data data{};
  const char* result = crypt_r("mergewatch start-up check", hash.c_str(), &data);
  if (result == nullptr || result[0] != '$')
    return "libxcrypt cannot verify this bcrypt hash (a malformed salt or body): make it again with htpasswd -nBC 10";
  return "";
}

namespace {

bool ParseClientAuthType(const std::string& auth, ClientAuth* client_auth, std::string* error) {
  if (auth.empty() || auth == "NoClientCert") {
    *client_auth = ClientAuth::kNone;
  } else if (auth == "RequestClientCert") {
    *client_auth = ClientAuth::kRequest;
  } else if (auth == "RequireAnyClientCert") {
    *client_auth = ClientAuth::kRequireAny;
  } else if (auth == "VerifyClientCertIfGiven") {
    *client_auth = ClientAuth::kVerifyIfGiven;
  } else if (auth == "RequireAndVerifyClientCert") {
    *client_auth = ClientAuth::kRequireAndVerify;
  } else {
    *error = "tls_server_config.client_auth_type: unknown value \"" + auth + "\"";
    return false;
  }
  return true;
}

// tls_server_config: versions, ciphers and curves, the files (relative to the config's folder), client auth.
bool ParseTlsServerConfig(const YAML::Node& tls, const std::string& base_dir, WebConfig* config, std::string* error) {
  if (!tls.IsMap()) {
    *error = "tls_server_config must be a mapping";
    return false;
  }
  if (!CheckKeys(tls, "tls_server_config.",
                 {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version",
                  "cipher_suites", "curve_preferences", "prefer_server_cipher_suites"},
                 {"cert", "key", "client_ca", "client_allowed_sans"}, error))
    return false;
  if (!ParseTlsVersion(tls["min_version"], "min_version", &config->min_version, error) ||
      !ParseTlsVersion(tls["max_version"], "max_version", &config->max_version, error) ||
      !ParseList(tls["cipher_suites"], "cipher_suites", &config->cipher_suites, error) ||
      !ParseList(tls["curve_preferences"], "curve_preferences", &config->curve_preferences, error))
    return false;
  if (config->max_version < config->min_version) {
    *error = "tls_server_config.max_version is below tls_server_config.min_version";
    return false;
  }
  if (tls["prefer_server_cipher_suites"])
    config->prefer_server_cipher_suites = tls["prefer_server_cipher_suites"].as<bool>();
  std::string priorities;
  if (!TlsPriorities(*config, &priorities, error)) return false;
  if (tls["cert_file"]) config->cert_file = Resolve(base_dir, tls["cert_file"].as<std::string>());
  if (tls["key_file"]) config->key_file = Resolve(base_dir, tls["key_file"].as<std::string>());
  if (tls["client_ca_file"]) config->client_ca_file = Resolve(base_dir, tls["client_ca_file"].as<std::string>());
  const std::string auth = tls["client_auth_type"] ? tls["client_auth_type"].as<std::string>() : "";
  if (!ParseClientAuthType(auth, &config->client_auth, error)) return false;
  if (config->cert_file.empty() || config->key_file.empty()) {
    *error = "tls_server_config needs both cert_file and key_file";
    return false;
  }
  // As exporter-toolkit: verifying needs a CA; a CA with nothing to verify is a mistake.
  const bool verifies =
      config->client_auth == ClientAuth::kVerifyIfGiven || config->client_auth == ClientAuth::kRequireAndVerify;
  if (verifies && config->client_ca_file.empty()) {
    *error = "tls_server_config.client_auth_type " + auth + " needs client_ca_file";
    return false;
  }
  if (config->client_auth == ClientAuth::kNone && !config->client_ca_file.empty()) {
    *error = "tls_server_config.client_ca_file is set but client_auth_type is NoClientCert";
    return false;
  }
  return true;
}

// basic_auth_users: user name to a bcrypt hash libxcrypt can verify.
bool ParseBasicAuthUsers(const YAML::Node& users, WebConfig* config, std::string* error) {
  if (!users.IsMap()) {
    *error = "basic_auth_users must map user names to bcrypt hashes";
    return false;
  }
  for (const auto& entry : users) {
    const std::string user = entry.first.as<std::string>();
    const std::string hash = entry.second.as<std::string>();
    if (hash.size() != 60 || hash[0] != '$' || hash[1] != '2' ||
        (hash[2] != 'a' && hash[2] != 'b' && hash[2] != 'y') || hash[3] != '$') {
      *error = "basic_auth_users." + user + " is not a bcrypt hash ($2y$..., e.g. from htpasswd -nBC 10)";
      return false;
    }
    if (user.find(':') != std::string::npos) {
      *error = "basic_auth_users: a user name cannot contain ':' (" + user + ")";
      return false;
    }
    if (const std::string problem = BcryptHashProblem(hash); !problem.empty()) {
      *error = "basic_auth_users." + user + ": " + problem;
      return false;
    }
    config->users[user] = hash;
  }
  return true;
}

}  // namespace

bool ParseWebConfig(const std::string& yaml, const std::string& base_dir, WebConfig* config, std::string* error) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    *error = std::string("not valid YAML: ") + e.what();
    return false;
  }
  if (root.IsNull()) return true;  // an empty file: plain HTTP, no authentication
  if (!root.IsMap()) {
    *error = "the top level must be a mapping";
    return false;
  }
  try {
    if (!CheckKeys(root, "", {"tls_server_config", "basic_auth_users", "http_server_config"}, {}, error)) return false;
    if (const YAML::Node http = root["http_server_config"]; http && !http.IsNull()) {
      // http2 is a no-op for this HTTP/1.1 server.
      if (!CheckKeys(http, "http_server_config.", {"http2", "headers"}, {}, error)) return false;
      if (!ParseHeaders(http["headers"], config, error)) return false;
    }
    if (const YAML::Node tls = root["tls_server_config"]; tls && !tls.IsNull())
      if (!ParseTlsServerConfig(tls, base_dir, config, error)) return false;
    if (const YAML::Node users = root["basic_auth_users"]; users && !users.IsNull())
      if (!ParseBasicAuthUsers(users, config, error)) return false;
  } catch (const YAML::Exception& e) {
    *error = std::string("unexpected value: ") + e.what();
    return false;
  }
  return true;
}

bool LoadWebConfig(const std::string& path, WebConfig* config, WebSecrets* secrets, std::string* error) {
  std::string text;
  if (!ReadConfigFile(path, &text, error)) return false;
  const size_t slash = path.rfind('/');
  const std::string base_dir = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  if (!ParseWebConfig(text, base_dir, config, error)) {
    *error = path + ": " + *error;
    return false;
  }
  if (config->tls()) {
    if (!ReadConfigFile(config->cert_file, &secrets->cert_pem, error) ||
        !ReadConfigFile(config->key_file, &secrets->key_pem, error))
      return false;
    if (!config->client_ca_file.empty() && !ReadConfigFile(config->client_ca_file, &secrets->client_ca_pem, error))
      return false;
    // Loaded here once, to say which file is wrong and why before any BPF work; libmicrohttpd
    // loads them again itself and only reports that it failed.
    if (!TlsContext::Create(*config, *secrets, error)) return false;
  }
  return true;
}

bool VerifyBcrypt(const std::string& password, const std::string& hash) {
  crypt_data data{};
  const char* result = crypt_r(password.c_str(), hash.c_str(), &data);
  // libxcrypt returns "*0"/"*1" (or NULL) for a malformed setting: never equal to a hash.
  return result != nullptr && result[0] == '$' && ConstantTimeEqual(result, hash);
}

bool BasicAuth::Remembered(const std::string& user, const std::string& password) {
  const auto it = users_.find(user);
  if (it == users_.end()) return false;
  const std::string material = user + '\0' + password + '\0' + it->second;
  unsigned char digest[32];
  if (gnutls_hash_fast(GNUTLS_DIG_SHA256, material.data(), material.size(), digest) != 0) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return verified_.count(std::string(reinterpret_cast<const char*>(digest), sizeof(digest))) != 0;
}

bool BasicAuth::Check(const std::string& user, const std::string& password) {
  const auto it = users_.find(user);
  const std::string& hash = it == users_.end() ? kDummyHash : it->second;
  const std::string material = user + '\0' + password + '\0' + hash;
  unsigned char digest[32];
  if (gnutls_hash_fast(GNUTLS_DIG_SHA256, material.data(), material.size(), digest) != 0) return false;
  const std::string key(reinterpret_cast<const char*>(digest), sizeof(digest));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (it != users_.end() && verified_.count(key)) return true;
  }
  const bool ok = VerifyBcrypt(password, hash) && it != users_.end();
  if (ok) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (verified_.size() >= 256) verified_.clear();  // bounded: only names in the file can get here
    verified_.insert(key);
  }
  return ok;
}

}  // namespace mergewatch
