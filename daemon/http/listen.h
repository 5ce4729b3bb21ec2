// SPDX-License-Identifier: Apache-2.0
// The sockets the HTTP server accepts on: bound from --web.listen-address, or handed over
// by systemd (--web.systemd-socket). Opened before any BPF work, so a taken port is the
// first and cheapest failure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mergewatch {

// "host:port" as exporters write it: ":9863" (every interface, IPv6 and IPv4),
// "127.0.0.1:9863", "[::1]:9863", "[::]:9863", "localhost:9863". Port 0 picks a free one.
struct ListenAddress {
  std::string host;  // without brackets; empty = every interface
  uint16_t port = 0;
};

// Pure syntax check: no name lookup, no socket.
bool ParseListenAddress(const std::string& text, ListenAddress* address, std::string* error);

// A bound, listening, non-blocking TCP socket (CLOEXEC), or -1 with `error` set. An empty
// host binds [::] with IPV6_V6ONLY off (IPv4 clients arrive as ::ffff:a.b.c.d), falling
// back to 0.0.0.0 on a kernel without IPv6.
int OpenListener(const ListenAddress& address, std::string* error);

// "[::1]:9863" / "127.0.0.1:9863" for a listening socket, for logs.
std::string SocketName(int fd);

// The sockets systemd passed (sd_listen_fds(3) protocol: LISTEN_PID is us, LISTEN_FDS
// sockets from fd 3). Each must be a listening stream socket. Unsets the variables so no
// child inherits them. Empty with `error` set when there are none or one is unusable.
std::vector<int> SystemdListenFds(std::string* error);

// Listening sockets not yet handed to the HTTP server: closed if startup fails first.
class Listeners {
 public:
  Listeners() = default;
  Listeners(const Listeners&) = delete;
  Listeners& operator=(const Listeners&) = delete;
  ~Listeners();
  void Add(int fd) { fds_.push_back(fd); }
  const std::vector<int>& fds() const { return fds_; }
  std::vector<int> Release() { return std::move(fds_); }
  // "127.0.0.1:9863, [::1]:9863", for the log.
  std::string Names() const;

 private:
  std::vector<int> fds_;
};

// The sockets systemd passed (systemd_socket), else one per --web.listen-address. False with the
// reason (naming the address, and what to do about a taken port) on the first that fails.
bool OpenListeners(bool systemd_socket, const std::vector<std::string>& addresses, Listeners* listeners,
                   std::string* error);

}  // namespace mergewatch
