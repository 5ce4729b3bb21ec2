// SPDX-License-Identifier: Apache-2.0
#include "status_doc.h"

namespace mergewatch::cli {
namespace {

std::string Text(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
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
