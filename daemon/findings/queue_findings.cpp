// SPDX-License-Identifier: Apache-2.0
#include "findings/queue_findings.h"
#include "topology/transport.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <tuple>

namespace mergewatch {
namespace {

// Parses the leading decimal number of `text` from `*pos`, moving `*pos` past it.
std::optional<int> LeadingNumber(const std::string& text, size_t* pos) {
  int value = 0;
  if (*pos >= text.size() || !std::isdigit(static_cast<unsigned char>(text[*pos]))) return std::nullopt;
  const char* begin = text.data() + *pos;
  const auto [end, ec] = std::from_chars(begin, text.data() + text.size(), value);
  if (ec != std::errc() || end == begin) return std::nullopt;
  *pos += static_cast<size_t>(end - begin);
  return value;
}

std::string SysfsQueue(const std::string& device, const char* attribute) {
  return "/sys/block/" + device + "/queue/" + attribute;
}

std::string JoinWords(const std::vector<std::string>& words) {
  std::string joined;
  for (const std::string& w : words) joined += (joined.empty() ? "" : " ") + w;
  return joined;
}

// Request-based whole disks: the devices whose queue settings are their own.
bool Eligible(const BlockDevice& d) {
  return !d.is_partition && d.request_based && d.kind != DeviceKind::kDm && d.kind != DeviceKind::kMd;
}

std::optional<QueueFinding> RotationalWithoutScheduler(const BlockDevice& d) {
  const QueueSettings& q = d.queue;
  if (q.rotational != 1 || q.scheduler != "none" || !TransportReportsRotation(d.transport)) return std::nullopt;
  // An sd disk whose page B1 says nothing of rotation (rate 0: QEMU's scsi-hd without rotation_rate, virtual
  // SCSI disks of clouds) keeps sd's rotational default: a guess, like virtio-blk's.
  if (d.transport == "sd" && d.scsi_rotation_rate == 0) return std::nullopt;
  std::vector<std::string> elevators;
  for (const std::string& s : q.available_schedulers)
    if (s != "none") elevators.push_back(s);
  QueueFinding f{d.name, kRotationalWithoutScheduler, "", ""};
  f.evidence = "rotational=1 (" + (d.transport.empty() ? std::string("driver unknown") : "driver " + d.transport) +
               "), " + std::to_string(q.hw_queues) + (q.hw_queues == 1 ? " hardware queue" : " hardware queues") +
               ", scheduler none; ";
  const std::string set = "echo mq-deadline > " + SysfsQueue(d.name, "scheduler");
  // With one hardware queue (or host-wide tags) the kernel picks mq-deadline itself if it is there when
  // the disk registers; with more it picks none whatever is built in: only a udev rule makes it stick.
  const std::string stick = q.hw_queues == 1
      ? "build CONFIG_MQ_IOSCHED_DEADLINE=y (or load the module from the initramfs) so the disk gets it when it "
        "registers"
      : "make it stick with a udev rule setting ATTR{queue/scheduler} (with several hardware queues the kernel "
        "itself picks none)";
  if (elevators.empty()) {
    f.evidence += "no elevator is built in or loaded (queue/scheduler lists only none)";
    f.remedy = "modprobe mq-deadline, then " + set + "; " + stick;
  } else {
    f.evidence += "available: " + JoinWords(elevators);
    const bool deadline = std::find(elevators.begin(), elevators.end(), "mq-deadline") != elevators.end();
    f.remedy = (deadline ? set : "echo " + elevators.front() + " > " + SysfsQueue(d.name, "scheduler")) +
               ", and make it stick with a udev rule setting ATTR{queue/scheduler}";
  }
  return f;
}

std::optional<QueueFinding> MergingDisabledUnderStack(const BlockDevice& d, const Topology& topology,
                                                      const std::optional<KernelVersion>& kernel) {
  const int nomerges = d.queue.nomerges;
  if (nomerges <= 0) return std::nullopt;
  // Before 667ea36378cf (v6.11) the loop driver set QUEUE_FLAG_NOMERGES (nomerges reads 2) whenever it
  // was not in direct I/O mode: the driver's setting, not the administrator's. Unknown mode or an
  // unknown kernel counts as the driver's too: no finding rather than a wrong one.
  if (d.kind == DeviceKind::kLoop && nomerges == 2 && d.loop_direct_io != 1 && !(kernel && kernel->AtLeast(6, 11)))
    return std::nullopt;
  std::vector<std::string> stacked;
  for (const std::string& upper : topology.UpperDevices(d.name)) {
    const BlockDevice* u = topology.FindByName(upper);
    if (u != nullptr && (u->kind == DeviceKind::kDm || u->kind == DeviceKind::kMd)) stacked.push_back(upper);
  }
  if (stacked.empty()) return std::nullopt;
  QueueFinding f{d.name, kMergingDisabledUnderStack, "", ""};
  f.evidence = "nomerges=" + std::to_string(nomerges) + " under " + JoinWords(stacked) +
               (nomerges == 2 ? " (no merging at all)" : " (one-hit merges only)");
  f.remedy = "echo 0 > " + SysfsQueue(d.name, "nomerges") +
             ", and remove what set it (udev rule, tuned profile, boot script)";
  return f;
}

std::optional<QueueFinding> MaxSectorsCapped(const BlockDevice& d, const std::optional<KernelVersion>& kernel) {
  const uint64_t reference = MaxSectorsReferenceKb(d.queue, kernel);
  const uint64_t actual = d.queue.max_sectors_kb;
  if (reference == 0 || actual == 0 || actual * kMaxSectorsCapFactor > reference) return std::nullopt;
  QueueFinding f{d.name, kMaxSectorsCapped, "", ""};
  f.evidence = "max_sectors_kb=" + std::to_string(actual) + ", at most 1/" + std::to_string(kMaxSectorsCapFactor) +
               " of " + std::to_string(reference) + " KiB (min of the kernel's default cap " +
               std::to_string(DefaultMaxSectorsCapKb(kernel)) + ", max_hw_sectors_kb " +
               std::to_string(d.queue.max_hw_sectors_kb) +
               (d.queue.optimal_io_bytes > 0 ? ", optimal_io_size " + std::to_string(d.queue.optimal_io_bytes / 1024) : "") +
               ")";
  f.remedy = "echo " + std::to_string(reference) + " > " + SysfsQueue(d.name, "max_sectors_kb") +
             ", and remove what set it (udev rule, tuned profile, boot script)";
  return f;
}

}  // namespace

std::optional<KernelVersion> ParseKernelRelease(const std::string& release) {
  size_t pos = 0;
  const std::optional<int> major = LeadingNumber(release, &pos);
  if (!major || pos >= release.size() || release[pos] != '.') return std::nullopt;
  ++pos;
  const std::optional<int> minor = LeadingNumber(release, &pos);
  if (!minor) return std::nullopt;
  return KernelVersion{*major, *minor};
}

uint64_t DefaultMaxSectorsCapKb(const std::optional<KernelVersion>& kernel) {
  return kernel && kernel->AtLeast(6, 17) ? 4096 : 1280;
}

uint64_t MaxSectorsReferenceKb(const QueueSettings& queue, const std::optional<KernelVersion>& kernel) {
  if (queue.max_sectors_kb == 0) return 0;
  uint64_t reference = DefaultMaxSectorsCapKb(kernel);
  if (queue.max_hw_sectors_kb > 0) reference = std::min(reference, queue.max_hw_sectors_kb);
  // sd sets max_sectors to the device's Optimal Transfer Length (sd_revalidate_disk): its choice.
  if (queue.optimal_io_bytes >= 1024) reference = std::min(reference, queue.optimal_io_bytes / 1024);
  return reference;
}

std::vector<QueueFinding> FindQueueConfigProblems(const Topology& topology, const std::string& kernel_release) {
  const std::optional<KernelVersion> kernel = ParseKernelRelease(kernel_release);
  std::vector<QueueFinding> findings;
  for (const BlockDevice& d : topology.devices()) {  // sorted by name
    if (!Eligible(d)) continue;
    // In finding-name order, so the result is sorted by (device, finding).
    if (auto f = MaxSectorsCapped(d, kernel)) findings.push_back(std::move(*f));
    if (auto f = MergingDisabledUnderStack(d, topology, kernel)) findings.push_back(std::move(*f));
    if (auto f = RotationalWithoutScheduler(d)) findings.push_back(std::move(*f));
  }
  return findings;
}

std::vector<FindingChange> DescribeFindingChanges(const std::vector<QueueFinding>& before,
                                                  const std::vector<QueueFinding>& after) {
  std::vector<FindingChange> lines;
  auto contains = [](const std::vector<QueueFinding>& list, const QueueFinding& f) {
    return std::find(list.begin(), list.end(), f) != list.end();
  };
  for (const QueueFinding& f : after)
    if (!contains(before, f))
      lines.push_back({true, "queue finding " + f.finding + " on " + f.device + ": " + f.evidence + "; remedy: " + f.remedy});
  for (const QueueFinding& f : before)
    if (!contains(after, f)) lines.push_back({false, "queue finding " + f.finding + " on " + f.device + " cleared"});
  return lines;
}

const char* DeviceClassName(const BlockDevice& d) {
  if (d.is_partition || d.hidden || d.kind == DeviceKind::kDm || d.kind == DeviceKind::kMd) return nullptr;
  if (!d.request_based && d.multipath_paths.empty()) return nullptr;
  if (d.queue.rotational == 1) return "rotational";
  if (d.queue.rotational != 0) return nullptr;
  return d.kind == DeviceKind::kNvme ? "nvme" : "non_rotational";
}

}  // namespace mergewatch
