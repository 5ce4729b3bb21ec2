// SPDX-License-Identifier: Apache-2.0
#include "http/listen.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mergewatch {

bool ParseListenAddress(const std::string& text, ListenAddress* address, std::string* error) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      *error = "expected [ipv6]:port (e.g. [::1]:9863), got \"" + text + "\"";
      return false;
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    in6_addr parsed{};
    if (inet_pton(AF_INET6, host.c_str(), &parsed) != 1) {
      *error = "\"" + host + "\" in brackets is not an IPv6 address";
      return false;
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      *error = "expected host:port (e.g. :9863, 127.0.0.1:9863 or [::1]:9863), got \"" + text + "\"";
      return false;
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      *error = "an IPv6 address must be written in brackets, as [" + host + "]:" + port;
      return false;
    }
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535) {
    *error = "port must be a number from 0 to 65535, got \"" + port + "\"";
    return false;
  }
  address->host = host;
  address->port = static_cast<uint16_t>(std::stoul(port));
  return true;
}

namespace {

int BindAndListen(int family, const sockaddr* addr, socklen_t len, bool dual_stack, std::string* error) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + strerror(errno);
    return -1;
  }
  const int on = 1, off = 0;
  // Restarts must not wait out TIME_WAIT of the previous instance's connections.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, dual_stack ? &off : &on, sizeof(int));
  if (bind(fd, addr, len) != 0 || listen(fd, SOMAXCONN) != 0) {
    *error = strerror(errno);
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int OpenListener(const ListenAddress& address, std::string* error) {
  if (address.host.empty()) {
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(address.port);
    const int fd = BindAndListen(AF_INET6, reinterpret_cast<sockaddr*>(&any6), sizeof(any6), true, error);
    if (fd >= 0 || error->rfind("socket:", 0) != 0) return fd;
    sockaddr_in any4{};  // no IPv6 in this kernel
    any4.sin_family = AF_INET;
    any4.sin_addr.s_addr = htonl(INADDR_ANY);
    any4.sin_port = htons(address.port);
    return BindAndListen(AF_INET, reinterpret_cast<sockaddr*>(&any4), sizeof(any4), false, error);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(address.host.c_str(), std::to_string(address.port).c_str(), &hints, &found);
  if (rc != 0) {
    *error = "cannot resolve \"" + address.host + "\": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next)
    fd = BindAndListen(a->ai_family, a->ai_addr, a->ai_addrlen, false, error);
  freeaddrinfo(found);
  return fd;
}

std::string SocketName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "fd " + std::to_string(fd);
  char host[INET6_ADDRSTRLEN] = "";
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return std::string("[") + host + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
  }
  return "fd " + std::to_string(fd) + " (family " + std::to_string(addr.ss_family) + ")";
}

std::vector<int> SystemdListenFds(std::string* error) {
  constexpr int kFirstFd = 3;  // SD_LISTEN_FDS_START
  std::vector<int> fds;
  const char* pid = std::getenv("LISTEN_PID");
  const char* count = std::getenv("LISTEN_FDS");
  if (pid == nullptr || count == nullptr) {
    *error = "no sockets from systemd (LISTEN_FDS is not set): start mergewatchd through its .socket unit";
    return fds;
  }
  const long n = strtol(count, nullptr, 10);
  const bool ours = strtol(pid, nullptr, 10) == getpid();
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  if (!ours || n <= 0) {
    *error = ours ? "systemd passed no sockets (LISTEN_FDS=" + std::string(count) + ")"
                  : "LISTEN_PID " + std::string(pid) + " is another process";
    return fds;
  }
  for (int fd = kFirstFd; fd < kFirstFd + n; ++fd) {
    int type = 0, listening = 0;
    socklen_t len = sizeof(int);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) {
      *error = "systemd socket fd " + std::to_string(fd) + " is not a listening stream socket (use ListenStream=)";
      for (int f : fds) close(f);
      fds.clear();
      return fds;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fds.push_back(fd);
  }
  return fds;
}

Listeners::~Listeners() {
  for (int fd : fds_) close(fd);
}

std::string Listeners::Names() const {
  std::string names;
  for (int fd : fds_) names += (names.empty() ? "" : ", ") + SocketName(fd);
  return names;
}

bool OpenListeners(bool systemd_socket, const std::vector<std::string>& addresses, Listeners* listeners,
                   std::string* error) {
  if (systemd_socket) {
    for (int fd : SystemdListenFds(error)) listeners->Add(fd);
    if (listeners->fds().empty()) *error = "the systemd sockets: " + *error;
    return !listeners->fds().empty();
  }
  for (const std::string& text : addresses) {
    ListenAddress address;
    if (!ParseListenAddress(text, &address, error)) return false;
    const int fd = OpenListener(address, error);
    if (fd < 0) {
      *error = text + ": " + *error + " (is another mergewatchd or exporter using the port? pick another with "
                                      "--web.listen-address)";
      return false;
    }
    listeners->Add(fd);
  }
  return true;
}

}  // namespace mergewatch
