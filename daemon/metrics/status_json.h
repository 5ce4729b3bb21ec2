// SPDX-License-Identifier: Apache-2.0
// The detector's state as JSON, served at /status (status_path.h) beside the metrics under the
// same TLS and auth: each candidate's verdict with its evidence, cause and remedy (the words of
// the onset log line), and the queue configuration findings. The `mergewatch` command reads it.
//
// Generic lists, so that new kinds slot in: "verdicts" holds one entry per (kind, device)
// judged, "findings" one per finding that holds now. Every string passes through LabelText
// (exposition.h), so a device name reads the same here as in its metric labels and the
// document is always valid UTF-8.
#pragma once

#include <string>
#include <vector>

#include "detector/detector.h"
#include "findings/queue_findings.h"

namespace mergewatch {

struct DetectorStatus {
  std::string version;
  std::vector<DiskVerdict> verdicts;
  std::vector<QueueFinding> findings;
};

// "ok", "pending" (condition holds, not raised yet), "collapsed" (raised, condition holds),
// "clearing" (raised, condition gone, clear-after not over).
const char* VerdictState(const DiskVerdict& verdict);

// Pure: the JSON document (one line and a newline).
std::string StatusJson(const DetectorStatus& status);

}  // namespace mergewatch
