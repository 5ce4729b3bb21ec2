// SPDX-License-Identifier: Apache-2.0
// ExpositionWriter against the reference it replaces: MakeLabelsUtf8 + prometheus-cpp's
// TextSerializer + ShortestBucketBounds. The library defines what is correct; these tests feed both
// the same families, random ones with odd bytes and odd numbers, and require the same bytes.
#include "metrics/exposition.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "metrics/exporter.h"
#include "metrics/self_metrics.h"
#include "metrics/state_metrics.h"

namespace mergewatch {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

class RandomFamilies {
 public:
  explicit RandomFamilies(uint32_t seed) : rng_(seed) {}

  std::vector<MetricFamily> Families() {
    std::vector<MetricFamily> families(Below(6));
    for (MetricFamily& f : families) {
      f.name = Name();
      f.help = Chance(4) ? "" : Text(40);
      f.type = static_cast<MetricType>(Below(5));
      // Most series of a family share their label names and histogram bounds, as the daemon's do.
      const std::vector<std::string> label_names = LabelNames();
      const std::vector<double> bounds = Bounds();
      for (size_t n = Below(Chance(5) ? 0 : 12); n > 0; --n) {
        f.metric.push_back(Metric(f.type, Chance(6) ? LabelNames() : label_names, Chance(6) ? Bounds() : bounds));
      }
    }
    return families;
  }

 private:
  size_t Below(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool Chance(size_t one_in) { return Below(one_in) == 0; }

  std::string Name() {
    static const char kFirst[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:";
    static const char kRest[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:0123456789";
    std::string name(1, kFirst[Below(sizeof(kFirst) - 1)]);
    for (size_t n = Below(20); n > 0; --n) name += kRest[Below(sizeof(kRest) - 1)];
    return name;
  }

  std::vector<std::string> LabelNames() {
    std::vector<std::string> names;
    for (size_t n = Below(5); n > 0; --n) {
      // le and quantile are the names the serializer and the le rewrite treat specially.
      const size_t pick = Below(10);
      names.push_back(pick == 0 ? "le" : pick == 1 ? "quantile" : pick == 2 ? "device" : Name());
      if (names.back().find(':') != std::string::npos) names.back() = "op";  // ':' is for metric names only
    }
    return names;
  }

  // Bytes a label value or help text may hold: plain text, the characters the format escapes,
  // valid UTF-8 of every length, and bytes that are not UTF-8 at all.
  std::string Text(size_t max_pieces) {
    static const std::vector<std::string> kPieces = {
        "a", "nvme0n1", "dm-3", "vg0-lv_snap", " ", "\"", "\\", "\n", ",", "{", "}", "=", "le=\"", ",le=\"1.50\"",
        "{le=\"0x10\"", "le=\"", "\\x5c", "\xff", "\xc3", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x92\xbe", "\xc0\xaf",
        "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80", std::string(1, '\0'), "\t", "#", "1.5", "+Inf", "NaN"};
    std::string text;
    for (size_t n = Below(max_pieces); n > 0; --n) text += kPieces[Below(kPieces.size())];
    return text;
  }

  // A value a user's le label might hold: numbers in any spelling the C library reads, and not.
  std::string LeValue() {
    static const std::vector<std::string> kValues = {"", "1", "1.50", " 2", "2 ", "0x10", "1e400", "-1e-400", "+Inf",
                                                     "-Inf", "inf", "nan", "Nan", "0.1", "1e-05", "abc", "1\"",
                                                     "4\n", "\xff", "1048576", "0.008388608000000001"};
    return kValues[Below(kValues.size())];
  }

  double Value() {
    static const double kValues[] = {0.0,
                                     -0.0,
                                     1.0,
                                     -1.0,
                                     0.1,
                                     1e-5,
                                     1e-4,
                                     123456.0,
                                     1e15,
                                     1e15 - 1,
                                     1e16,
                                     9007199254740993.0,
                                     18446744073709551615.0,
                                     1e300,
                                     -1e300,
                                     std::numeric_limits<double>::min(),
                                     std::numeric_limits<double>::denorm_min(),
                                     std::numeric_limits<double>::max(),
                                     std::numeric_limits<double>::infinity(),
                                     -std::numeric_limits<double>::infinity(),
                                     std::numeric_limits<double>::quiet_NaN(),
                                     0.008388608,
                                     8192 / 1e9,
                                     1048576.0};
    switch (Below(4)) {
      case 0:
        return kValues[Below(sizeof(kValues) / sizeof(kValues[0]))];
      case 1:  // a count, as most of the daemon's values are
        return static_cast<double>(Below(1u << 30));
      case 2: {  // any bit pattern: every exponent, NaN payloads, subnormals
        uint64_t bits = std::uniform_int_distribution<uint64_t>()(rng_);
        double d;
        std::memcpy(&d, &bits, sizeof(d));
        return d;
      }
      default:
        return std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng_), static_cast<int>(Below(120)) - 60);
    }
  }

  uint64_t Count() {
    return Chance(10) ? std::numeric_limits<uint64_t>::max() : std::uniform_int_distribution<uint64_t>()(rng_) >> Below(64);
  }

  std::vector<double> Bounds() {
    std::vector<double> bounds;
    const size_t n = Below(31);
    const int shift = static_cast<int>(Below(40)) - 20;
    const double per_unit = Chance(2) ? 1.0 : 1e9;
    for (size_t i = 0; i < n; ++i)
      bounds.push_back(Chance(8) ? Value() : std::ldexp(1.0, shift + static_cast<int>(i)) / per_unit);
    if (!bounds.empty() && Chance(4)) bounds.back() = std::numeric_limits<double>::infinity();
    return bounds;
  }

  ClientMetric Metric(MetricType type, const std::vector<std::string>& label_names, const std::vector<double>& bounds) {
    ClientMetric m;
    for (const std::string& name : label_names) m.label.push_back({name, name == "le" && Chance(2) ? LeValue() : Text(6)});
    m.counter.value = Value();
    m.gauge.value = Value();
    m.untyped.value = Value();
    if (type == MetricType::Summary) {
      m.summary.sample_count = Count();
      m.summary.sample_sum = Value();
      for (size_t n = Below(4); n > 0; --n) m.summary.quantile.push_back({Value(), Value()});
    }
    if (type == MetricType::Histogram) {
      m.histogram.sample_count = Count();
      m.histogram.sample_sum = Value();
      for (double bound : bounds) m.histogram.bucket.push_back({Count(), bound});
    }
    if (Chance(10)) m.timestamp_ms = static_cast<int64_t>(Count());
    return m;
  }

  std::mt19937_64 rng_;
};

std::string Written(ExpositionWriter* writer, const std::vector<MetricFamily>& families) {
  std::string out;
  writer->Write(families, &out);
  return out;
}

TEST(ExpositionWriter, MatchesTheTextSerializerOnRandomFamilies) {
  // One writer for every round: its bucket label cache must notice every change of bounds.
  ExpositionWriter writer;
  size_t lines = 0;
  for (uint32_t seed = 1; seed <= 3000; ++seed) {
    const std::vector<MetricFamily> families = RandomFamilies(seed).Families();
    const std::string expected = RenderExpositionWithTextSerializer(families);
    const std::string actual = Written(&writer, families);
    ASSERT_EQ(actual, expected) << "seed " << seed;
    for (char c : expected) lines += c == '\n';
  }
  EXPECT_GT(lines, 100000u);  // the rounds did write something
}

TEST(ExpositionWriter, ValuesAreTheSerializersPercent16g) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200000; ++i) {
    uint64_t bits = rng();
    double value;
    std::memcpy(&value, &bits, sizeof(value));
    if (i % 2 == 0) value = static_cast<double>(bits >> (i % 64));  // integers of every size
    if (!std::isfinite(value)) continue;
    char expected[64];
    snprintf(expected, sizeof(expected), "%.16g", value);
    MetricFamily family{"x", "", MetricType::Gauge, {}};
    family.metric.emplace_back();
    family.metric.back().gauge.value = value;
    ExpositionWriter writer;
    ASSERT_EQ(Written(&writer, {family}), std::string("# TYPE x gauge\nx ") + expected + "\n") << bits;
  }
}

TEST(ExpositionWriter, SpecialCasesMatchTheReference) {
  std::vector<MetricFamily> families;
  MetricFamily empty{"mergewatch_empty", "", MetricType::Counter, {}};
  families.push_back(empty);
  MetricFamily h{"h_seconds", "help with {le=\"1.50\"} in it", MetricType::Histogram, {}};
  ClientMetric no_labels;
  no_labels.histogram.sample_count = 3;
  h.metric.push_back(no_labels);  // no buckets: only +Inf
  ClientMetric inf_last;
  inf_last.label = {{"le", "1.50"}, {"device", "latin\xff\\\"\n"}};
  inf_last.histogram.bucket = {{1, -0.0}, {2, 0.0}, {3, std::nan("")}, {4, std::numeric_limits<double>::infinity()}};
  h.metric.push_back(inf_last);
  families.push_back(h);
  ExpositionWriter writer;
  const std::string text = Written(&writer, families);
  EXPECT_EQ(text, RenderExpositionWithTextSerializer(families));
  // What the reference makes of them, spelled out once.
  EXPECT_NE(text.find("# HELP h_seconds help with {le=\"1.5\"} in it\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << text;
  // \xHH is LabelText's, and the serializer escapes its backslash like any other.
  EXPECT_NE(text.find("h_seconds_bucket{le=\"1.5\",device=\"latin\\\\xff\\\\x5c\\\"\\n\",le=\"-0\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(",le=\"NaN\"} 3\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("le=\"+Inf\"} 0"), std::string::npos) << text;  // +Inf was the last bound: not added again
}

// The daemon's own families, as a scrape of 32 devices builds them.
TEST(ExpositionWriter, MatchesTheReferenceOnTheDaemonsFamilies) {
  class Namer final : public DeviceNamer {
   public:
    std::optional<std::string> NameOf(uint32_t major, uint32_t minor, uint64_t) override {
      if (major != 7) return std::nullopt;
      return "loop" + std::to_string(minor);
    }
  } namer;
  Snapshot snap;
  for (uint32_t minor = 0; minor < 32; ++minor)
    for (uint32_t op = 0; op < 2; ++op) {
      mw_dev_stats& s = snap.stats[{7, minor, op}];
      for (int i = 0; i < MW_SIZE_SLOTS; ++i) s.size_slots[i] = (minor * 7 + i * 3) % 5;
      for (int i = 0; i < MW_LAT_SLOTS; ++i) s.latency_slots[i] = (minor + i) % 4;
      for (int i = 0; i < MW_LAT_SLOTS; ++i) s.queue_latency_slots[i] = (minor + i) % 3;
      s.size_sum_bytes = 4096ull * minor;
      s.latency_sum_ns = 123456789ull * minor + 1;
      s.missed_merges = minor;
    }
  snap.programs = {{"block_rq_issue", "tp_btf", true}};
  std::vector<MetricFamily> families = BuildMetricFamilies(snap, namer, DaemonStatus{"1.0", "6.18", 8192});
  for (MetricFamily& f : ProcessFamilies(ProcessStats{12.34, 1 << 20, 1 << 30, 12, 1024, 1.7e9}))
    families.push_back(std::move(f));
  for (MetricFamily& f : CollapseFamilies({DiskVerdict{}})) families.push_back(std::move(f));
  EXPECT_EQ(RenderExposition(families), RenderExpositionWithTextSerializer(families));
}

}  // namespace
}  // namespace mergewatch
