// SPDX-License-Identifier: Apache-2.0
// The files an operator names in flags and settings: --web.config.file and the certificates, keys and CA
// it names; the CLI's --config, --password-file and password_file. Header-only, so the CLI shares it without linking the
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

namespace config_file_detail {

// The whole regular file open at `fd` into `text`; "" on success, else why not.
inline std::string ReadRegular(int fd, std::string* text) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return S_ISDIR(st.st_mode) ? "a directory, not a file" : "not a regular file";
  if (st.st_size > kConfigFileMaxBytes) return "larger than 16 MiB";
  char buffer[8192];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::strerror(errno);
    if (n == 0) return "";
    text->append(buffer, static_cast<size_t>(n));
    if (static_cast<off_t>(text->size()) > kConfigFileMaxBytes) return "larger than 16 MiB";  // grew while read
  }
}

}  // namespace config_file_detail

// Reads the whole regular file at `path` into `content`. Anything else is refused with a reason in `error`
// ("cannot read PATH: REASON"): std::ifstream opened a directory and read it as an empty file, so a
// --web.config.file mistyped as a directory served plain HTTP without authentication, with only a warning;
// a FIFO would hold the start until someone wrote to it (O_NONBLOCK opens it at once, and fstat refuses it).
inline bool ReadConfigFile(const std::string& path, std::string* content, std::string* error) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  std::string text, reason;
  if (fd < 0) {
    reason = std::strerror(errno);
  } else {
    reason = config_file_detail::ReadRegular(fd, &text);
    close(fd);
  }
  if (!reason.empty()) {
    *error = "cannot read " + path + ": " + reason;
    return false;
  }
  *content = std::move(text);
  return true;
}

}  // namespace mergewatch
