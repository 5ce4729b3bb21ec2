// SPDX-License-Identifier: Apache-2.0
#include "metrics/exposition.h"

#include <prometheus/text_serializer.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <limits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "metrics/float_chars.h"

namespace mergewatch {

void MakeLabelsUtf8(std::vector<prometheus::MetricFamily>* families) {
  // Nearly every value is ASCII without a backslash: those are left alone, no copy.
  const auto plain = [](const std::string& value) {
    for (char c : value)
      if (c == '\\' || static_cast<unsigned char>(c) >= 0x80) return false;
    return true;
  };
  for (prometheus::MetricFamily& family : *families)
    for (prometheus::ClientMetric& metric : family.metric)
      for (prometheus::ClientMetric::Label& label : metric.label)
        if (!plain(label.value)) label.value = LabelText(label.value);
}

std::string FormatFloatLikeGo(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Shortest round-trip digits in exponent form, "d.ddde+XX" (two exponent digits at least, as Go).
  const auto sci = DoubleToChars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  const std::string scientific(buf, sci.ptr);
  const int exponent = std::atoi(scientific.c_str() + scientific.find('e') + 1);
  // strconv's %g with the shortest precision decides on precision 6 (ftoa.go: "if shortest { eprec = 6 }").
  if (exponent < -4 || exponent >= 6) return scientific;
  const auto fixed = DoubleToChars(buf, buf + sizeof(buf), value, std::chars_format::fixed);
  return std::string(buf, fixed.ptr);
}

namespace {

// The reference's rewrite of one le value, as the serializer wrote it: true, with the
// replacement in *shortest, when the whole of `bound` reads as a number ("Nan" and "-Inf" do).
bool ShortestBound(const std::string& bound, std::string* shortest) {
  if (bound == "+Inf") return false;
  char* parsed_end = nullptr;
  const double value = std::strtod(bound.c_str(), &parsed_end);
  if (parsed_end != bound.c_str() + bound.size()) return false;
  *shortest = FormatFloatLikeGo(value);
  return true;
}

}  // namespace

std::string ShortestBucketBounds(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t done = 0;
  std::string shortest;
  // A '"' inside a label value is always written escaped (\"), so le=" only ever starts the
  // le label itself; it follows '{' or ','.
  for (size_t at = text.find("le=\""); at != std::string::npos; at = text.find("le=\"", at + 4)) {
    if (at == 0 || (text[at - 1] != ',' && text[at - 1] != '{')) continue;
    const size_t start = at + 4;
    const size_t end = text.find('"', start);
    if (end == std::string::npos) break;
    if (!ShortestBound(text.substr(start, end - start), &shortest)) continue;
    out.append(text, done, start - done);
    out += shortest;
    done = end;
  }
  out.append(text, done, std::string::npos);
  return out;
}

std::string RenderExpositionWithTextSerializer(std::vector<prometheus::MetricFamily> families) {
  MakeLabelsUtf8(&families);
  return ShortestBucketBounds(prometheus::TextSerializer().Serialize(families));
}

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// TextSerializer's numbers: an ostream in the classic locale with precision 16 (max_digits10 - 1),
// that is printf's %.16g, and its own spellings of the non-finite values.
void AppendDouble(double value, std::string* out) {
  if (std::isnan(value)) {
    out->append("Nan");
    return;
  }
  if (std::isinf(value)) {
    out->append(value < 0 ? "-Inf" : "+Inf");
    return;
  }
  char buf[32];
  // Nearly every value is a count: %.16g prints an integer below 10^16 as its digits, and the
  // integer conversion is several times cheaper. -0 keeps its sign in %.16g, so it goes the long way.
  if (std::fabs(value) < 1e15 && value == std::trunc(value) && !(value == 0 && std::signbit(value))) {
    const auto r = std::to_chars(buf, buf + sizeof(buf), static_cast<int64_t>(value));
    out->append(buf, r.ptr);
    return;
  }
  // to_chars with a format and precision is defined as printf with the same conversion (C++17 [charconv.to.chars]);
  // DoubleToChars is std::to_chars where the C++ library has it for double (metrics/float_chars.h).
  const auto r = DoubleToChars(buf, buf + sizeof(buf), value, std::chars_format::general, 16);
  out->append(buf, r.ptr);
}

void AppendCount(uint64_t value, std::string* out) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), value);
  out->append(buf, r.ptr);
}

// What MakeLabelsUtf8 and then the serializer's escaping make of a label value.
void AppendLabelValue(const std::string& value, std::string* out) {
  bool plain = true;
  for (char c : value)
    if (c == '\\' || c == '"' || c == '\n' || static_cast<unsigned char>(c) >= 0x80) {
      plain = false;
      break;
    }
  if (plain) {
    out->append(value);
    return;
  }
  bool utf8 = true;
  for (char c : value)
    if (c == '\\' || static_cast<unsigned char>(c) >= 0x80) utf8 = false;
  const std::string text = utf8 ? value : LabelText(value);
  for (char c : text) {
    // The backslashes of LabelText's \xHH are escaped like any other: the value Prometheus reads holds \xHH.
    if (c == '\n') {
      out->append("\\n");
    } else {
      if (c == '"' || c == '\\') out->push_back('\\');
      out->push_back(c);
    }
  }
}

// One label as the reference writes it, "name=\"value\"", with its rewrite of any label named le.
void AppendLabel(const std::string& name, const std::string& value, std::string* out) {
  out->append(name);
  out->append("=\"");
  if (name != "le") {
    AppendLabelValue(value, out);
  } else {
    std::string escaped, shortest;
    AppendLabelValue(value, &escaped);
    // An escaped quote ends the reference's le value early, at a backslash no number holds.
    if (escaped.find('"') == std::string::npos && ShortestBound(escaped, &shortest)) {
      out->append(shortest);
    } else {
      out->append(escaped);
    }
  }
  out->push_back('"');
}

// "name_suffix{labels[,extra]} ": the head of one line.
void AppendHead(const std::string& name, const char* suffix, const std::string& labels, const std::string* extra,
                std::string* out) {
  out->append(name);
  out->append(suffix);
  if (!labels.empty() || extra != nullptr) {
    out->push_back('{');
    out->append(labels);
    if (extra != nullptr) {
      if (!labels.empty()) out->push_back(',');
      out->append(*extra);
    }
    out->push_back('}');
  }
  out->push_back(' ');
}

void AppendTail(const ClientMetric& metric, std::string* out) {
  if (metric.timestamp_ms != 0) {
    out->push_back(' ');
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof(buf), metric.timestamp_ms);
    out->append(buf, r.ptr);
  }
  out->push_back('\n');
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::Counter:
      return "counter";
    case MetricType::Gauge:
      return "gauge";
    case MetricType::Summary:
      return "summary";
    case MetricType::Histogram:
      return "histogram";
    case MetricType::Untyped:
      break;
  }
  return "untyped";
}

bool SameBits(const std::vector<double>& a, const std::vector<ClientMetric::Bucket>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i].upper_bound, sizeof(double)) != 0) return false;
  return true;
}

}  // namespace

const std::vector<std::string>& ExpositionWriter::BucketLabels(const std::vector<ClientMetric::Bucket>& buckets) {
  // The shortest form of a bound costs a search (where the C++ library has no std::to_chars for double, as
  // the release build's GCC 10: a dozen snprintf and strtod each): done once per set of bounds and scrape
  // thread, kept for the next scrapes. A few sets at most; a caller with many more starts over.
  struct Formatted {
    std::vector<double> bounds;
    std::vector<std::string> le;
  };
  thread_local std::vector<Formatted> cache;
  for (const Formatted& f : cache)
    if (SameBits(f.bounds, buckets)) return f.le;
  if (cache.size() >= 8) cache.clear();
  Formatted f;
  std::string text, shortest;
  for (const ClientMetric::Bucket& b : buckets) {
    f.bounds.push_back(b.upper_bound);
    text.clear();
    AppendDouble(b.upper_bound, &text);
    std::string label = "le=\"";
    label += ShortestBound(text, &shortest) ? shortest : text;
    label += '"';
    f.le.push_back(std::move(label));
  }
  cache.push_back(std::move(f));
  return cache.back().le;
}

void ExpositionWriter::WriteMetric(const MetricFamily& family, const ClientMetric& metric, std::string* out) {
  labels_.clear();
  for (size_t i = 0; i < metric.label.size(); ++i) {
    if (i > 0) labels_.push_back(',');
    AppendLabel(metric.label[i].name, metric.label[i].value, &labels_);
  }
  const std::string& name = family.name;
  switch (family.type) {
    case MetricType::Counter:
      AppendHead(name, "", labels_, nullptr, out);
      AppendDouble(metric.counter.value, out);
      AppendTail(metric, out);
      break;
    case MetricType::Gauge:
      AppendHead(name, "", labels_, nullptr, out);
      AppendDouble(metric.gauge.value, out);
      AppendTail(metric, out);
      break;
    case MetricType::Untyped:
      AppendHead(name, "", labels_, nullptr, out);
      AppendDouble(metric.untyped.value, out);
      AppendTail(metric, out);
      break;
    case MetricType::Summary: {
      AppendHead(name, "_count", labels_, nullptr, out);
      AppendCount(metric.summary.sample_count, out);
      AppendTail(metric, out);
      AppendHead(name, "_sum", labels_, nullptr, out);
      AppendDouble(metric.summary.sample_sum, out);
      AppendTail(metric, out);
      std::string quantile;
      for (const ClientMetric::Quantile& q : metric.summary.quantile) {
        quantile = "quantile=\"";
        AppendDouble(q.quantile, &quantile);
        quantile += '"';
        AppendHead(name, "", labels_, &quantile, out);
        AppendDouble(q.value, out);
        AppendTail(metric, out);
      }
      break;
    }
    case MetricType::Histogram: {
      const ClientMetric::Histogram& h = metric.histogram;
      AppendHead(name, "_count", labels_, nullptr, out);
      AppendCount(h.sample_count, out);
      AppendTail(metric, out);
      AppendHead(name, "_sum", labels_, nullptr, out);
      AppendDouble(h.sample_sum, out);
      AppendTail(metric, out);
      const std::vector<std::string>& le = BucketLabels(h.bucket);
      for (size_t i = 0; i < h.bucket.size(); ++i) {
        AppendHead(name, "_bucket", labels_, &le[i], out);
        AppendCount(h.bucket[i].cumulative_count, out);
        AppendTail(metric, out);
      }
      // The serializer adds +Inf unless the last bound already is +Inf (no buckets: -Inf, so it does).
      if (h.bucket.empty() || h.bucket.back().upper_bound != std::numeric_limits<double>::infinity()) {
        static const std::string kInf = "le=\"+Inf\"";
        AppendHead(name, "_bucket", labels_, &kInf, out);
        AppendCount(h.sample_count, out);
        AppendTail(metric, out);
      }
      break;
    }
  }
}

void ExpositionWriter::Write(const std::vector<MetricFamily>& families, std::string* out) {
  for (const MetricFamily& family : families) {
    if (!family.help.empty()) {
      std::string line = "# HELP " + family.name + " " + family.help + "\n";
      // The reference rewrites le="..." wherever it appears, the help text included.
      *out += line.find("le=\"") == std::string::npos ? line : ShortestBucketBounds(line);
    }
    out->append("# TYPE ");
    out->append(family.name);
    out->push_back(' ');
    out->append(TypeName(family.type));
    out->push_back('\n');
    for (const ClientMetric& metric : family.metric) WriteMetric(family, metric, out);
  }
}

std::string RenderExposition(const std::vector<MetricFamily>& families, size_t tail_bytes) {
  // The text is about the same size every scrape: one allocation instead of a dozen doublings.
  static std::atomic<size_t> last_size{0};
  std::string out;
  out.reserve(last_size.load(std::memory_order_relaxed) * 9 / 8 + tail_bytes);
  ExpositionWriter().Write(families, &out);
  last_size.store(out.size(), std::memory_order_relaxed);
  return out;
}

}  // namespace mergewatch
