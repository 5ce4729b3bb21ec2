#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Boot a Debian kernel (6.1 by default) under qemu (TCG) with an emulated NVMe disk and run
# tests/vm/guest-scenario.sh in it. Needs tests/vm/setup.sh to have run.
#
#   tests/vm/run-vm.sh [options]
#     --kernel K           the guest kernel: 6.1 (Debian 12, default), 5.10 (Debian 11's),
#                          6.12 (Debian 13's); setup.sh --kernel K fetches it (vm.env or vm-K.env)
#     --out DIR            results dir (default build/vm/run-<timestamp>); the guest writes
#                          into it over 9p. Reused only if it holds an earlier run's marker.
#     --daemon PATH        mergewatchd built on the host (run in the guest at the same path)
#     --daemon-args ARGS   extra daemon arguments, one string, word-split in the guest
#     --metrics-url URL    daemon /metrics inside the guest (required with --daemon)
#     --detect-wait SEC    wait after each read before the last scrape (default 12), ended
#                          early once the detector raised (a merge_collapse series at 1)
#     --cases "SPEC..."    name:nomerges:seq|rand:snap|origin[:scheduler] ... (default: the
#                          four issue cases, scheduler none)
#     --file-mb N          size of each test file in MiB (default 64)
#     --reader cat|dd      sequential reader (default cat)
#     --bpftrace           run tests/vm/blk-events.bt around every case (slow start)
#     --timeout SEC        bound on the whole qemu run (default 600: a hang guard, not a speed bound)
#     --smp N --mem MiB    guest size (default 2, 2048)
#     --multipath          also give the guest a native-multipath NVMe namespace: one
#                          subsystem (nqn mwsubsys1) with two controllers sharing namespace 1
#                          (the guest shows a head nvmeXnY and path disks nvmeXc*nY)
#     --path-removal       with --multipath: at the end of guest-stacking.sh, remove one path's controller
#                          while the head lives (guest-multipath.sh; test_vm_multipath.py, 6.1 boot)
#     --part-disk          also give the guest a second single-path NVMe disk (serial mwpart01)
#                          that the scenario partitions, for LVM on a partition
#     --nvme-disks N       also give the guest N more single-path NVMe disks (serials
#                          mwnvme1..N, 1 GiB each), for md RAID0 and striped LVs over several
#                          disks (guest-stacking.sh's multi-disk part)
#     --multi-parts "P..." with --nvme-disks 2: only these stacks of the multi-disk part, in order
#                          (md md64k striped striped4k raid10 raid1w trim; all by default)
#     --rotational-disks N also give the guest N emulated 7200 rpm disks (QEMU scsi-hd, serials
#                          mwrot1..N) on one virtio-scsi controller with QEMU's default queues (one
#                          per vCPU): rotational disks with several hardware queues, for the queue findings
#     --virtio-blk-disks N also give the guest N one-queue virtio-blk disks (serials mwvblk1..N, 256 MiB):
#                          rotational=1 from a driver that cannot know, for the queue findings
#     --loader-cases       after the scenario (and stacking) cases, run tests/vm/guest-loader.sh
#                          in the same guest (loader-results.txt: test_vm_kernels.py)
#     --release TARBALL    with --release-root: make release's tarball, for the cases named rel-* (the
#                          release's daemon with default flags inside that root, its `mergewatch status`)
#                          and the TLS checks after the cases (tests/vm/guest-release.sh)
#     --release-root DIR   the Debian 11 root make release made with debootstrap (build/release/bullseye);
#                          the guest writes into it only through its overlay (the host's copy stays pristine)
#     --who "P..."         with --nvme-disks 2: after the findings, run tests/vm/guest-who.sh in the same
#                          guest with these parts (backup luks write perlv): which cgroup a collapsed
#                          pair's requests come from, and the per-volume series (test_vm_who.py)
#     --script PATH        run PATH in the guest instead of tests/vm/guest-scenario.sh
#     --append "WORDS"     add WORDS to the guest kernel's command line (e.g. lockdown=confidentiality)
#     --no-stacking        skip guest-stacking.sh after the cases (a boot that checks only its cases)
#     --stack-parts "P..." only these single-disk parts of guest-stacking.sh (late md split; all by
#                          default): iterate on one part without the others' guest time
#                          (exploration; the tests use the scenario)
#     --systemd            systemd mode (needs --daemon): boot the host's systemd as PID 1 with
#                          `make install DESTDIR=DIR/rootfs DAEMON=<--daemon>` copied into the
#                          guest's root (/usr/local/sbin/mergewatchd, the shipped unit,
#                          /etc/default/mergewatchd) and run tests/vm/systemd/driver.sh instead
#                          of the scenario (--daemon-args then go into /etc/default/mergewatchd)
#     --package DEB        package mode: systemd mode without `make install`; the driver
#                          tests/vm/package/driver.sh installs DEB with `apt-get install`
#                          in the guest, checks the service, purges it (test_package.py)
#     --unit-dropin FILE   systemd mode: also install FILE as a drop-in,
#                          /etc/systemd/system/mergewatchd.service.d/50-vmtest.conf (to try a
#                          change to the unit; test_systemd_unit.py asserts there is none)
#     -v, --verbose        stream the guest console while it runs
# Every option also reads an environment variable: MW_VM_KERNEL, MW_VM_APPEND, MW_VM_OUT, MW_VM_DAEMON,
# MW_VM_DAEMON_ARGS, MW_VM_METRICS_URL, MW_VM_DETECT_WAIT, MW_VM_CASES,
# MW_VM_FILE_MB, MW_VM_READER, MW_VM_BPFTRACE=1, MW_VM_SYSTEMD=1, MW_VM_PACKAGE, MW_VM_UNIT_DROPIN,
# MW_VM_TIMEOUT, MW_VM_SMP, MW_VM_MEM, MW_VM_MULTIPATH=1, MW_VM_PART_DISK=1, MW_VM_NVME_DISKS, MW_VM_LOADER_CASES=1,
# MW_VM_SCRIPT, MW_VM_RELEASE, MW_VM_RELEASE_ROOT, MW_VM_WHO;
# MW_VM_DIR is setup.sh's build dir (default <repo>/build/vm).
#
# Exit status: the guest scenario's status; 124 = qemu timed out; 125 = the
# guest wrote no status (boot or init failure). On failure the tail of the
# guest log is printed; 2 = bad arguments or setup.sh not run. Results:
# DIR/{console.log,guest.log,results.txt,case-*}.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
vmdir=${MW_VM_DIR:-"$repo/build/vm"}

kernel=${MW_VM_KERNEL:-6.1}
out=${MW_VM_OUT:-}
daemon=${MW_VM_DAEMON:-}
daemon_args=${MW_VM_DAEMON_ARGS:-}
metrics_url=${MW_VM_METRICS_URL:-}
detect_wait=${MW_VM_DETECT_WAIT:-12}
cases=${MW_VM_CASES:-}
file_mb=${MW_VM_FILE_MB:-64}
reader=${MW_VM_READER:-cat}
bpftrace=${MW_VM_BPFTRACE:-0}
systemd=${MW_VM_SYSTEMD:-0}
unit_dropin=${MW_VM_UNIT_DROPIN:-}
package=${MW_VM_PACKAGE:-}
timeout_s=${MW_VM_TIMEOUT:-}
smp=${MW_VM_SMP:-2}
mem=${MW_VM_MEM:-2048}
multipath=${MW_VM_MULTIPATH:-0}
path_removal=0
part_disk=${MW_VM_PART_DISK:-0}
rotational_disks=${MW_VM_ROTATIONAL_DISKS:-0}
virtio_blk_disks=${MW_VM_VIRTIO_BLK_DISKS:-0}
nvme_disks=${MW_VM_NVME_DISKS:-0}
multi_parts=
loader_cases=${MW_VM_LOADER_CASES:-0}
script=${MW_VM_SCRIPT:-$here/guest-scenario.sh}
release=${MW_VM_RELEASE:-}
release_root=${MW_VM_RELEASE_ROOT:-}
extra_append=${MW_VM_APPEND:-}
stacking=${MW_VM_STACKING:-1}
stack_parts=${MW_VM_STACK_PARTS:-}
who_parts=${MW_VM_WHO:-}
verbose=0

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d'; }
while [ $# -gt 0 ]; do
	case "$1" in
	--kernel) kernel=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--daemon) daemon=$2; shift 2 ;;
	--daemon-args) daemon_args=$2; shift 2 ;;
	--metrics-url) metrics_url=$2; shift 2 ;;
	--detect-wait) detect_wait=$2; shift 2 ;;
	--cases) cases=$2; shift 2 ;;
	--file-mb) file_mb=$2; shift 2 ;;
	--reader) reader=$2; shift 2 ;;
	--bpftrace) bpftrace=1; shift ;;
	--systemd) systemd=1; shift ;;
	--unit-dropin) unit_dropin=$2; shift 2 ;;
	--package) package=$2; shift 2 ;;
	--timeout) timeout_s=$2; shift 2 ;;
	--smp) smp=$2; shift 2 ;;
	--mem) mem=$2; shift 2 ;;
	--multipath) multipath=1; shift ;;
	--path-removal) path_removal=1; shift ;;
	--part-disk) part_disk=1; shift ;;
	--rotational-disks) rotational_disks=$2; shift 2 ;;
	--virtio-blk-disks) virtio_blk_disks=$2; shift 2 ;;
	--nvme-disks) nvme_disks=$2; shift 2 ;;
	--multi-parts) multi_parts=$2; shift 2 ;;
	--loader-cases) loader_cases=1; shift ;;
	--script) script=$2; shift 2 ;;
	--release) release=$2; shift 2 ;;
	--release-root) release_root=$2; shift 2 ;;
	--append) extra_append=$2; shift 2 ;;
	--no-stacking) stacking=0; shift ;;
	--stack-parts) stack_parts=$2; shift 2 ;;
	--who) who_parts=$2; shift 2 ;;
	-v|--verbose) verbose=1; shift ;;
	-h|--help) usage; exit 0 ;;
	*) echo "run-vm.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
	esac
done

say() { printf 'run-vm: %s\n' "$*"; }
die() { printf 'run-vm: ERROR: %s\n' "$*" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || die "must run as root (the guest reads the host's root over 9p)"
[[ "$rotational_disks" =~ ^[0-9]$ ]] || die "--rotational-disks '$rotational_disks': a number of disks from 0 to 9"
[[ "$virtio_blk_disks" =~ ^[0-9]$ ]] || die "--virtio-blk-disks '$virtio_blk_disks': a number of disks from 0 to 9"
[[ "$nvme_disks" =~ ^[0-9]$ ]] || die "--nvme-disks '$nvme_disks': a number of disks from 0 to 9"
case "$kernel" in
6.1) vmenv="$vmdir/vm.env" ;;
5.10|6.12) vmenv="$vmdir/vm-$kernel.env" ;;
*) die "--kernel '$kernel': one of 6.1, 5.10, 6.12" ;;
esac
[ -f "$vmenv" ] || die "$vmenv missing: run tests/vm/setup.sh --kernel $kernel first"
# shellcheck source=/dev/null
. "$vmenv"
for f in "$VMLINUZ" "$INITRD"; do [ -f "$f" ] || die "$f missing: run tests/vm/setup.sh --kernel $kernel"; done
[ -d "$MODDIR" ] || die "$MODDIR missing: run tests/vm/setup.sh --kernel $kernel"
case "$extra_append" in *mw.*) die "--append: mw.* parameters are run-vm.sh's own" ;; esac
command -v qemu-system-x86_64 > /dev/null || die "qemu-system-x86_64 missing: run tests/vm/setup.sh"

if [ -n "$daemon" ]; then
	daemon=$(readlink -f "$daemon")
	[ -x "$daemon" ] || die "daemon '$daemon' is not an executable file"
	# The guest sees the host's / except these, which it mounts afresh.
	case "$daemon" in
	/run/*|/dev/*|/proc/*|/sys/*) die "daemon '$daemon' is under a path the guest mounts afresh; build it elsewhere" ;;
	esac
	[ "$systemd" = 1 ] || [ -n "$metrics_url" ] ||
		die "--metrics-url is required with --daemon (the daemon's listen address in the guest)"
fi
driver="$here/systemd/driver.sh"
if [ -n "$package" ]; then
	package=$(readlink -f "$package")
	[ -f "$package" ] && [ "${package%.deb}" != "$package" ] || die "--package '$package' is not a .deb file"
	[ -z "$daemon" ] || die "--package and --daemon exclude each other (the package brings the daemon)"
	systemd=1
	driver="$here/package/driver.sh"
elif [ "$systemd" = 1 ]; then
	[ -n "$daemon" ] || die "--systemd needs --daemon PATH (installed by make install as /usr/local/sbin/mergewatchd)"
	command -v make > /dev/null || die "--systemd: make missing (the guest root gets \`make install DESTDIR=\`)"
	[ -z "$unit_dropin" ] || [ -f "$unit_dropin" ] || die "--unit-dropin '$unit_dropin' is not a file"
	[ -x /lib/systemd/systemd ] || die "--systemd: /lib/systemd/systemd missing on the host (the guest's userland)"
fi
if [ -n "$release$release_root" ]; then
	[ -n "$release" ] && [ -n "$release_root" ] || die "--release and --release-root go together"
	release=$(readlink -f "$release"); release_root=$(readlink -f "$release_root")
	[ -f "$release" ] || die "--release '$release' is not a file (make release writes it)"
	[ -f "$release_root/etc/debian_version" ] || die "--release-root '$release_root' is not a Debian root"
fi
script=$(readlink -f "$script")
[ -f "$script" ] || die "guest script '$script' is not a file"
[ -n "$timeout_s" ] || { [ "$bpftrace" = 1 ] && timeout_s=600 || timeout_s=600; }

# ------------------------------------------------------------------ run dir
[ -n "$out" ] || out="$vmdir/run-$(date +%Y%m%d-%H%M%S)"
if [ -e "$out" ]; then
	[ -d "$out" ] && [ -f "$out/.mw-vm-run" ] ||
		die "$out exists and is not an earlier run dir (no .mw-vm-run marker); not touching it"
	find "$out" -mindepth 1 -delete
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
touch "$out/.mw-vm-run"

# The guest sources this with bash: printf %q keeps every value one word.
{
	printf 'MW_DAEMON=%q\n' "$daemon"
	printf 'MW_DAEMON_ARGS=%q\n' "$daemon_args"
	printf 'MW_METRICS_URL=%q\n' "$metrics_url"
	printf 'MW_DETECT_WAIT=%q\n' "$detect_wait"
	[ -n "$cases" ] && printf 'MW_CASES=%q\n' "$cases"
	printf 'MW_FILE_MB=%q\n' "$file_mb"
	printf 'MW_READER=%q\n' "$reader"
	printf 'MW_BPFTRACE=%q\n' "$bpftrace"
	printf 'MW_PACKAGE=%q\n' "$package"
	printf 'MW_MULTIPATH=%q\n' "$multipath"
	printf 'MW_PATH_REMOVAL=%q\n' "$path_removal"
	printf 'MW_PART_DISK=%q\n' "$part_disk"
	printf 'MW_NVME_DISKS=%q\n' "$nvme_disks"
	[ -n "$multi_parts" ] && printf 'MW_MULTI_PARTS=%q\n' "$multi_parts"
	printf 'MW_ROTATIONAL_DISKS=%q\n' "$rotational_disks"
	printf 'MW_VIRTIO_BLK_DISKS=%q\n' "$virtio_blk_disks"
	printf 'MW_STACKING=%q\n' "$stacking"
	[ -n "$stack_parts" ] && printf 'MW_STACK_PARTS=%q\n' "$stack_parts"
	[ -n "$who_parts" ] && printf 'MW_WHO_PARTS=%q\n' "$who_parts"
	printf 'MW_LOADER_CASES=%q\n' "$loader_cases"
	printf 'MW_RELEASE_TARBALL=%q\n' "$release"
	printf 'MW_RELEASE_ROOT=%q\n' "$release_root"
} > "$out/guest.env"

# systemd mode: a tree that guest-init.sh copies over the guest's root before switch_root.
stage_systemd_root() {
	local root="$out/rootfs" etc="$out/rootfs/etc/systemd/system" u
	mkdir -p "$root"
	# Package mode: the driver installs the .deb itself, nothing is staged.
	[ -n "$package" ] || {
	# The real `make install` (PREFIX=/usr/local): daemon, unit (@SBINDIR@ substituted),
	# /etc/default/mergewatchd, rules. -o all: install what is given, never build here.
	make -C "$repo" --no-print-directory -o all install DESTDIR="$root" DAEMON="$daemon" \
		> "$out/make-install.log" 2>&1 || { cat "$out/make-install.log" >&2; die "make install DESTDIR=$root failed"; }
	# An operator's flags, as an edit of the installed /etc/default/mergewatchd.
	[ -n "$daemon_args" ] && printf 'MERGEWATCHD_ARGS=%s\n' "$daemon_args" >> "$root/etc/default/mergewatchd"
	}
	mkdir -p "$etc"
	if [ -n "$unit_dropin" ]; then
		install -D -m 0644 "$unit_dropin" "$etc/mergewatchd.service.d/50-vmtest.conf"
	fi
	cat > "$etc/mergewatch-vmtest.target" <<-EOF
	[Unit]
	Description=mergewatch VM test (tests/vm/run-vm.sh --systemd)
	Wants=basic.target
	Requires=mergewatch-vmtest-driver.service
	After=mergewatch-vmtest-driver.service
	AllowIsolate=yes
	EOF
	# After=mergewatchd.service references the service, so systemd keeps it loaded once it is
	# stopped: unloaded (garbage-collected), `systemctl show` would report defaults
	# (ExecMainCode=0, ExecMainStatus=0) whatever the real exit was.
	cat > "$etc/mergewatch-vmtest-driver.service" <<-EOF
	[Unit]
	Description=mergewatch VM test driver
	DefaultDependencies=no
	Wants=systemd-journald.socket
	After=systemd-journald.socket mergewatchd.service
	# The driver powers off itself; this covers it dying before its EXIT trap.
	FailureAction=poweroff-immediate
	[Service]
	Type=oneshot
	TimeoutStartSec=infinity
	Environment=MW_OUT=/vmout PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	ExecStart=/bin/bash $driver
	StandardOutput=journal+console
	StandardError=inherit
	EOF
	# Host units (the guest's /etc is the host's) that sysinit/basic would pull in and that
	# are slow under TCG, need hardware or state the guest lacks, or are irrelevant here.
	for u in systemd-firstboot.service systemd-machine-id-commit.service systemd-pstore.service \
		systemd-timesyncd.service blk-availability.service lvm2-monitor.service lvm2-lvmpolld.socket \
		dm-event.socket uuidd.socket systemd-repart.service systemd-pcrphase-sysinit.service \
		systemd-pcrphase.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount \
		systemd-random-seed.service systemd-update-utmp.service systemd-journal-flush.service \
		systemd-remount-fs.service systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service \
		systemd-sysusers.service systemd-modules-load.service systemd-hwdb-update.service \
		systemd-journal-catalog-update.service systemd-update-done.service ldconfig.service \
		sys-fs-fuse-connections.mount sys-kernel-config.mount timers.target \
		nvmefc-boot-connections.service nvmf-autoconnect.service; do
		ln -sfn /dev/null "$etc/$u"
	done
}
[ "$systemd" = 1 ] && stage_systemd_root

disk=$(mktemp "$vmdir/nvme-XXXXXX.img")
truncate -s 2G "$disk"      # sparse; deleted on exit
mpdisk=
mpargs=()
partdisk=
if [ "$part_disk" = 1 ]; then
	partdisk=$(mktemp "$vmdir/nvme-part-XXXXXX.img")
	truncate -s 1G "$partdisk"
	mpargs+=(-drive "file=$partdisk,if=none,id=pd0,format=raw,cache=unsafe" -device nvme,serial=mwpart01,drive=pd0)
fi
nvmedisks=()
# Single-path NVMe disks for the multi-disk stacks, after the scenario's disk (it stays nvme0);
# the guest finds them by serial, never by name (controllers are numbered in probe order).
for i in $(seq 1 "$nvme_disks"); do
	nvmedisks+=("$(mktemp "$vmdir/nvme-extra-XXXXXX.img")")
	truncate -s 1G "${nvmedisks[-1]}"
	mpargs+=(-drive "file=${nvmedisks[-1]},if=none,id=nx$i,format=raw,cache=unsafe" -device "nvme,serial=mwnvme$i,drive=nx$i")
done
rotdisks=()
if [ "$rotational_disks" -gt 0 ]; then
	# QEMU's default num_queues, one per vCPU: the guest's disks get that many hardware queues, so the
	# kernel picks none for them (elevator_get_default()) though they report 7200 rpm, as an HDD behind a
	# multi-queue HBA. The one-queue shape (a SATA port) is the unit tests' md-raid1-hdd fixture.
	mpargs+=(-device virtio-scsi-pci,id=mwscsi)
	for i in $(seq 1 "$rotational_disks"); do
		rotdisks+=("$(mktemp "$vmdir/rot-XXXXXX.img")")
		truncate -s 256M "${rotdisks[-1]}"
		mpargs+=(-drive "file=${rotdisks[-1]},if=none,id=rot$i,format=raw,cache=unsafe"
			-device scsi-hd,drive=rot$i,bus=mwscsi.0,rotation_rate=7200,serial=mwrot$i)
	done
fi
for i in $(seq 1 "$virtio_blk_disks"); do
	rotdisks+=("$(mktemp "$vmdir/vblk-XXXXXX.img")")
	truncate -s 256M "${rotdisks[-1]}"
	# num-queues=1: a single-queue virtio-blk disk, the cloud image's shape that got a finding for nothing.
	mpargs+=(-drive "file=${rotdisks[-1]},if=none,id=vblk$i,format=raw,cache=unsafe"
		-device "virtio-blk-pci,drive=vblk$i,num-queues=1,serial=mwvblk$i")
done
if [ "$multipath" = 1 ]; then
	mpdisk=$(mktemp "$vmdir/nvme-mp-XXXXXX.img")
	truncate -s 1G "$mpdisk"
	# Native NVMe multipath as on a dual-port drive: one subsystem, two controllers (both must
	# carry the subsystem's serial, QEMU 7.2 refuses otherwise), one shared namespace. After
	# the single-path disk, so that one stays nvme0 (controllers are numbered in probe order).
	mpargs+=(-drive "file=$mpdisk,if=none,id=mp0,format=raw,cache=unsafe"
		-device nvme-subsys,id=mwsubsys1,nqn=mwsubsys1
		-device nvme,serial=mwmp01,subsys=mwsubsys1
		-device nvme,serial=mwmp01,subsys=mwsubsys1
		-device nvme-ns,drive=mp0,nsid=1)
fi

qpid=
tailpid=
cleanup() {
	[ -n "$qpid" ] && kill "$qpid" 2>/dev/null && wait "$qpid" 2>/dev/null
	[ -n "$tailpid" ] && kill "$tailpid" 2>/dev/null
	rm -f "$disk"
	[ -z "$mpdisk" ] || rm -f "$mpdisk"
	[ -z "$partdisk" ] || rm -f "$partdisk"
	[ "${#rotdisks[@]}" = 0 ] || rm -f "${rotdisks[@]}"
	[ "${#nvmedisks[@]}" = 0 ] || rm -f "${nvmedisks[@]}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "kernel $KVER${extra_append:+ (+ $extra_append)}, out $out, timeout ${timeout_s}s, daemon ${daemon:-none}, bpftrace $bpftrace, systemd $systemd${package:+, package $package}"
if [ "$systemd" = 1 ]; then
	append="console=ttyS0 panic=-1 mitigations=off mw.init=systemd mw.moddir=$MODDIR"
	append+=" systemd.unit=mergewatch-vmtest.target systemd.show_status=1 fstab=no systemd.firstboot=0"
else
	append="console=ttyS0 panic=-1 mitigations=off mw.script=$script mw.moddir=$MODDIR"
fi
[ -z "$extra_append" ] || append+=" $extra_append"
start=$(date +%s.%N)
# TCG only: KVM does not work on this host kind (see tests/vm/README.md).
# -nodefaults: no VGA/NIC/floppy; the guest needs no network besides loopback.
timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
	-accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem" \
	-nodefaults -no-user-config -display none -no-reboot \
	-serial "file:$out/console.log" -monitor none \
	-kernel "$VMLINUZ" -initrd "$INITRD" \
	-append "$append" \
	-drive "file=$disk,if=none,id=nvm,format=raw,cache=unsafe" \
	-device nvme,serial=mw0001,drive=nvm \
	"${mpargs[@]}" \
	-fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
	-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
	-fsdev "local,id=mwout,path=$out,security_model=none" \
	-device virtio-9p-pci,fsdev=mwout,mount_tag=mwout \
	< /dev/null > "$out/qemu.log" 2>&1 &
qpid=$!
if [ "$verbose" = 1 ]; then
	touch "$out/console.log"
	tail -n +1 -f --pid="$qpid" "$out/console.log" &
	tailpid=$!
fi
qrc=0
wait "$qpid" || qrc=$?
qpid=
[ -n "$tailpid" ] && { wait "$tailpid" 2>/dev/null || true; tailpid=; }
wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')

if [ "$qrc" -eq 124 ] || [ "$qrc" -eq 137 ]; then
	rc=124; why="qemu timed out after ${timeout_s}s"
elif [ ! -s "$out/exit-status" ]; then
	rc=125; why="guest wrote no exit status (qemu exit $qrc)"
else
	rc=$(cat "$out/exit-status")
	why="guest scenario exit status $rc"
fi
echo "$wall" > "$out/wall-seconds"

# Serial output has SeaBIOS/terminal escape codes and CRs; strip them for reading.
clean() { sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1bc//g' -e 's/\r//g' "$@"; }

if [ "$rc" -ne 0 ]; then
	say "FAILED: $why, wall ${wall}s"
	[ -s "$out/qemu.log" ] && { echo "---- qemu.log"; cat "$out/qemu.log"; }
	if [ -s "$out/guest.log" ]; then
		echo "---- tail of guest log ($out/guest.log)"; clean "$out/guest.log" | tail -n 60
	fi
	echo "---- tail of guest console ($out/console.log)"; clean "$out/console.log" | tail -n 25
	exit "$rc"
fi

grep -h '^ATTACH' "$out/guest.log" || true
grep -h '^RESULT' "$out/results.txt" || true
say "PASSED: $why, wall ${wall}s, results in $out"
