// SPDX-License-Identifier: Apache-2.0
#include "status_doc.h"

#include <cmath>

namespace mergewatch::cli {
namespace {

std::string Text(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The daemon's "services" list in words, as its onset line says them (ServicesText in the daemon):
// the "other" bucket only with requests, a v1 host's "" as "unattributed (cgroup v1)".
std::string ServicesText(const nlohmann::json& verdict) {
  if (!verdict.contains("services") || !verdict["services"].is_array()) return "";
  std::string text;
  for (const nlohmann::json& s : verdict["services"]) {
    if (!s.is_object() || !s.contains("share") || !s["share"].is_number()) continue;
    const std::string cgroup = Text(s, "cgroup");
    const double share = s["share"].get<double>();
    const bool empty_other = cgroup == "other" && s.contains("requests") && s["requests"].is_number() &&
                             s["requests"].get<double>() == 0;
    if (empty_other) continue;
    if (!text.empty()) text += ", ";
    text += std::to_string(static_cast<int>(std::lround(share * 100))) + "% " +
            (cgroup.empty() ? "unattributed (cgroup v1)" : cgroup);
  }
  return text;
}

}  // namespace

bool ParseStatusDoc(const std::string& text, StatusDoc* doc, std::string* error) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *error = "the status document is not a JSON object";
    return false;
  }
  auto verdicts = j.find("verdicts");
  auto findings = j.find("findings");
  if (verdicts == j.end() || !verdicts->is_array() || findings == j.end() || !findings->is_array()) {
    *error = "the status document has no verdicts and findings lists";
    return false;
  }
  *doc = StatusDoc{};
  doc->served = true;
  doc->version = Text(j, "version");
  for (const nlohmann::json& v : *verdicts) {
    if (!v.is_object() || !v.contains("device") || !v["device"].is_string()) {
      *error = "a verdict without a device";
      return false;
    }
    Verdict out;
    out.kind = Text(v, "kind");
    out.device = Text(v, "device");
    out.upper = Text(v, "upper");
    out.state = Text(v, "state");
    out.active = v.contains("active") && v["active"].is_boolean() && v["active"].get<bool>();
    if (v.contains("evidence") && v["evidence"].is_object()) out.evidence = Text(v["evidence"], "text");
    out.cause = Text(v, "cause");
    out.remedy = Text(v, "remedy");
    out.services = ServicesText(v);
    out.raw = v;
    doc->verdicts.push_back(std::move(out));
  }
  for (const nlohmann::json& f : *findings) {
    if (!f.is_object() || !f.contains("device") || !f["device"].is_string()) {
      *error = "a finding without a device";
      return false;
    }
    Finding out;
    out.device = Text(f, "device");
    out.finding = Text(f, "finding");
    out.evidence = Text(f, "evidence");
    out.remedy = Text(f, "remedy");
    out.raw = f;
    doc->findings.push_back(std::move(out));
  }
  return true;
}

}  // namespace mergewatch::cli
