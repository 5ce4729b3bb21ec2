// SPDX-License-Identifier: Apache-2.0
#include "sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace mergewatch {

bool SdNotify(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || (path[0] != '/' && path[0] != '@')) return false;
  sockaddr_un addr{};
  size_t path_len = strlen(path);
  if (path_len >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path, path_len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  // The length must cover exactly the path: sizeof(addr) would add NULs to an abstract name.
  socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path_len);

  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ssize_t sent = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                        reinterpret_cast<sockaddr*>(&addr), addr_len);
  int saved = errno;
  close(fd);
  errno = saved;
  return sent == static_cast<ssize_t>(state.size());
}

uint64_t SdWatchdogUsec() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr) return 0;
  const char* pid = std::getenv("WATCHDOG_PID");
  if (pid != nullptr && strtoll(pid, nullptr, 10) != getpid()) return 0;
  return strtoull(usec, nullptr, 10);
}

}  // namespace mergewatch
