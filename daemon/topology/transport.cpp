// SPDX-License-Identifier: Apache-2.0
#include "topology/transport.h"

#include <array>

namespace mergewatch {
namespace {

std::string Basename(const std::string& rel) {
  const size_t slash = rel.rfind('/');
  return slash == std::string::npos ? rel : rel.substr(slash + 1);
}

}  // namespace

std::string ReadTransport(const SysfsResolver& resolve, const std::string& disk_rel, bool is_loop) {
  if (is_loop) return "loop";
  // aoeblk names its disks "etherd/e<shelf>.<slot>"; sysfs shows the '/' as '!'. No device link.
  if (Basename(disk_rel).rfind("etherd!", 0) == 0) return "aoe";
  if (const std::optional<std::string> driver = resolve(disk_rel + "/device/driver")) return Basename(*driver);
  if (!resolve(disk_rel + "/device")) return "";
  // A device without a driver link: an NVMe namespace's parent is its controller (class nvme), a
  // multipath head's the subsystem (class nvme-subsystem).
  if (const std::optional<std::string> subsystem = resolve(disk_rel + "/device/subsystem"))
    return Basename(*subsystem);
  return "";
}

bool TransportReportsRotation(const std::string& transport) {
  static constexpr std::array<const char*, 4> kCannot = {"virtio_blk", "vbd", "loop", "aoe"};
  for (const char* t : kCannot)
    if (transport == t) return false;
  return true;
}

}  // namespace mergewatch
