// SPDX-License-Identifier: Apache-2.0
// A sysfs attribute opened in one system call, contained as the topology reader's walk contains its reads:
// openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) from an O_PATH descriptor of the sysfs root, so the kernel
// follows the relative symlinks sysfs is made of and refuses whatever would leave the root (an absolute
// symlink, ".." above it: EXDEV). For the readers that run often (the scrape's device names, the tick's queue
// settings); the topology scan itself walks with one lstat per component (sysfs_tree.h, SysfsTree).
#pragma once

#include <string>

namespace mergewatch {

// An O_PATH descriptor of the sysfs root, or -1 (the caller then has no fast path).
int OpenSysfsRoot(const std::string& sysfs_root);

// The attribute `rel` (relative to the root) opened read-only, non-blocking and close-on-exec, if it is a
// regular file (a FIFO planted where an attribute should be never blocks a reader); else -1. *unsupported is
// set when openat2 itself cannot be used (before Linux 5.6, or refused by a seccomp filter): the caller then
// takes its portable path.
int OpenBeneath(int root_fd, const std::string& rel, bool* unsupported);

// Whether the open descriptor `fd` is a regular file, the check both ways of reading an attribute make before
// they read (OpenBeneath here, SysfsTree's walk): a FIFO or device node in the tree is never read.
bool IsRegularFile(int fd);

}  // namespace mergewatch
