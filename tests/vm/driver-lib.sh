# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Shared by the systemd-mode drivers (tests/vm/systemd/driver.sh, tests/vm/package/driver.sh): sourced
# first, as root in the guest under the host's systemd as PID 1. The sourcing driver sets `tag` (the
# prefix of its log lines) before. This file sends the driver's output to $MW_OUT/guest.log, and at
# exit (trap finish EXIT) saves the boot's journal, writes exit-status (the number of failed checks)
# and powers the VM off.
out=${MW_OUT:-/vmout}
unit=mergewatchd.service
url=http://127.0.0.1:9863/metrics
exec > >(tee -a "$out/guest.log") 2>&1

fails=0
up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "${tag:-mw-driver} [$(up)s]: $*"; }
res() { echo "$1=$2" >> "$out/results.txt"; echo "RESULT $1=$2"; }
check() {  # check NAME COMMAND...: records NAME_ok=1|0
	if "${@:2}"; then res "$1_ok" 1; else res "$1_ok" 0; fails=$((fails + 1)); say "CHECK FAILED: $1"; fi
}
prop() { systemctl show -p "$1" --value "$unit"; }
# Monotonic seconds (the guest never suspends, so /proc/uptime is CLOCK_MONOTONIC here).
since() { awk -v a="$1" -v b="$(up)" 'BEGIN { printf "%.1f", b - a }'; }
bpf_snapshot() {  # bpf_snapshot TAG: programs and links, JSON for the pytest, text for people
	bpftool -j prog show > "$out/bpftool-prog-$1.json" 2>> "$out/guest.log"
	bpftool -j link show > "$out/bpftool-link-$1.json" 2>> "$out/guest.log"
	{ bpftool prog show; echo; bpftool link show; } > "$out/bpftool-$1.txt" 2>&1
}
finish() {
	say "done with $fails failed check(s)"
	journalctl -b -o short-monotonic --no-pager > "$out/journal-boot.txt" 2>&1
	echo "$fails" > "$out/exit-status"
	sync
	systemctl poweroff -ff
}
trap finish EXIT

res kernel "$(uname -r)"
res virtualization "$(systemd-detect-virt)"
