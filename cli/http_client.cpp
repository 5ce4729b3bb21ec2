// SPDX-License-Identifier: Apache-2.0
#include "http_client.h"

#include <curl/curl.h>

#include <mutex>

#include "http/status_path.h"

namespace mergewatch::cli {
namespace {

constexpr size_t kMaxBody = 64u << 20;

size_t Append(char* data, size_t size, size_t count, void* user) {
  auto* body = static_cast<std::string*>(user);
  const size_t n = size * count;
  if (body->size() + n > kMaxBody) return 0;  // curl fails the transfer: CURLE_WRITE_ERROR
  body->append(data, n);
  return n;
}

}  // namespace

bool ParseEndpoint(const std::string& url, Endpoint* endpoint, std::string* error) {
  const size_t scheme_end = url.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    *error = "--url must start with http:// or https://, got \"" + url + "\"";
    return false;
  }
  const size_t path_start = url.find('/', scheme_end + 3);
  endpoint->base = url.substr(0, path_start);
  if (endpoint->base.size() <= scheme_end + 3) {
    *error = "--url has no host: \"" + url + "\"";
    return false;
  }
  if (url.find_first_of("?#", scheme_end + 3) != std::string::npos) {
    *error = "--url must not hold a query or fragment: \"" + url + "\"";
    return false;
  }
  const std::string path = path_start == std::string::npos ? "" : url.substr(path_start);
  endpoint->telemetry_path = path.empty() || path == "/" ? "/metrics" : path;
  endpoint->status_path = StatusPathFor(endpoint->telemetry_path);
  return true;
}

Response Get(const std::string& url, const ClientOptions& options) {
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  Response response;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) {
    response.error = "libcurl could not start";
    return response;
  }
  char error[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, options.timeout_ms);
  curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "");  // gzip when the daemon offers it
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "mergewatch");
  if (!options.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options.ca_file.c_str());
  if (!options.cert_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLCERT, options.cert_file.c_str());
  if (!options.key_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, options.key_file.c_str());
  if (options.insecure_skip_verify) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!options.username.empty()) {
    curl_easy_setopt(curl, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(curl, CURLOPT_USERNAME, options.username.c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, options.password.c_str());
  }
  const CURLcode rc = curl_easy_perform(curl);
  if (rc == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  } else {
    response.error = error[0] != '\0' ? error : curl_easy_strerror(rc);
    if (rc == CURLE_WRITE_ERROR && response.body.size() + CURL_MAX_WRITE_SIZE > kMaxBody)
      response.error = "the answer is larger than 64 MiB";
    response.body.clear();
  }
  curl_easy_cleanup(curl);
  return response;
}

}  // namespace mergewatch::cli
