// SPDX-License-Identifier: Apache-2.0
#include "metrics/status_json.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "text.h"

namespace mergewatch {
namespace {

// JSON has no NaN or infinity: a ratio that has none is null.
nlohmann::json Number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// The top services of a collapsed pair, then "other"; cgroup paths are raw bytes: LabelText makes them UTF-8.
nlohmann::json ServicesJson(const std::vector<ServiceShare>& services) {
  nlohmann::json out = nlohmann::json::array();
  for (const ServiceShare& s : services)
    out.push_back({{"cgroup", LabelText(s.cgroup)}, {"share", Number(s.share)}, {"requests", s.requests}});
  return out;
}

}  // namespace

const char* VerdictState(const DiskVerdict& verdict) {
  if (verdict.raised) return verdict.condition ? "collapsed" : "clearing";
  return verdict.condition ? "pending" : "ok";
}

std::string StatusJson(const DetectorStatus& status) {
  nlohmann::json verdicts = nlohmann::json::array();
  for (const DiskVerdict& v : status.verdicts) {
    const CollapseEvidence& e = v.evidence;
    verdicts.push_back({
        {"kind", "merge_collapse"},
        {"device", LabelText(v.device)},
        {"upper", LabelText(v.upper)},
        {"state", VerdictState(v)},
        {"active", v.raised},
        {"condition", v.condition},
        {"evidence",
         {{"window_seconds", Number(e.window_seconds)},
          {"requests", e.requests},
          {"requests_per_second", Number(e.requests_per_second)},
          {"small_request_ratio", Number(e.small_share)},
          {"missed_merge_ratio", Number(e.missed_share)},
          {"merge_ratio", Number(e.merge_share)},
          {"back_merges_per_second", Number(e.back_merges_per_second)},
          {"mean_request_bytes", Number(e.mean_request_bytes)},
          {"merged_request_bytes", Number(e.merged_request_bytes)},
          {"merged_from_runs", e.runs_reported},
          {"upper", LabelText(e.upper)},
          {"upper_bio_bytes", Number(e.upper_mean_bio_bytes)},
          {"upper_request_ratio", Number(e.upper_request_share)},
          {"text", LabelText(v.evidence_text)}}},
        {"services", ServicesJson(v.services)},
        {"cause", LabelText(v.cause)},
        {"remedy", LabelText(v.remedy)},
    });
  }
  nlohmann::json findings = nlohmann::json::array();
  for (const QueueFinding& f : status.findings) {
    findings.push_back({{"kind", "queue_config"},
                        {"device", LabelText(f.device)},
                        {"finding", LabelText(f.finding)},
                        {"active", true},
                        {"evidence", LabelText(f.evidence)},
                        {"remedy", LabelText(f.remedy)}});
  }
  // The split ticket is a finding of the pair (a ticket, not a page): `mergewatch status` lists it with the
  // queue findings, its evidence sentence naming the upper device, the cause and the piece size.
  for (const DiskVerdict& v : status.verdicts) {
    if (!v.split_raised) continue;
    const CollapseEvidence& e = v.evidence;
    findings.push_back({{"kind", "io_split"},
                        {"device", LabelText(v.device)},
                        {"upper", LabelText(v.upper)},
                        {"finding", "io_split"},
                        {"active", true},
                        {"evidence", LabelText("under " + v.upper + ": " + v.split_evidence_text + ". Cause: " +
                                               v.split_cause)},
                        {"cause", LabelText(v.split_cause)},
                        {"remedy", LabelText(v.split_remedy)},
                        {"upper_bio_bytes", Number(e.upper_mean_bio_bytes)},
                        {"request_bytes", Number(e.mean_request_bytes)},
                        {"requests_per_second", Number(e.requests_per_second)},
                        {"chunk_bytes", v.split_chunk_bytes}});
  }
  nlohmann::json doc = {{"version", LabelText(status.version)}, {"verdicts", verdicts}, {"findings", findings}};
  return doc.dump() + "\n";
}

}  // namespace mergewatch
