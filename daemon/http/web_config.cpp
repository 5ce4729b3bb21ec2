// SPDX-License-Identifier: Apache-2.0
#include "http/web_config.h"

#include <crypt.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <set>
#include <sstream>

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

bool ReadFile(const std::string& path, std::string* content, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot read " + path;
    return false;
  }
  std::ostringstream text;
  text << in.rdbuf();
  *content = text.str();
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

bool CheckPem(const WebConfig& config, const WebSecrets& secrets, std::string* error) {
  gnutls_certificate_credentials_t credentials = nullptr;
  if (gnutls_certificate_allocate_credentials(&credentials) != GNUTLS_E_SUCCESS) {
    *error = "GnuTLS: cannot allocate credentials";
    return false;
  }
  std::string problem;
  const gnutls_datum_t cert = Datum(secrets.cert_pem), key = Datum(secrets.key_pem);
  int rc = gnutls_certificate_set_x509_key_mem(credentials, &cert, &key, GNUTLS_X509_FMT_PEM);
  if (rc < 0) {
    problem = config.cert_file + ", " + config.key_file + ": not a matching PEM certificate and key (" +
              gnutls_strerror(rc) + ")";
  } else if (!secrets.client_ca_pem.empty()) {
    const gnutls_datum_t ca = Datum(secrets.client_ca_pem);
    rc = gnutls_certificate_set_x509_trust_mem(credentials, &ca, GNUTLS_X509_FMT_PEM);
    if (rc <= 0) problem = config.client_ca_file + ": no usable PEM certificate in it";
  }
  gnutls_certificate_free_credentials(credentials);
  if (problem.empty()) return true;
  *error = problem;
  return false;
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
      // http2 is a no-op for this HTTP/1.1 server; headers would need a policy of their own.
      if (!CheckKeys(http, "http_server_config.", {"http2"}, {"headers"}, error)) return false;
    }
    if (const YAML::Node tls = root["tls_server_config"]; tls && !tls.IsNull()) {
      if (!tls.IsMap()) {
        *error = "tls_server_config must be a mapping";
        return false;
      }
      if (!CheckKeys(tls, "tls_server_config.", {"cert_file", "key_file", "client_ca_file", "client_auth_type"},
                     {"cert", "key", "client_ca", "cipher_suites", "curve_preferences", "min_version", "max_version",
                      "prefer_server_cipher_suites", "client_allowed_sans"},
                     error))
        return false;
      if (tls["cert_file"]) config->cert_file = Resolve(base_dir, tls["cert_file"].as<std::string>());
      if (tls["key_file"]) config->key_file = Resolve(base_dir, tls["key_file"].as<std::string>());
      if (tls["client_ca_file"]) config->client_ca_file = Resolve(base_dir, tls["client_ca_file"].as<std::string>());
      const std::string auth = tls["client_auth_type"] ? tls["client_auth_type"].as<std::string>() : "";
      if (auth.empty() || auth == "NoClientCert") {
        config->client_auth = ClientAuth::kNone;
      } else if (auth == "VerifyClientCertIfGiven") {
        config->client_auth = ClientAuth::kVerifyIfGiven;
      } else if (auth == "RequireAndVerifyClientCert") {
        config->client_auth = ClientAuth::kRequireAndVerify;
      } else if (auth == "RequestClientCert" || auth == "RequireAnyClientCert") {
        *error = "tls_server_config.client_auth_type " + auth +
                 " (an unverified client certificate) is not supported by mergewatchd; use RequireAndVerifyClientCert";
        return false;
      } else {
        *error = "tls_server_config.client_auth_type: unknown value \"" + auth + "\"";
        return false;
      }
      if (config->cert_file.empty() || config->key_file.empty()) {
        *error = "tls_server_config needs both cert_file and key_file";
        return false;
      }
      if (config->client_auth != ClientAuth::kNone && config->client_ca_file.empty()) {
        *error = "tls_server_config.client_auth_type " + auth + " needs client_ca_file";
        return false;
      }
      if (config->client_auth == ClientAuth::kNone && !config->client_ca_file.empty()) {
        *error = "tls_server_config.client_ca_file is set but client_auth_type is NoClientCert";
        return false;
      }
    }
    if (const YAML::Node users = root["basic_auth_users"]; users && !users.IsNull()) {
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
        config->users[user] = hash;
      }
    }
  } catch (const YAML::Exception& e) {
    *error = std::string("unexpected value: ") + e.what();
    return false;
  }
  return true;
}

bool LoadWebConfig(const std::string& path, WebConfig* config, WebSecrets* secrets, std::string* error) {
  std::string text;
  if (!ReadFile(path, &text, error)) return false;
  const size_t slash = path.rfind('/');
  const std::string base_dir = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  if (!ParseWebConfig(text, base_dir, config, error)) {
    *error = path + ": " + *error;
    return false;
  }
  if (config->tls()) {
    if (!ReadFile(config->cert_file, &secrets->cert_pem, error) ||
        !ReadFile(config->key_file, &secrets->key_pem, error))
      return false;
    if (!config->client_ca_file.empty() && !ReadFile(config->client_ca_file, &secrets->client_ca_pem, error))
      return false;
    // Loaded here once, to say which file is wrong and why before any BPF work; libmicrohttpd
    // loads them again itself and only reports that it failed.
    if (!CheckPem(*config, *secrets, error)) return false;
  }
  return true;
}

bool VerifyBcrypt(const std::string& password, const std::string& hash) {
  crypt_data data{};
  const char* result = crypt_r(password.c_str(), hash.c_str(), &data);
  // libxcrypt returns "*0"/"*1" (or NULL) for a malformed setting: never equal to a hash.
  return result != nullptr && result[0] == '$' && ConstantTimeEqual(result, hash);
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
