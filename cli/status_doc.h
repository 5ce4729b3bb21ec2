// SPDX-License-Identifier: Apache-2.0
// The daemon's /status document (daemon/metrics/status_json.h), read back.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mergewatch::cli {

// One judged (kind, device): a merge collapse verdict today; other kinds read the same way.
struct Verdict {
  std::string kind;
  std::string device;
  std::string upper;
  std::string state;  // ok, pending, collapsed, clearing
  bool active = false;  // the alert is raised
  std::string evidence;  // the sentence of the onset line
  std::string cause;
  std::string remedy;
  // Who sent the pair's requests while its condition holds: "97% /backup.slice, 3% other" ("" none).
  std::string services;
  nlohmann::json raw;  // the entry as served, for --json
};

// A queue configuration finding that holds now.
struct Finding {
  std::string device;
  std::string finding;
  std::string evidence;
  std::string remedy;
  nlohmann::json raw;
};

struct StatusDoc {
  bool served = false;  // false: the daemon has no /status (an older mergewatchd)
  std::string version;
  std::vector<Verdict> verdicts;
  std::vector<Finding> findings;
};

// False with `error` when the text is not JSON or not shaped like /status.
bool ParseStatusDoc(const std::string& text, StatusDoc* doc, std::string* error);

}  // namespace mergewatch::cli
