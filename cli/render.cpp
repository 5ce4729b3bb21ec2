// SPDX-License-Identifier: Apache-2.0
#include "render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace mergewatch::cli {
namespace {

std::string Printf(const char* format, double v) {
  char buf[64];
  snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string PadLeft(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

// Display width: UTF-8 continuation bytes take no column (the tree drawing is UTF-8).
size_t Columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string PadRight(const std::string& s, size_t width) {
  const size_t w = Columns(s);
  return w >= width ? s : s + std::string(width - w, ' ');
}

// Cut to `width` columns, a '>' marking the cut.
std::string Fit(const std::string& s, size_t width) {
  if (Columns(s) <= width) return s;
  if (width == 0) return "";
  std::string out;
  size_t cols = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) != 0x80) {
      if (cols + 1 == width) break;
      ++cols;
    }
    out += s[i];
  }
  return out + ">";
}

std::string Percent(double share) { return std::isnan(share) ? "-" : Printf("%.0f%%", share * 100); }

std::string NameOf(const DeviceRow& r) { return r.dm_name.empty() ? r.name : r.name + " (" + r.dm_name + ")"; }

std::string Mark(const DeviceRow& r) {
  if (r.collapsed) return "!";
  if (r.pending) return "~";
  if (r.finding) return "?";
  return " ";
}

std::string QueueLine(const DeviceRow& r) {
  std::string s;
  auto add = [&s](const std::string& part) { s += (s.empty() ? "" : ", ") + part; };
  if (r.queue.nomerges >= 0) add("nomerges " + std::to_string(r.queue.nomerges));
  if (!r.queue.scheduler.empty()) add("scheduler " + r.queue.scheduler);
  if (r.queue.max_sectors_kb >= 0) add("max_sectors_kb " + Printf("%.0f", r.queue.max_sectors_kb));
  if (r.queue.rotational >= 0) add("rotational " + std::to_string(r.queue.rotational));
  return s;
}

std::string Distribution(const std::vector<std::pair<double, double>>& shares) {
  // The largest shares first, at most four, then what is left.
  std::vector<std::pair<double, double>> sorted = shares;
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string s;
  double rest = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i >= 4) {
      rest += sorted[i].second;
      continue;
    }
    const std::string bound = std::isfinite(sorted[i].first) ? "<=" + FormatBytes(sorted[i].first) : "larger";
    s += (s.empty() ? "" : "  ") + bound + " " + Percent(sorted[i].second);
  }
  if (rest > 0) s += "  other " + Percent(rest);
  return s;
}

std::string StatusWord(const Verdict& v) {
  if (v.state == "collapsed") return "active";
  if (v.state == "clearing") return "active, clearing (the pattern has stopped; the alert holds for clear-after)";
  if (v.state == "pending") return "pattern seen, not raised yet";
  return v.state;
}

nlohmann::json Num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json HistogramJson(const Histogram& h) {
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& [bound, count] : h.cumulative)
    buckets.push_back({{"le", std::isfinite(bound) ? nlohmann::json(bound) : nlohmann::json("+Inf")}, {"count", count}});
  return {{"count", h.count}, {"sum", h.sum}, {"buckets", buckets}};
}

nlohmann::json CountersJson(const Counters& c) {
  return {{"request_size_bytes", HistogramJson(c.request_size)},
          {"request_latency_seconds", HistogramJson(c.latency)},
          {"bio_size_bytes", HistogramJson(c.bio_size)},
          {"back_merges", c.back_merges},
          {"front_merges", c.front_merges},
          {"missed_merges", c.missed_merges}};
}

nlohmann::json SharesJson(const std::vector<std::pair<double, double>>& shares) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [bound, share] : shares)
    out.push_back({{"le", std::isfinite(bound) ? nlohmann::json(bound) : nlohmann::json("+Inf")}, {"share", share}});
  return out;
}

}  // namespace

std::string FormatBytes(double bytes) {
  if (std::isnan(bytes)) return "-";
  const char* units[] = {"B", "K", "M", "G", "T"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  const bool whole = std::fabs(bytes - std::round(bytes)) < 0.05;
  return Printf(whole || bytes >= 100 ? "%.0f" : "%.1f", bytes) + units[unit];
}

std::string FormatRate(double v) {
  if (std::isnan(v)) return "-";
  if (v < 10 && v != std::floor(v)) return Printf("%.1f", v);
  if (v < 10000) return Printf("%.0f", v);
  if (v < 1e6) return Printf(v < 1e5 ? "%.1fk" : "%.0fk", v / 1e3);
  return Printf("%.1fM", v / 1e6);
}

std::string FormatSeconds(double s) {
  if (std::isnan(s)) return "-";
  if (s < 1e-3) return Printf("%.0fus", s * 1e6);
  if (s < 10e-3) return Printf("%.1fms", s * 1e3);
  if (s < 1) return Printf("%.0fms", s * 1e3);
  return Printf("%.2fs", s);
}

std::string RenderStatus(const View& view, const std::string& url) {
  std::string out = "mergewatch status: " + url + "\n" +
                    (view.version.empty() ? "" : "mergewatchd " + view.version + ", ") + "figures over " +
                    Printf("%.1f", view.seconds) + " s (two scrapes)\n\n";
  if (view.tree.empty()) {
    out += "no block device has I/O data yet\n";
  } else {
    // Wide enough for the deepest tree line and its dm name (lsblk shows them whole), 18 at least so
    // that short names keep the table within 80 columns, 40 at most.
    size_t name_width = 18;
    for (const DeviceRow& r : view.tree) name_width = std::max(name_width, Columns(r.tree_prefix + NameOf(r)));
    name_width = std::min<size_t>(name_width, 40);
    out += "  " + PadRight("DEVICE", name_width) + " " + PadLeft("REQ/S", 7) + " " + PadLeft("REQ SIZE", 8) + " " +
           PadLeft("BIO SIZE", 8) + " " + PadLeft("MERGED/S", 8) + " " + PadLeft("MISSED/S", 8) + " " +
           PadLeft("P50", 6) + " " + PadLeft("P99", 6) + "\n";
    for (const DeviceRow& r : view.tree) {
      out += Mark(r) + " " + PadRight(Fit(r.tree_prefix + NameOf(r), name_width), name_width) + " " +
             PadLeft(r.request_based || r.volume ? FormatRate(r.requests_per_second) : "-", 7) + " " +
             PadLeft(r.request_based || r.volume ? FormatBytes(r.mean_request_bytes) : "-", 8) + " " +
             PadLeft(r.bio_based ? FormatBytes(r.mean_bio_bytes) : "-", 8) + " " +
             PadLeft(r.request_based ? FormatRate(r.merges_per_second) : "-", 8) + " " +
             PadLeft(r.request_based ? FormatRate(r.missed_merges_per_second) : "-", 8) + " " +
             PadLeft(r.request_based || r.volume ? FormatSeconds(r.latency_p50_seconds) : "-", 6) + " " +
             PadLeft(r.request_based || r.volume ? FormatSeconds(r.latency_p99_seconds) : "-", 6) + "\n";
    }
    out += "  ! merge collapse active   ~ pattern seen, not raised yet   ? queue finding\n";

    out += "\nQUEUE SETTINGS\n";
    std::set<std::string> seen;
    for (const DeviceRow& r : view.tree) {
      const std::string q = QueueLine(r);
      if (!q.empty() && seen.insert(r.name).second) out += "  " + r.name + ": " + q + "\n";
    }
    out += "\nSIZES over the interval: requests at each disk, bios at the devices above\n";
    seen.clear();
    for (const DeviceRow& r : view.tree) {
      if (!seen.insert(r.name).second) continue;
      // A source without buckets (diskstats: only +Inf) has counts and sums: the mean is all there is.
      const auto sizes = [&out, &r](const char* what, const std::vector<std::pair<double, double>>& shares, double mean) {
        if (shares.empty()) return;
        const bool bucketless = shares.size() == 1 && !std::isfinite(shares[0].first);
        out += "  " + r.name + " " + what + ": " +
               (bucketless ? "mean " + FormatBytes(mean) + " (this source has no size buckets)" : Distribution(shares)) +
               "\n";
      };
      sizes("requests", r.request_sizes, r.mean_request_bytes);
      sizes("bios", r.bio_sizes, r.mean_bio_bytes);
    }
  }

  bool any = false;
  for (const Verdict& v : view.verdicts) {
    if (!v.active && v.state != "pending") continue;
    any = true;
    out += "\nMERGE COLLAPSE on " + v.device + (v.upper.empty() ? "" : " (under " + v.upper + ")") + ": " +
           StatusWord(v) + "\n";
    if (!v.evidence.empty()) out += "  evidence: " + v.evidence + "\n";
    if (!v.cause.empty()) out += "  cause:    " + v.cause + "\n";
    if (!v.remedy.empty()) out += "  remedy:   " + v.remedy + "\n";
    if (!v.services.empty()) out += "  from:     " + v.services + "\n";
    if (v.cause.empty() && v.remedy.empty())
      out += "  (this mergewatchd serves no /status: the cause and remedy are in its log)\n";
  }
  for (const Finding& f : view.findings) {
    any = true;
    out += "\nQUEUE FINDING on " + f.device + ": " + f.finding + "\n";
    if (!f.evidence.empty()) out += "  evidence: " + f.evidence + "\n";
    if (!f.remedy.empty()) out += "  remedy:   " + f.remedy + "\n";
  }
  if (!any) out += "\nno merge collapse and no queue finding active\n";
  return out;
}

std::string RenderJson(const View& view, const std::string& url, int exit_status) {
  nlohmann::json devices = nlohmann::json::array();
  std::set<std::string> seen;
  std::map<std::string, std::vector<std::string>> parents;
  for (const DeviceRow& r : view.tree)
    for (const std::string& h : r.holders) parents[h].push_back(r.name);
  for (const DeviceRow& r : view.tree) {
    if (!seen.insert(r.name).second) continue;  // a device on two disks shows twice in the tree
    nlohmann::json queue = nlohmann::json::object();
    if (r.queue.nomerges >= 0) queue["nomerges"] = r.queue.nomerges;
    if (!r.queue.scheduler.empty()) queue["scheduler"] = r.queue.scheduler;
    if (r.queue.max_sectors_kb >= 0) queue["max_sectors_kb"] = r.queue.max_sectors_kb;
    if (r.queue.rotational >= 0) queue["rotational"] = r.queue.rotational;
    devices.push_back({
        {"name", r.name},
        {"kind", r.kind},
        {"dm_name", r.dm_name},
        {"holders", r.holders},
        {"slaves", parents[r.name]},
        {"queue", queue},
        {"collapsed", r.collapsed},
        {"rates",
         {{"requests_per_second", Num(r.requests_per_second)},
          {"mean_request_bytes", Num(r.mean_request_bytes)},
          {"bios_per_second", Num(r.bios_per_second)},
          {"mean_bio_bytes", Num(r.mean_bio_bytes)},
          {"merges_per_second", Num(r.merges_per_second)},
          {"missed_merges_per_second", Num(r.missed_merges_per_second)},
          {"missed_merge_ratio", Num(r.missed_merge_ratio)},
          {"latency_p50_seconds", Num(r.latency_p50_seconds)},
          {"latency_p99_seconds", Num(r.latency_p99_seconds)}}},
        {"request_sizes", SharesJson(r.request_sizes)},
        {"bio_sizes", SharesJson(r.bio_sizes)},
        {"counters", {{"before", CountersJson(r.before)}, {"after", CountersJson(r.after)}}},
    });
  }
  nlohmann::json verdicts = nlohmann::json::array();
  for (const Verdict& v : view.verdicts) {
    if (!v.raw.is_null()) {
      verdicts.push_back(v.raw);
    } else {
      verdicts.push_back({{"kind", v.kind}, {"device", v.device}, {"upper", v.upper}, {"state", v.state},
                          {"active", v.active}, {"cause", v.cause}, {"remedy", v.remedy}});
    }
  }
  nlohmann::json findings = nlohmann::json::array();
  for (const Finding& f : view.findings) findings.push_back(f.raw.is_null() ? nlohmann::json{{"device", f.device}} : f.raw);
  nlohmann::json doc = {{"url", url},
                        {"version", view.version},
                        {"interval_seconds", view.seconds},
                        {"exit_status", exit_status},
                        {"devices", devices},
                        {"verdicts", verdicts},
                        {"findings", findings}};
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

namespace {

// mergewatch top's columns after DEVICE; a narrow terminal drops them by drop_order, highest first.
struct TopColumn {
  const char* title;
  size_t width;
  int drop_order;
  std::string (*cell)(const DeviceRow&);
  bool left = false;  // words, not figures
};
const TopColumn kTopColumns[] = {
    {"REQ/S", 7, 0, [](const DeviceRow& r) { return r.request_based || r.volume ? FormatRate(r.requests_per_second) : "-"; }},
    {"REQSZ", 6, 3, [](const DeviceRow& r) { return r.request_based || r.volume ? FormatBytes(r.mean_request_bytes) : "-"; }},
    {"BIOSZ", 6, 5, [](const DeviceRow& r) { return r.bio_based ? FormatBytes(r.mean_bio_bytes) : "-"; }},
    {"MERGE/S", 7, 4, [](const DeviceRow& r) { return r.request_based ? FormatRate(r.merges_per_second) : "-"; }},
    {"MISS/S", 7, 1, [](const DeviceRow& r) { return r.request_based ? FormatRate(r.missed_merges_per_second) : "-"; }},
    {"P50", 6, 6, [](const DeviceRow& r) { return r.request_based || r.volume ? FormatSeconds(r.latency_p50_seconds) : "-"; }},
    {"P99", 6, 2, [](const DeviceRow& r) { return r.request_based || r.volume ? FormatSeconds(r.latency_p99_seconds) : "-"; }},
    {"NM", 2, 7, [](const DeviceRow& r) { return r.queue.nomerges >= 0 ? std::to_string(r.queue.nomerges) : "-"; }},
    {"SCHED", 11, 8, [](const DeviceRow& r) { return r.queue.scheduler.empty() ? "-" : r.queue.scheduler; }, true},
};
constexpr size_t kTopNameWidth = 10, kTopColumnCount = sizeof(kTopColumns) / sizeof(kTopColumns[0]);

// Which columns fit in `width`: dropped by drop_order, highest first, until the row fits.
std::vector<bool> TopColumnsShown(int width) {
  std::vector<bool> shown(kTopColumnCount, true);
  auto total = [&] {
    size_t w = 2 + kTopNameWidth;
    for (size_t i = 0; i < kTopColumnCount; ++i)
      if (shown[i]) w += 1 + kTopColumns[i].width;
    return w;
  };
  for (int order = 8; order >= 1 && total() > static_cast<size_t>(width); --order)
    for (size_t i = 0; i < kTopColumnCount; ++i)
      if (kTopColumns[i].drop_order == order) shown[i] = false;
  return shown;
}

// One line of the table: `first` under DEVICE, then the shown columns' cells (or titles).
template <typename CellText>
std::string TopLine(const std::string& first, const std::vector<bool>& shown, CellText text) {
  std::string line = first;
  for (size_t i = 0; i < kTopColumnCount; ++i)
    if (shown[i])
      line += " " + (kTopColumns[i].left ? PadRight(text(kTopColumns[i]), kTopColumns[i].width)
                                         : PadLeft(text(kTopColumns[i]), kTopColumns[i].width));
  return line;
}

// One row per device (the tree repeats a device built on two disks), busiest first.
std::vector<const DeviceRow*> DevicesBusiestFirst(const View& view) {
  std::vector<const DeviceRow*> rows;
  std::set<std::string> seen;
  for (const DeviceRow& r : view.tree)
    if (seen.insert(r.name).second) rows.push_back(&r);
  std::stable_sort(rows.begin(), rows.end(), [](const DeviceRow* a, const DeviceRow* b) {
    const double ra = a->request_based ? a->requests_per_second : a->bios_per_second;
    const double rb = b->request_based ? b->requests_per_second : b->bios_per_second;
    return ra > rb;
  });
  return rows;
}

// What is active, for below the table.
std::vector<std::string> TopNotes(const View& view, size_t w) {
  std::vector<std::string> notes;
  for (const Verdict& v : view.verdicts) {
    if (!v.active) continue;
    notes.push_back(Fit("! COLLAPSE " + v.device + (v.upper.empty() ? "" : " under " + v.upper) + ": " +
                            (v.cause.empty() ? v.state : v.cause),
                        w));
    if (!v.remedy.empty()) notes.push_back(Fit("  remedy: " + v.remedy, w));
    if (!v.services.empty()) notes.push_back(Fit("  from: " + v.services, w));
  }
  for (const Finding& f : view.findings) {
    notes.push_back(Fit("? FINDING " + f.device + ": " + f.finding + (f.evidence.empty() ? "" : ": " + f.evidence), w));
    if (!f.remedy.empty()) notes.push_back(Fit("  remedy: " + f.remedy, w));
  }
  if (notes.empty()) notes.push_back("no merge collapse and no queue finding active");
  return notes;
}

}  // namespace

std::vector<std::string> RenderTop(const View& view, const std::string& title, int width, int height) {
  std::vector<std::string> lines;
  if (width < kTopMinWidth || height < 3) {
    lines.push_back(Fit("terminal too narrow: " + std::to_string(width) + "x" + std::to_string(height) +
                            ", mergewatch top needs " + std::to_string(kTopMinWidth) + "x3",
                        static_cast<size_t>(std::max(width, 1))));
    return lines;
  }
  const std::vector<bool> shown = TopColumnsShown(width);
  const size_t w = static_cast<size_t>(width);
  lines.push_back(Fit(title, w));
  // Said first, where it cannot be cut off: what the narrow screen leaves out.
  std::string hidden;
  for (size_t i = 0; i < kTopColumnCount; ++i)
    if (!shown[i]) hidden += std::string(hidden.empty() ? "" : " ") + kTopColumns[i].title;
  if (!hidden.empty()) lines.push_back(Fit("narrow terminal, hidden: " + hidden + " (80 columns show all)", w));
  lines.push_back(Fit(TopLine("  " + PadRight("DEVICE", kTopNameWidth), shown,
                              [](const TopColumn& c) { return std::string(c.title); }),
                      w));

  const std::vector<const DeviceRow*> rows = DevicesBusiestFirst(view);
  // The notes must stay on screen: their room is kept first, the rows get the rest.
  const std::vector<std::string> notes = TopNotes(view, w);
  const size_t h = static_cast<size_t>(height);
  const size_t room_for_notes = std::min(notes.size() + 1, h > 4 ? h - 4 : 0);
  const size_t room_for_rows = h - lines.size() - room_for_notes;
  size_t n = 0;
  for (const DeviceRow* r : rows) {
    if (n + 1 == room_for_rows && rows.size() > room_for_rows) {
      lines.push_back(Fit("  ... " + std::to_string(rows.size() - n) + " more devices", w));
      break;
    }
    if (n >= room_for_rows) break;
    lines.push_back(Fit(TopLine(Mark(*r) + " " + PadRight(Fit(r->name, kTopNameWidth), kTopNameWidth), shown,
                                [r](const TopColumn& c) { return c.cell(*r); }),
                        w));
    ++n;
  }
  if (rows.empty()) lines.push_back(kNoDevices);
  if (room_for_notes > 0) {
    lines.push_back("");
    for (size_t i = 0; i + 1 < room_for_notes && i < notes.size(); ++i) lines.push_back(notes[i]);
  }
  if (lines.size() > h) lines.resize(h);
  return lines;
}

}  // namespace mergewatch::cli
