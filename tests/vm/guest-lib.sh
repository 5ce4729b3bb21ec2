# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced by the guest scripts (guest-scenario.sh, guest-stacking.sh, guest-loader.sh, guest-multipath.sh):
# what they share. Defines functions only.

# The whole, visible NVMe disk whose controller (or, for a multipath head, subsystem) reports serial $1;
# status 1 when none does. Never a name: the controllers probe asynchronously (6.12), so nvme0n1 may be any
# of the guest's NVMe disks.
disk_by_serial() {
	local d serial
	for d in /sys/block/nvme*; do
		[ -e "$d/dev" ] && [ -r "$d/device/serial" ] || continue
		read -r serial < "$d/device/serial"
		[ "$serial" = "$1" ] && { echo "${d##*/}"; return 0; }
	done
	return 1
}
