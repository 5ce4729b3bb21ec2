// SPDX-License-Identifier: Apache-2.0
// The HTTP endpoint, on GNU libmicrohttpd: a fixed pool of event-loop threads (epoll) serves
// every connection, so idle or byte-at-a-time clients cost a socket and a little memory,
// never a thread (civetweb, used before, holds a thread per connection: 4 idle connections
// starved it). TLS (GnuTLS) and basic auth come from the exporter-toolkit web config.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "http/defences.h"
#include "http/web_config.h"

struct MHD_Daemon;
struct MHD_Connection;

namespace mergewatch {

struct HttpLimits {
  // A connection has this long, from accept or from the end of its previous response, to
  // send a complete request; then it is closed. This is what cuts off clients that trickle
  // bytes (an inactivity timeout alone never fires for them) and idle keep-alive connections.
  // 3 s: well before Prometheus's default scrape timeout (10 s), so connections held open by
  // one client are cut (and their slots freed) long before a scrape waiting for one fails.
  std::chrono::seconds request_timeout{3};
  // A response whose client reads nothing of it for this long is cut (libmicrohttpd's inactivity
  // timeout). Not the request timeout: libmicrohttpd applies it before it reads what arrived, so
  // requests sent in time but left unread while a loaded host held the event loop were closed
  // unanswered (CI: 1 of 100 concurrent scrapers). 10 s: Prometheus's default scrape timeout, a
  // scrape that stalls that long has failed anyway.
  std::chrono::seconds response_stall_timeout{10};
  // Connections open at once, over every listening socket and per client address (IPv4
  // address or IPv6 /64, defences.h). Every connection is accepted at once: the total stays
  // below the listen backlog (SOMAXCONN, 4096), so nothing waits in the kernel's queue where it
  // would delay the scrapes queued behind it (4,100 idle connections made 3 of 10 scrapes time
  // out). One past its address's cap is closed at once. At the total cap, the connection that
  // has waited longest without sending a complete request is closed to make room (a refusal
  // would refuse Prometheus too, for as long as a flood keeps the cap full: 1 and 0 of 10
  // scrapes answered within 1 s under 4,100 reconnecting connections); only when every open
  // connection has sent a complete request is the new one closed at once.
  // 32 per address: Prometheus opens one per target, an HA pair two.
  unsigned connection_limit = 1024;
  unsigned connections_per_address = 32;
  // On SIGTERM: how long scrapes in flight may take to finish before their connections are cut.
  std::chrono::seconds drain_timeout{5};
  // Memory for one connection's request headers and response headers (libmicrohttpd's pool).
  size_t connection_memory = 16 * 1024;
  // Event-loop threads per listening socket.
  unsigned threads = 2;
};

struct HttpOptions {
  std::string telemetry_path = "/metrics";
  // When set: the detector's state as JSON at StatusPathFor(telemetry_path) (status_path.h),
  // behind the same TLS and auth as the metrics. Must not throw.
  std::function<std::string()> status;
  WebConfig web;
  WebSecrets secrets;
  HttpLimits limits;
  // --web.config.file: re-read (with the files it names) when any of them changes on disk; empty: never.
  std::string web_config_file;
  // --web.allowed-hosts: Host header names accepted (lower case); empty: any.
  std::vector<std::string> allowed_hosts;
  // What the defences did (defences.h); the daemon exports it. Never null once started.
  std::shared_ptr<HttpDefenceCounts> counts;
};

// One loaded web config, as new connections get it; a connection keeps the one it started with.
struct WebState {
  WebConfig web;
  std::shared_ptr<const TlsContext> tls;  // null without TLS
  std::shared_ptr<BasicAuth> auth;
};

// Renders the exposition text for one scrape. Must not throw.
using ScrapeHandler = std::function<std::string()>;

// gzip (RFC 1952) of `data`; false if zlib fails.
bool Gzip(const std::string& data, std::string* out);

// Whether an Accept-Encoding header value accepts gzip (a "gzip" token not given q=0).
bool AcceptsGzip(const std::string& accept_encoding);

class HttpServer {
 public:
  // Serves on the given listening sockets (taking ownership of them). nullptr with `error`
  // when libmicrohttpd refuses (bad certificate or key, for one).
  static std::unique_ptr<HttpServer> Start(const std::vector<int>& listen_fds, const HttpOptions& options,
                                           ScrapeHandler scrape, std::string* error);
  // Stops accepting, lets requests being answered finish (limits.drain_timeout at most), then
  // closes every connection and returns once no handler runs any more.
  ~HttpServer();

  // The internal heartbeat the systemd watchdog is fed by (daemon.cpp): true once every
  // event-loop thread has come round its loop since `since` (a thread stuck in a handler, in
  // bcrypt or a scrape, does not). Never an HTTP request: auth, client certificates or the
  // connection caps could refuse one.
  bool WorkersAlive(std::chrono::steady_clock::duration within);
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Per-connection state, for the request deadline.
  struct Conn {
    int fd = -1;
    size_t loop = 0;  // index in daemons_ of the event loop that serves it (the only one that may cut it)
    std::chrono::steady_clock::time_point waiting_since;
    bool in_request = false;  // a request is being answered: its response is never cut
    bool answered = false;    // at least one response was sent (waiting_since is then its end)
    bool cut = false;
    // Counted against the connection caps: from accept until cut, chosen to make room, or closed.
    // A cut connection gives its slot back at once, as its client may reconnect before the event
    // loop has closed it.
    bool holds_slot = false;
    // Chosen to make room for a new connection at the total cap (its slot already given to it): its
    // own event loop cuts it after its pass (CutEvicted), unless a request of it began meanwhile.
    bool evicting = false;
    std::chrono::steady_clock::time_point evicting_since;
    std::shared_ptr<const WebState> web;  // the web config (TLS context) this connection started with
    // A password check handed to the auth thread: the connection is suspended until it is done.
    enum class Auth { kNone, kPending, kOk, kWrong };
    Auth auth = Auth::kNone;
    std::string client;          // ClientKey of the peer: the connection caps and the auth gate count by it
    std::string target_problem;  // of the request being read (TargetProblem), "" if none
  };

  // The web config new connections get now.
  std::shared_ptr<const WebState> web() const;
  // Re-reads the web config file if it or a file it names changed on disk since the last look;
  // an invalid new one is logged and the last good one kept. Runs every 500 ms on the housekeeping thread.
  void ReloadWebConfigIfChanged();

 private:
  HttpServer(HttpOptions options, ScrapeHandler scrape);
  void HousekeepingLoop();
  // Cuts the connections of event loop `loop` past the request deadline. Runs on that loop's
  // thread between two of its passes, never beside one: a request libmicrohttpd has read has
  // then also been handed to Access (in_request) in the same pass.
  void CutLateConnections(size_t loop);
  // Ends a connection (shutdown: its event loop then closes it) and frees its slot. Under conns_mutex_.
  void Cut(Conn* conn);
  // At the total cap: chooses the connection that has waited longest without sending a complete
  // request (waiting_), takes its slot for the new connection and leaves it to its event loop to
  // cut. False if every open connection has sent its request. Under conns_mutex_, on the
  // accepting event loop's thread.
  bool MakeRoom();
  // Cuts what MakeRoom chose on event loop `loop`. Runs on that loop's thread after each of its
  // passes, as CutLateConnections: a request it has read has then reached Access, which keeps the
  // connection (Reprieve).
  void CutEvicted(size_t loop);
  // A connection chosen to make room began a request after all: it stays, and holds a slot again
  // (the total may pass the cap by as many, for as long as they take). Under conns_mutex_.
  void Reprieve(Conn* conn);
  // Takes a connection off its loop's evicting_ list (closed, or reprieved). Under conns_mutex_.
  void NotEvicting(Conn* conn);
  // One libmicrohttpd event loop on listen_fd (external epoll: Worker runs it); nullptr and errno if it fails.
  MHD_Daemon* StartEventLoop(int listen_fd, unsigned flags);
  // One request: its syntax and Host, the client certificate, basic auth, then Route.
  int Handle(MHD_Connection* connection, const char* url, const char* method, const char* version);
  // What makes the request a 400 (RFC 9112 strictness, --web.allowed-hosts); "" when nothing does.
  std::string RequestProblem(MHD_Connection* connection, const Conn* conn, const char* version) const;
  // Basic auth: true when the request may go on; else *answered is what Handle returns (a 401 or 429
  // queued, or MHD_YES for a connection suspended while the auth thread checks its password).
  bool Authorized(MHD_Connection* connection, Conn* conn, const WebState& state, int* answered);
  int SendTooManyRequests(MHD_Connection* connection, AuthGate::Verdict verdict, SteadyDuration retry_after);
  // GET or HEAD of /, the status path or the telemetry path.
  int Route(MHD_Connection* connection, const std::string& path, const char* method);

  friend struct HttpCallbacks;
  const HttpOptions options_;
  const ScrapeHandler scrape_;
  mutable std::mutex web_mutex_;
  std::shared_ptr<const WebState> web_;
  std::string web_stamp_;  // the files' identities (inode, size, mtime) at the last look
  AuthGate auth_gate_;
  ConnectionCaps caps_;
  std::shared_ptr<HttpDefenceCounts> counts_;
  std::string landing_page_;
  // limits.threads daemons per listening socket, in external epoll mode: each is driven by a
  // thread of ours (Worker), so the loop itself can say it is alive (heartbeats_).
  std::vector<MHD_Daemon*> daemons_;
  std::vector<int> fds_;
  std::vector<std::thread> workers_;
  std::unique_ptr<std::atomic<int64_t>[]> heartbeats_;  // per worker: steady_clock ns of its last pass
  std::atomic<bool> workers_stop_{false};
  void Worker(size_t index);
  void Drain();

  // bcrypt runs on a thread of its own, never on an event loop: a connection whose credentials
  // need a check is suspended (MHD_suspend_connection) and resumed with the result, so the
  // loops keep serving scrapes while a check runs (at most one: AuthGate).
  struct AuthJob {
    MHD_Connection* connection = nullptr;
    Conn* conn = nullptr;
    std::shared_ptr<BasicAuth> auth;  // of the web config the connection started with
    std::string user, password;
  };
  void AuthLoop();
  bool Enqueue(AuthJob job);  // false once the auth thread has stopped
  std::mutex auth_mutex_;
  std::condition_variable auth_wake_;
  std::vector<AuthJob> auth_jobs_;
  bool auth_stopping_ = false;
  std::thread auth_thread_;

  std::mutex conns_mutex_;
  std::set<Conn*> conns_;
  // The open connections waiting for a request, longest first: not cut, not chosen to make room, no
  // request of theirs being answered. What MakeRoom chooses from.
  WaitOrder<Conn*> waiting_;
  // Per event loop: its connections MakeRoom chose, for CutEvicted.
  std::vector<std::vector<Conn*>> evicting_;
  size_t peak_open_ = 0;  // most connections open at once since the housekeeping thread last looked
  std::mutex housekeeping_mutex_;
  std::condition_variable housekeeping_wake_;
  bool stopping_ = false;
  std::thread housekeeper_;
};

}  // namespace mergewatch
