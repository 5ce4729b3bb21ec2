// SPDX-License-Identifier: Apache-2.0
#include "topology/sysfs_beneath.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

// glibc before 2.32 (Debian 11's 2.31, which the release binaries are built with) has no SYS_openat2;
// the kernel headers define __NR_openat2 (Linux 5.6 and later, Debian 11's linux-libc-dev 5.10 included).
#ifndef SYS_openat2
#define SYS_openat2 __NR_openat2
#endif

namespace mergewatch {

int OpenSysfsRoot(const std::string& sysfs_root) { return open(sysfs_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC); }

int OpenBeneath(int root_fd, const std::string& rel, bool* unsupported) {
  *unsupported = root_fd < 0;
  if (root_fd < 0) return -1;
  open_how how{};
  how.flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  const int fd = static_cast<int>(syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof(how)));
  if (fd < 0) {
    *unsupported = errno == ENOSYS || errno == EPERM || errno == EINVAL || errno == E2BIG;
    return -1;
  }
  if (!IsRegularFile(fd)) {
    close(fd);
    return -1;
  }
  return fd;
}

bool IsRegularFile(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace mergewatch
