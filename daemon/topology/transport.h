// SPDX-License-Identifier: Apache-2.0
// Which driver a disk hangs off, read from sysfs, and whether that driver's queue/rotational is something
// the device told it (the queue finding rotational_without_scheduler trusts only those).
//
// A disk's transport is the basename of <disk>/device/driver ("sd", "virtio_blk", "vbd" for Xen blkfront,
// "mmcblk"), else the class of <disk>/device ("nvme": a namespace's device is its controller, which has no
// driver link), "loop" for a loop device (no device link at all), "aoe" for an ATA-over-Ethernet disk
// (etherd!eX.Y, no device link either), and "" when none of these resolves (nbd, ublk, null_blk, rbd: virtual
// disks without a device).
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace mergewatch {

// The canonical, symlink-free path of `rel` inside the sysfs root (relative to it), or nullopt when `rel`
// does not resolve there. The topology scan passes its own walk (topology.cpp), which never leaves the root.
using SysfsResolver = std::function<std::optional<std::string>(const std::string& rel)>;

// The transport of the whole disk whose canonical directory is `disk_rel` (see above).
std::string ReadTransport(const SysfsResolver& resolve, const std::string& disk_rel, bool is_loop);

// False for the transports whose rotational flag is never the device's word, whatever the medium behind:
// - virtio_blk: the virtio-blk device has no rotation field or feature bit, so the driver never sets
//   nonrot (before v6.11 the queue default stayed rotational; since bd4a633b6f7c, v6.11, virtblk_probe sets
//   BLK_FEAT_ROTATIONAL unconditionally): rotational=1 on every vdX, SSD-backed or not.
// - vbd (Xen blkfront): blkif carries no rotation either. The driver set QUEUE_FLAG_VIRT, an alias of
//   QUEUE_FLAG_NONROT, up to v6.10 and sets no BLK_FEAT_ROTATIONAL since bd4a633b6f7c, so it reads 0 unless
//   a udev rule or an image wrote 1: then that is a guess, not the device.
// - loop: loop_update_rotational (folded into loop_reconfigure_limits by 97dd4a43d69b, v6.11) copies the
//   flag of the backing file's block device (nonrot when there is none, tmpfs): the backing disk's flag, or
//   virtio_blk's constant on a cloud VM. And the loop queue's scheduler never orders what reaches a spindle:
//   its requests become file I/O that the backing disk's own queue sorts (that disk is judged itself).
// - aoe: aoeblk takes the ATA identify data for its geometry only and leaves the flag at the rotational
//   default (BLK_FEAT_ROTATIONAL unconditionally since bd4a633b6f7c).
// Everything else can say: sd from the VPD Block Device Characteristics page (MEDIUM ROTATION RATE 1 clears
// it; libata fills the page from IDENTIFY word 217), nvme from the namespace's rotational feature bit
// (kernels without it: always nonrot), nbd from NBD_FLAG_ROTATIONAL, ublk from its parameters; mmcblk, rbd,
// null_blk are nonrot by default. An unknown transport ("") counts as one that can say.
bool TransportReportsRotation(const std::string& transport);

}  // namespace mergewatch
