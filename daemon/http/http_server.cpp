// SPDX-License-Identifier: Apache-2.0
#include "http/http_server.h"

#include <gnutls/gnutls.h>
#include <linux/sockios.h>
#include <malloc.h>
#include <microhttpd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <ctime>

#include "http/listen.h"
#include "http/status_path.h"
#include "log.h"

namespace mergewatch {

bool Gzip(const std::string& data, std::string* out) {
  z_stream stream{};
  // windowBits 15 + 16: a gzip header and trailer rather than zlib's. Level 1: on a scrape of 32
  // devices (270 KB) it costs a third of the default level's CPU (0.45 against 1.4 ms) for a body
  // 14% larger (27 against 24 KB), and the CPU is what every scrape pays (BENCHMARKS.md, "Scrape cost").
  if (deflateInit2(&stream, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return false;
  out->resize(deflateBound(&stream, data.size()) + 32);
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  stream.avail_in = static_cast<uInt>(data.size());
  stream.next_out = reinterpret_cast<Bytef*>(out->data());
  stream.avail_out = static_cast<uInt>(out->size());
  const int rc = deflate(&stream, Z_FINISH);
  out->resize(stream.total_out);
  deflateEnd(&stream);
  return rc == Z_STREAM_END;
}

bool AcceptsGzip(const std::string& accept_encoding) {
  size_t start = 0;
  while (start <= accept_encoding.size()) {
    size_t end = accept_encoding.find(',', start);
    if (end == std::string::npos) end = accept_encoding.size();
    std::string token = accept_encoding.substr(start, end - start);
    std::string params;
    if (const size_t semi = token.find(';'); semi != std::string::npos) {
      params = token.substr(semi + 1);
      token.resize(semi);
    }
    auto strip = [](std::string s) {
      std::string r;
      for (char c : s)
        if (c != ' ' && c != '\t') r += static_cast<char>(tolower(static_cast<unsigned char>(c)));
      return r;
    };
    token = strip(token);
    params = strip(params);
    if (token == "gzip" || token == "*") {
      // q=0, q=0.0, q=0.000 mean "not acceptable".
      const bool refused = params.rfind("q=0", 0) == 0 && params.find_first_not_of("0.", 3) == std::string::npos;
      if (!refused) return true;
    }
    start = end + 1;
  }
  return false;
}

namespace {

std::chrono::steady_clock::duration ThreadCpuTime() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec);
}

MHD_Response* TextResponse(const std::string& body, const char* content_type) {
  MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response != nullptr) MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  return response;
}

// The response owns the string: a scrape's body is handed over, not copied.
MHD_Response* TakeResponse(std::string body, const char* content_type) {
  auto* owned = new std::string(std::move(body));
  MHD_Response* response = MHD_create_response_from_buffer_with_free_callback_cls(
      owned->size(), owned->data(), [](void* cls) { delete static_cast<std::string*>(cls); }, owned);
  if (response == nullptr) {
    delete owned;
    return nullptr;
  }
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  return response;
}

void AddConfiguredHeaders(MHD_Connection* connection, MHD_Response* response);

MHD_Result Send(MHD_Connection* connection, unsigned status, const std::string& body,
                const char* content_type = "text/plain; charset=utf-8") {
  MHD_Response* response = TextResponse(body, content_type);
  if (response == nullptr) return MHD_NO;
  AddConfiguredHeaders(connection, response);
  const MHD_Result result = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return result;
}

// libmicrohttpd's messages (failed TLS handshakes, refused connections) are the client's
// problem, not the daemon's: debug level, so a scanner cannot flood the journal.
void LogMhd(void*, const char* format, va_list args) {
  if (!LogEnabled(LogLevel::kDebug)) return;
  char line[512];
  vsnprintf(line, sizeof(line), format, args);
  std::string message(line);
  while (!message.empty() && message.back() == '\n') message.pop_back();
  LogDebug("http: " + message);
}

HttpServer::Conn* ConnOf(MHD_Connection* connection) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info == nullptr ? nullptr : static_cast<HttpServer::Conn*>(info->socket_context);
}

// The client certificate check for client_auth_type; GnuTLS verifies against client_ca_file
// (handed to libmicrohttpd as its trust list). An empty string means allowed.
std::string ClientCertProblem(MHD_Connection* connection, ClientAuth policy) {
  if (policy == ClientAuth::kNone) return "";
  const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  if (info == nullptr) return "no TLS session";
  auto session = static_cast<gnutls_session_t>(info->tls_session);
  unsigned count = 0;
  if (gnutls_certificate_get_peers(session, &count) == nullptr || count == 0)
    return policy == ClientAuth::kRequireAndVerify || policy == ClientAuth::kRequireAny ? "no client certificate"
                                                                                        : "";
  // RequestClientCert and RequireAnyClientCert take any certificate, as in Go.
  if (policy == ClientAuth::kRequest || policy == ClientAuth::kRequireAny) return "";
  unsigned status = 0;
  if (gnutls_certificate_verify_peers2(session, &status) != GNUTLS_E_SUCCESS || status != 0)
    return "client certificate not signed by client_ca_file";
  return "";
}

// http_server_config.headers, on every response of the connection.
void AddConfiguredHeaders(MHD_Connection* connection, MHD_Response* response) {
  const HttpServer::Conn* conn = ConnOf(connection);
  if (conn == nullptr || !conn->web) return;
  for (const auto& [name, value] : conn->web->web.headers)
    MHD_add_response_header(response, name.c_str(), value.c_str());
}

// A stamp of each file's identity and contents' age: a replaced (renamed over) or rewritten file
// changes it. Missing files stamp as such, so their return is seen too.
std::string FileStamp(const std::vector<std::string>& paths) {
  std::string stamp;
  for (const std::string& path : paths) {
    if (path.empty()) continue;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
      stamp += path + ":missing;";
      continue;
    }
    stamp += path + ":" + std::to_string(st.st_dev) + "/" + std::to_string(st.st_ino) + "/" +
             std::to_string(st.st_size) + "/" + std::to_string(st.st_mtim.tv_sec) + "." +
             std::to_string(st.st_mtim.tv_nsec) + "/" + std::to_string(st.st_ctim.tv_nsec) + ";";
  }
  return stamp;
}

std::vector<std::string> WebFiles(const std::string& config_file, const WebConfig& web) {
  return {config_file, web.cert_file, web.key_file, web.client_ca_file};
}

std::shared_ptr<const WebState> MakeWebState(const WebConfig& web, const WebSecrets& secrets, std::string* error) {
  auto state = std::make_shared<WebState>();
  state->web = web;
  state->auth = std::make_shared<BasicAuth>(web.users);
  if (web.tls()) {
    state->tls = TlsContext::Create(web, secrets, error);
    if (!state->tls) return nullptr;
  }
  return state;
}

}  // namespace

struct HttpCallbacks {
  // Before any connection state exists: the caps refuse here, and libmicrohttpd closes the
  // socket at once. At the total cap, room is made if a connection waits for a request. Under
  // conns_mutex_: the slots and the connections waiting (MakeRoom) change together.
  static MHD_Result AcceptPolicy(void* cls, const sockaddr* address, socklen_t) {
    auto* server = static_cast<HttpServer*>(cls);
    const std::string key = ClientKey(address);
    std::lock_guard<std::mutex> lock(server->conns_mutex_);
    switch (server->caps_.Check(key)) {
      case ConnectionCaps::Verdict::kAdmit: return MHD_YES;
      case ConnectionCaps::Verdict::kPerAddress: ++server->counts_->refused_per_address; return MHD_NO;
      case ConnectionCaps::Verdict::kTotal:
        if (server->MakeRoom()) return MHD_YES;
        ++server->counts_->refused_total;
        return MHD_NO;
    }
    return MHD_NO;
  }
  // The request target as the client sent it, before %-decoding (which cuts at a NUL).
  static void* UriLog(void*, const char* uri, MHD_Connection* connection) {
    HttpServer::Conn* conn = ConnOf(connection);
    if (conn == nullptr) return nullptr;
    // libmicrohttpd 0.9.75 hands the target over as a C string, in its buffer of the request
    // line, the space before the version overwritten with the terminating NUL: so the version
    // follows right after it, unless the client's target held a NUL of its own that cut the
    // string short (then the rest of the target follows). The line always goes on past that
    // NUL (at least its end of line), and strncmp stops at the first byte that differs.
    const size_t length = strlen(uri);
    if (strncmp(uri + length + 1, "HTTP/", 5) != 0) {
      conn->target_problem = "a NUL byte in the request target";
    } else {
      conn->target_problem = TargetProblem(uri);
    }
    return nullptr;
  }
  static MHD_Result Access(void* cls, MHD_Connection* connection, const char* url, const char* method,
                           const char* version, const char*, size_t* upload_size, void** request_state) {
    auto* server = static_cast<HttpServer*>(cls);
    if (*request_state == nullptr) {  // headers complete
      *request_state = server;
      return MHD_YES;
    }
    // A body nobody asked for: dropped, and the deadline still runs (a body trickled in a byte at a
    // time must not hold the connection), so only the answer below is exempt from it.
    if (*upload_size != 0) {
      *upload_size = 0;
      return MHD_YES;
    }
    if (HttpServer::Conn* conn = ConnOf(connection)) {
      std::lock_guard<std::mutex> lock(server->conns_mutex_);
      conn->in_request = true;
      server->waiting_.Leave(conn);
      if (conn->evicting) server->Reprieve(conn);
    }
    return static_cast<MHD_Result>(server->Handle(connection, url, method, version));
  }
  static void Completed(void* cls, MHD_Connection* connection, void**, MHD_RequestTerminationCode code) {
    auto* server = static_cast<HttpServer*>(cls);
    // libmicrohttpd's inactivity timeout (response_stall_timeout). A request still being read is
    // cut by our request deadline first, so this is a response its client stopped reading.
    if (code == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) ++server->counts_->timed_out_response;
    if (HttpServer::Conn* conn = ConnOf(connection)) {
      std::lock_guard<std::mutex> lock(server->conns_mutex_);
      conn->in_request = false;
      conn->answered = true;
      conn->waiting_since = std::chrono::steady_clock::now();
      if (!conn->cut && !conn->evicting && conn->fd >= 0) server->waiting_.Wait(conn);
    }
  }
  static void Connection(void* cls, MHD_Connection* connection, void** socket_context,
                         MHD_ConnectionNotificationCode code) {
    auto* server = static_cast<HttpServer*>(cls);
    std::lock_guard<std::mutex> lock(server->conns_mutex_);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      auto* conn = new HttpServer::Conn;
      const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
      conn->fd = info != nullptr ? info->connect_fd : -1;
      const MHD_ConnectionInfo* loop = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_DAEMON);
      for (size_t i = 0; loop != nullptr && i < server->daemons_.size(); ++i)
        if (server->daemons_[i] == loop->daemon) conn->loop = i;
      conn->waiting_since = std::chrono::steady_clock::now();
      const MHD_ConnectionInfo* peer = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
      conn->client = ClientKey(peer != nullptr ? peer->client_addr : nullptr);
      server->caps_.Add(conn->client);
      conn->holds_slot = true;
      ++server->counts_->open_connections;
      conn->web = server->web();
      // The TLS session exists and its handshake has not begun: it gets the web config's current
      // credentials and priorities (libmicrohttpd's own, from start, are only its fallback).
      const MHD_ConnectionInfo* tls = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
      if (tls != nullptr && tls->tls_session != nullptr && conn->web->tls &&
          !conn->web->tls->Apply(static_cast<gnutls_session_t>(tls->tls_session)) && conn->fd >= 0) {
        LogWarn("http: cannot set up TLS for a connection: closing it");
        server->Cut(conn);
      }
      server->conns_.insert(conn);
      if (!conn->cut && conn->fd >= 0) server->waiting_.Wait(conn);
      server->peak_open_ = std::max(server->peak_open_, server->conns_.size());
      *socket_context = conn;
    } else if (*socket_context != nullptr) {
      // libmicrohttpd closes the socket only after this returns: under conns_mutex_ a deadline
      // cut (CutLateConnections) never shuts down a descriptor number that was closed and reused.
      auto* conn = static_cast<HttpServer::Conn*>(*socket_context);
      if (conn->holds_slot) server->caps_.Remove(conn->client);
      --server->counts_->open_connections;
      server->waiting_.Leave(conn);
      if (conn->evicting) server->NotEvicting(conn);
      server->conns_.erase(conn);
      delete conn;
      *socket_context = nullptr;
    }
  }
};

HttpServer::HttpServer(HttpOptions options, ScrapeHandler scrape)
    : options_(std::move(options)),
      scrape_(std::move(scrape)),
      caps_(options_.limits.connections_per_address, options_.limits.connection_limit),
      counts_(options_.counts ? options_.counts : std::make_shared<HttpDefenceCounts>()) {
  landing_page_ = "<!DOCTYPE html>\n<html><head><title>mergewatch</title></head><body>\n"
                  "<h1>mergewatch</h1>\n<p>Block I/O request sizes, latencies and merges from eBPF.</p>\n"
                  "<p><a href=\"" + options_.telemetry_path + "\">Metrics</a></p>\n</body></html>\n";
}

MHD_Daemon* HttpServer::StartEventLoop(int listen_fd, unsigned flags) {
  const HttpOptions& o = options_;
  // libmicrohttpd's own limit stops it polling the listening socket (connections then wait in
  // the kernel's queue): set above our caps, which refuse first (AcceptPolicy). A loop's count
  // also holds the connections cut or chosen to make room that it has not closed yet: those are
  // closed at its next pass or the one after, and it accepts at most 10 a pass (0.9.75), so it
  // stays far below this while the caps hold; and a loop at its limit leaves the listening
  // socket to the others, which go on draining the kernel's queue.
  const unsigned mhd_limit = o.limits.connection_limit + 64;
  std::vector<MHD_OptionItem> items = {
      {MHD_OPTION_LISTEN_SOCKET, listen_fd, nullptr},
      {MHD_OPTION_CONNECTION_LIMIT, mhd_limit, nullptr},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<intptr_t>(o.limits.connection_memory), nullptr},
      // Inactivity: covers a client that stops reading its response. CutLateConnections covers the rest.
      {MHD_OPTION_CONNECTION_TIMEOUT, static_cast<intptr_t>(o.limits.response_stall_timeout.count()), nullptr},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&HttpCallbacks::Completed), this},
      {MHD_OPTION_NOTIFY_CONNECTION, reinterpret_cast<intptr_t>(&HttpCallbacks::Connection), this},
      {MHD_OPTION_URI_LOG_CALLBACK, reinterpret_cast<intptr_t>(&HttpCallbacks::UriLog), this},
      {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&LogMhd), nullptr},
  };
  if (o.web.tls()) {
    items.push_back({MHD_OPTION_HTTPS_MEM_CERT, 0, const_cast<char*>(o.secrets.cert_pem.c_str())});
    items.push_back({MHD_OPTION_HTTPS_MEM_KEY, 0, const_cast<char*>(o.secrets.key_pem.c_str())});
    // The client CA and the priorities come from the web state per connection (Connection callback).
  }
  items.push_back({MHD_OPTION_END, 0, nullptr});
  errno = 0;
  return MHD_start_daemon(flags, 0, &HttpCallbacks::AcceptPolicy, this, &HttpCallbacks::Access, this,
                          MHD_OPTION_ARRAY, items.data(), MHD_OPTION_END);
}

std::unique_ptr<HttpServer> HttpServer::Start(const std::vector<int>& listen_fds, const HttpOptions& options,
                                              ScrapeHandler scrape, std::string* error) {
  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(scrape)));
  const HttpOptions& o = server->options_;
  server->web_ = MakeWebState(o.web, o.secrets, error);
  if (!server->web_) {
    // The sockets are ours from the call on, as on every other failed start: none is handed back.
    for (int fd : listen_fds) close(fd);
    return nullptr;
  }
  server->web_stamp_ = FileStamp(WebFiles(o.web_config_file, o.web));
  // External epoll mode: the event loops are our threads (Worker), not libmicrohttpd's pool, so
  // each can prove it is alive (WorkersAlive). MHD_USE_ITC: MHD_quiesce_daemon needs it.
  unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME;
  if (o.web.tls()) flags |= MHD_USE_TLS;
  const unsigned threads = std::max(1u, o.limits.threads);
  size_t next_fd = 0;
  bool failed = false;
  for (; next_fd < listen_fds.size() && !failed; ++next_fd) {
    const std::string name = SocketName(listen_fds[next_fd]);  // a failed start may close the socket
    // Several daemons on one listening socket: each accepts from it, as the threads of
    // libmicrohttpd's own pool do.
    for (unsigned t = 0; t < threads && !failed; ++t) {
      MHD_Daemon* daemon = server->StartEventLoop(listen_fds[next_fd], flags);
      if (daemon == nullptr) {
        // errno is libmicrohttpd's last failed call (epoll_create, pthread_create...), when it set one.
        const int cause = errno;
        *error = "cannot start the HTTP server on " + name + (cause != 0 ? std::string(": ") + strerror(cause) : "") +
                 (o.web.tls() ? " (is the certificate or key in the web config malformed, or do they not match?)"
                              : "");
        failed = true;
      } else {
        server->daemons_.push_back(daemon);
      }
    }
    if (!failed) server->fds_.push_back(listen_fds[next_fd]);
  }
  if (failed) {
    // The failed one is libmicrohttpd's to close (it does); the ones after it were never handed over.
    for (size_t i = next_fd; i < listen_fds.size(); ++i) close(listen_fds[i]);
    return nullptr;  // the destructor stops the daemons that did start
  }
  server->evicting_.resize(server->daemons_.size());
  server->heartbeats_.reset(new std::atomic<int64_t>[server->daemons_.size()]);
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  for (size_t i = 0; i < server->daemons_.size(); ++i) server->heartbeats_[i] = now;
  for (size_t i = 0; i < server->daemons_.size(); ++i)
    server->workers_.emplace_back([s = server.get(), i] { s->Worker(i); });
  server->housekeeper_ = std::thread([s = server.get()] { s->HousekeepingLoop(); });
  // Also without users at start when the web config can be reloaded: a reload may add some.
  if (!o.web.users.empty() || !o.web_config_file.empty())
    server->auth_thread_ = std::thread([s = server.get()] { s->AuthLoop(); });
  return server;
}

bool HttpServer::Enqueue(AuthJob job) {
  {
    std::lock_guard<std::mutex> lock(auth_mutex_);
    if (auth_stopping_ || !auth_thread_.joinable()) return false;
    auth_jobs_.push_back(std::move(job));
  }
  auth_wake_.notify_one();
  return true;
}

void HttpServer::AuthLoop() {
  std::unique_lock<std::mutex> lock(auth_mutex_);
  for (;;) {
    auth_wake_.wait(lock, [this] { return auth_stopping_ || !auth_jobs_.empty(); });
    if (auth_jobs_.empty()) return;  // stopping, and every job taken was answered
    AuthJob job = std::move(auth_jobs_.front());
    auth_jobs_.erase(auth_jobs_.begin());
    lock.unlock();
    // The gate's cool-down is the check's CPU time, not its wall time: on a loaded host a check
    // waits for a CPU too, and that wait is no cost of ours (measured: 78 ms of CPU, 280 ms wall).
    const SteadyDuration cpu_before = ThreadCpuTime();
    const bool ok = job.auth->Check(job.user, job.password);
    const auto ended = std::chrono::steady_clock::now();
    auth_gate_.Done(job.conn->client, ok, ended - (ThreadCpuTime() - cpu_before), ended);
    explicit_bzero(job.password.data(), job.password.size());
    if (!ok) ++counts_->auth_wrong;
    // A suspended connection is never closed or timed out by libmicrohttpd, and the deadline
    // skips it (in_request): job.conn is still this connection's. Resuming goes through
    // libmicrohttpd's lock, which orders the write before the event loop's read.
    job.conn->auth = ok ? Conn::Auth::kOk : Conn::Auth::kWrong;
    MHD_resume_connection(job.connection);
    lock.lock();
  }
}

void HttpServer::Worker(size_t index) {
  MHD_Daemon* daemon = daemons_[index];
  auto last_cut = std::chrono::steady_clock::now();
  while (!workers_stop_.load(std::memory_order_relaxed)) {
    // At most 250 ms a pass, events or not: the heartbeat. libmicrohttpd shortens the wait
    // when a connection's timeout comes sooner.
    MHD_run_wait(daemon, 250);
    // Every pass, not with the deadline: a connection chosen to make room holds no slot, only a
    // socket, until it is cut.
    CutEvicted(index);
    const auto now = std::chrono::steady_clock::now();
    heartbeats_[index].store(now.time_since_epoch().count(), std::memory_order_relaxed);
    if (now - last_cut >= std::chrono::milliseconds(500)) {
      CutLateConnections(index);
      last_cut = now;
    }
  }
}

void HttpServer::CutLateConnections(size_t loop) {
  const auto deadline = std::chrono::steady_clock::now() - options_.limits.request_timeout;
  std::lock_guard<std::mutex> lock(conns_mutex_);
  for (Conn* conn : conns_) {
    if (conn->loop != loop || conn->in_request || conn->cut || conn->evicting || conn->fd < 0 ||
        conn->waiting_since > deadline)
      continue;
    // Bytes the client sent that wait unread in the socket: the connection waits on this loop,
    // busy with other scrapes (100 clients on a loaded host, CI), not on its client. A client
    // trickling bytes finds them read by the next pass, and is cut after it.
    int unread = 0;
    if (ioctl(conn->fd, SIOCINQ, &unread) == 0 && unread > 0) continue;
    // A client that has closed its end (answered, then gone) is closed by the loop's next pass:
    // not a timeout.
    char byte;
    if (recv(conn->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0) continue;
    ++counts_->timed_out_request;  // before the cut, as evicted
    Cut(conn);
  }
}

void HttpServer::Cut(Conn* conn) {
  // shutdown, not close: the descriptor stays libmicrohttpd's, its event loop sees the end of
  // the stream and closes the connection itself.
  shutdown(conn->fd, SHUT_RDWR);
  conn->cut = true;
  waiting_.Leave(conn);
  // The slot now, not when the loop closes the socket: a loop closes the connections it cut only
  // after accepting what waits (libmicrohttpd 0.9.75 accepts first), so 900 idle connections cut
  // together and reopened at once were refused by the total cap (127 of them, measured).
  if (conn->holds_slot) caps_.Remove(conn->client);
  conn->holds_slot = false;
}

bool HttpServer::MakeRoom() {
  Conn* chosen = nullptr;
  if (!waiting_.Longest(&chosen)) return false;
  // Not cut here: this is the accepting loop's thread, in the middle of its pass, and the chosen
  // connection may belong to another loop, which may be between reading a request of it and
  // handing that to Access. Its own loop cuts it after its pass (CutEvicted).
  waiting_.Leave(chosen);
  chosen->evicting = true;
  chosen->evicting_since = std::chrono::steady_clock::now();
  if (chosen->holds_slot) caps_.Remove(chosen->client);
  chosen->holds_slot = false;
  evicting_[chosen->loop].push_back(chosen);
  return true;
}

void HttpServer::NotEvicting(Conn* conn) {
  conn->evicting = false;
  std::vector<Conn*>& chosen = evicting_[conn->loop];
  const auto it = std::find(chosen.begin(), chosen.end(), conn);
  if (it != chosen.end()) chosen.erase(it);
}

void HttpServer::Reprieve(Conn* conn) {
  NotEvicting(conn);
  caps_.Add(conn->client);
  conn->holds_slot = true;
}

void HttpServer::CutEvicted(size_t loop) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(conns_mutex_);
  std::vector<Conn*>& chosen = evicting_[loop];
  size_t kept = 0;
  for (Conn* conn : chosen) {
    // Bytes that arrived after this pass looked may complete a request: the next pass reads them
    // (Access then keeps the connection). Not for longer than the request timeout: a client that
    // keeps sending without ever completing a request is not waited for.
    int unread = 0;
    if (!conn->cut && now - conn->evicting_since < options_.limits.request_timeout &&
        ioctl(conn->fd, SIOCINQ, &unread) == 0 && unread > 0) {
      chosen[kept++] = conn;
      continue;
    }
    conn->evicting = false;
    if (conn->cut) continue;
    // Counted before the cut: a client (or test) that sees its connection closed sees it counted.
    ++counts_->evicted;
    Cut(conn);
  }
  chosen.resize(kept);
}

bool HttpServer::WorkersAlive(std::chrono::steady_clock::duration within) {
  const int64_t oldest = (std::chrono::steady_clock::now() - within).time_since_epoch().count();
  for (size_t i = 0; i < workers_.size(); ++i)
    if (heartbeats_[i].load(std::memory_order_relaxed) < oldest) return false;
  return true;
}

// Stop accepting, then give the requests being answered (a scrape rendering or sending) up to
// drain_timeout to finish; connections waiting for a request are not waited for.
void HttpServer::Drain() {
  for (size_t i = 0; i < daemons_.size(); ++i) {
    // Take the listening socket back first: MHD_stop_daemon would shutdown() it, and a socket
    // systemd passed is shared with the .socket unit, which then fails ("Got POLLHUP on a
    // listening socket", measured under systemd 252). Closing our descriptor leaves systemd's.
    // Several daemons share one socket: it is closed once, after all let go of it.
    MHD_quiesce_daemon(daemons_[i]);
  }
  for (int fd : fds_) close(fd);
  fds_.clear();
  if (workers_.empty()) return;
  const auto deadline = std::chrono::steady_clock::now() + options_.limits.drain_timeout;
  // A connection that has just answered may hold the next request of a pipeline, already read and
  // not yet begun (in_request is false between the two): it gets this long to begin it. An idle
  // keep-alive connection answered long ago is not waited for. (Without it, 208 of 300 pipelined
  // scrapes were answered under ASan, 2 runs of 6: the drain ended between two of them. With 200 ms,
  // 248 of 300 in a clean-clone make test beside two VMs and a benchmark: a loaded event loop took
  // longer than that to begin the next one. drain_timeout still bounds the whole wait.)
  constexpr auto kPipelineGrace = std::chrono::milliseconds(1000);
  while (std::chrono::steady_clock::now() < deadline) {
    bool busy = false;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      for (const Conn* conn : conns_)
        busy |= conn->in_request || (conn->answered && !conn->cut && now - conn->waiting_since < kPipelineGrace);
    }
    if (!busy) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  LogWarn("http: requests still being answered after " + std::to_string(options_.limits.drain_timeout.count()) +
          " s of shutdown: cutting them");
}

HttpServer::~HttpServer() {
  Drain();
  // The auth thread answers what it took (resuming those connections) before the event loops
  // stop: no connection is left suspended for MHD_stop_daemon.
  {
    std::lock_guard<std::mutex> lock(auth_mutex_);
    auth_stopping_ = true;
  }
  auth_wake_.notify_all();
  if (auth_thread_.joinable()) auth_thread_.join();
  workers_stop_ = true;
  for (std::thread& worker : workers_) worker.join();
  {
    std::lock_guard<std::mutex> lock(housekeeping_mutex_);
    stopping_ = true;
  }
  housekeeping_wake_.notify_all();
  if (housekeeper_.joinable()) housekeeper_.join();
  // Closes every connection; no handler runs after it returns (no worker calls in any more).
  for (MHD_Daemon* daemon : daemons_) MHD_stop_daemon(daemon);
}

void HttpServer::HousekeepingLoop() {
  size_t high_water = 0;
  std::unique_lock<std::mutex> wait_lock(housekeeping_mutex_);
  while (!housekeeping_wake_.wait_for(wait_lock, std::chrono::milliseconds(500), [this] { return stopping_; })) {
    if (!options_.web_config_file.empty()) ReloadWebConfigIfChanged();
    size_t open = 0, peak = 0;
    {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      open = conns_.size();
      peak = peak_open_;  // a flood may come and go between two passes of this loop
      peak_open_ = open;
    }
    // After a flood of connections, the heap keeps what their buffers took (glibc returns only
    // a free top of the heap by itself, and fragmentation leaves little free there): hand the
    // free pages back once most of them closed (measured: RSS 8.8 -> 40.5 MB after three floods).
    high_water = std::max(high_water, peak);
    if (high_water >= 64 && open <= high_water / 4) {
      malloc_trim(0);
      high_water = open;
    }
  }
}

std::shared_ptr<const WebState> HttpServer::web() const {
  std::lock_guard<std::mutex> lock(web_mutex_);
  return web_;
}

void HttpServer::ReloadWebConfigIfChanged() {
  const std::shared_ptr<const WebState> current = web();
  const std::string& path = options_.web_config_file;
  std::string stamp = FileStamp(WebFiles(path, current->web));
  if (stamp == web_stamp_) return;
  web_stamp_ = stamp;  // a failed load is reported once, not every 500 ms
  WebConfig web;
  WebSecrets secrets;
  std::string error;
  std::shared_ptr<const WebState> loaded;
  if (LoadWebConfig(path, &web, &secrets, &error)) {
    if (web.tls() != current->web.tls())
      error = path + ": switching between TLS and plain HTTP needs a restart";
    else
      loaded = MakeWebState(web, secrets, &error);
  }
  if (!loaded) {
    LogError("web config: " + error + "; keeping the last good one");
    return;
  }
  // The new file may name other files: stamp those, so their next change is seen.
  web_stamp_ = FileStamp(WebFiles(path, web));
  {
    std::lock_guard<std::mutex> lock(web_mutex_);
    web_ = loaded;
  }
  LogInfo("web config reloaded from " + path + (web.tls() ? " (certificate " + web.cert_file + ")" : "") + ", " +
          std::to_string(web.users.size()) + " basic auth users");
  if (!web.tls() && web.users.empty())
    LogWarn("web config " + path +
            " now enables neither TLS (tls_server_config) nor basic auth (basic_auth_users): serving plain HTTP "
            "without authentication");
}

int HttpServer::Handle(MHD_Connection* connection, const char* url, const char* method, const char* version) {
  HttpServer::Conn* conn = ConnOf(connection);
  const std::shared_ptr<const WebState> state = conn != nullptr && conn->web ? conn->web : web();
  // Strictness first (RFC 9112): what a proxy in front would judge differently must not reach
  // the path rules.
  const std::string bad = RequestProblem(connection, conn, version);
  if (!bad.empty()) {
    ++counts_->bad_requests;
    LogDebug("http: 400: " + bad);
    return Send(connection, MHD_HTTP_BAD_REQUEST, "400 Bad Request: " + bad + "\n");
  }
  if (state->web.tls()) {
    const std::string problem = ClientCertProblem(connection, state->web.client_auth);
    if (!problem.empty()) {
      LogDebug(std::string("http: refused: ") + problem);
      return Send(connection, MHD_HTTP_FORBIDDEN, "403 Forbidden: " + problem + "\n");
    }
  }
  if (state->auth->enabled()) {
    int answered = MHD_YES;
    if (!Authorized(connection, conn, *state, &answered)) return answered;
  }
  return Route(connection, url, method);
}

std::string HttpServer::RequestProblem(MHD_Connection* connection, const Conn* conn, const char* version) const {
  if (conn != nullptr && !conn->target_problem.empty()) return conn->target_problem;
  const char* host = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
  if (host == nullptr && version != nullptr && strcmp(version, MHD_HTTP_VERSION_1_0) != 0)
    return "HTTP/1.1 requires a Host header";
  if (!options_.allowed_hosts.empty() && !HostAllowed(host != nullptr ? host : "", options_.allowed_hosts))
    return "Host is not one of --web.allowed-hosts";
  return "";
}

bool HttpServer::Authorized(MHD_Connection* connection, Conn* conn, const WebState& state, int* answered) {
  bool ok = false;
  AuthGate::Verdict verdict = AuthGate::Verdict::kRun;
  SteadyDuration retry_after{};
  if (conn != nullptr && conn->auth != Conn::Auth::kNone) {
    // Resumed: the auth thread has checked this request's credentials.
    ok = conn->auth == Conn::Auth::kOk;
    conn->auth = Conn::Auth::kNone;
  } else {
    char* password = nullptr;
    char* user = MHD_basic_auth_get_username_password(connection, &password);
    bool suspended = false;
    if (user == nullptr || password == nullptr) {
      ++counts_->auth_missing;
    } else if (state.auth->Remembered(user, password)) {
      ok = true;  // the scrapes of a Prometheus that logged in once: never behind the gate
    } else {
      const std::string client = conn != nullptr ? conn->client : "other";
      verdict = auth_gate_.Admit(client, std::chrono::steady_clock::now(), &retry_after);
      if (verdict == AuthGate::Verdict::kRun && conn != nullptr) {
        conn->auth = Conn::Auth::kPending;
        MHD_suspend_connection(connection);  // before the job exists: its resume cannot come first
        suspended = Enqueue(AuthJob{connection, conn, state.auth, user, password});
        if (!suspended) {  // shutting down: no thread to hand it to
          conn->auth = Conn::Auth::kNone;
          MHD_resume_connection(connection);
        }
      }
      if (verdict == AuthGate::Verdict::kRun && !suspended) {
        const auto started = std::chrono::steady_clock::now();
        ok = state.auth->Check(user, password);
        auth_gate_.Done(client, ok, started, std::chrono::steady_clock::now());
        if (!ok) ++counts_->auth_wrong;
      } else if (verdict != AuthGate::Verdict::kRun) {
        ++(verdict == AuthGate::Verdict::kThrottled ? counts_->auth_throttled : counts_->auth_busy);
      }
    }
    if (user != nullptr) MHD_free(user);
    if (password != nullptr) {
      explicit_bzero(password, strlen(password));
      MHD_free(password);
    }
    if (suspended) {
      *answered = MHD_YES;  // called again once resumed
      return false;
    }
  }
  if (verdict != AuthGate::Verdict::kRun) {
    *answered = SendTooManyRequests(connection, verdict, retry_after);
    return false;
  }
  if (!ok) {
    MHD_Response* response = TextResponse("401 Unauthorized\n", "text/plain; charset=utf-8");
    if (response == nullptr) {
      *answered = MHD_NO;
      return false;
    }
    AddConfiguredHeaders(connection, response);
    *answered = MHD_queue_basic_auth_fail_response(connection, "mergewatch", response);
    MHD_destroy_response(response);
    return false;
  }
  return true;
}

int HttpServer::SendTooManyRequests(MHD_Connection* connection, AuthGate::Verdict verdict,
                                    SteadyDuration retry_after) {
  // No check was run: 429, and when to come back (RFC 6585), rather than a 401 that would
  // say the password was wrong.
  const auto seconds = std::max<long>(1, std::chrono::ceil<std::chrono::seconds>(retry_after).count());
  MHD_Response* response = TextResponse(
      verdict == AuthGate::Verdict::kThrottled ? "429 Too Many Requests: failed logins from this address\n"
                                               : "429 Too Many Requests: another password check is running\n",
      "text/plain; charset=utf-8");
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, "Retry-After", std::to_string(seconds).c_str());
  AddConfiguredHeaders(connection, response);
  const MHD_Result result = MHD_queue_response(connection, MHD_HTTP_TOO_MANY_REQUESTS, response);
  MHD_destroy_response(response);
  return result;
}

int HttpServer::Route(MHD_Connection* connection, const std::string& path, const char* method) {
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    MHD_Response* response = TextResponse("405 method not allowed\n", "text/plain; charset=utf-8");
    if (response == nullptr) return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    AddConfiguredHeaders(connection, response);
    const MHD_Result result = MHD_queue_response(connection, MHD_HTTP_METHOD_NOT_ALLOWED, response);
    MHD_destroy_response(response);
    return result;
  }
  if (path == "/") return Send(connection, MHD_HTTP_OK, landing_page_, "text/html; charset=utf-8");
  if (options_.status && path == StatusPathFor(options_.telemetry_path))
    return Send(connection, MHD_HTTP_OK, options_.status(), "application/json");
  if (path != options_.telemetry_path) return Send(connection, MHD_HTTP_NOT_FOUND, "404 page not found\n");

  std::string body = scrape_();
  const char* accept = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT_ENCODING);
  std::string compressed;
  const bool gzip = accept != nullptr && AcceptsGzip(accept) && Gzip(body, &compressed);
  MHD_Response* response =
      TakeResponse(gzip ? std::move(compressed) : std::move(body), "text/plain; version=0.0.4; charset=utf-8");
  if (response == nullptr) return MHD_NO;
  if (gzip) MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_ENCODING, "gzip");
  MHD_add_response_header(response, MHD_HTTP_HEADER_VARY, MHD_HTTP_HEADER_ACCEPT_ENCODING);
  AddConfiguredHeaders(connection, response);
  const MHD_Result result = MHD_queue_response(connection, MHD_HTTP_OK, response);
  MHD_destroy_response(response);
  return result;
}

}  // namespace mergewatch
