// SPDX-License-Identifier: Apache-2.0
// The files an operator names in flags and settings: --web.config.file and the certificates, keys and CA
// it names; the CLI's --config.file and password_file. Header-only, so the CLI shares it without linking the
// daemon's library.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace mergewatch {

// Files this large are a wrong path (a disk image, a log), not a configuration or a PEM bundle.
inline constexpr off_t kConfigFileMaxBytes = 16 << 20;

// Reads the whole regular file at `path` into `content`. Anything else is refused with a reason in `error`
// ("cannot read PATH: REASON"): std::ifstream opened a directory and read it as an empty file, so a
// --web.config.file mistyped as a directory served plain HTTP without authentication, with only a warning;
// a FIFO would hold the start until someone wrote to it (O_NONBLOCK opens it at once, and fstat refuses it).
inline bool ReadConfigFile(const std::string& path, std::string* content, std::string* error) {
  const auto refuse = [&](const std::string& reason) {
    *error = "cannot read " + path + ": " + reason;
    return false;
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return refuse(std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int saved = errno;
    close(fd);
    return refuse(std::strerror(saved));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return refuse(S_ISDIR(st.st_mode) ? "a directory, not a file" : "not a regular file");
  }
  if (st.st_size > kConfigFileMaxBytes) {
    close(fd);
    return refuse("larger than 16 MiB");
  }
  std::string text;
  char buffer[8192];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      close(fd);
      return refuse(std::strerror(saved));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (static_cast<off_t>(text.size()) > kConfigFileMaxBytes) {  // grew while read
      close(fd);
      return refuse("larger than 16 MiB");
    }
  }
  close(fd);
  *content = std::move(text);
  return true;
}

}  // namespace mergewatch
