// SPDX-License-Identifier: Apache-2.0
// The text a scrape returns: prometheus-cpp's families, written as its TextSerializer writes them
// (by a writer of our own, 15-20 times cheaper: BENCHMARKS.md, "Scrape cost"), with two fixes the
// serializer does not make. Label values must be valid UTF-8 (the text format and Prometheus
// reject a whole scrape otherwise), but dm names may hold any byte but '/' and sysfs
// attributes are bytes. And bucket bounds are written with 16 significant digits
// (le="0.008388608000000001" for 2^23 ns), where Prometheus users type le values as every Go
// exporter prints them: the shortest string that reads back to the same double.
#pragma once

#include <prometheus/metric_family.h>

#include <string>
#include <vector>

#include "text.h"  // LabelText, which the exposition applies to every label value

namespace mergewatch {

// LabelText on every label value of every family.
void MakeLabelsUtf8(std::vector<prometheus::MetricFamily>* families);

// Go's strconv.FormatFloat(v, 'g', -1, 64), which client_golang writes le with: the shortest
// digits that read back to v, in exponent form when the decimal exponent is < -4 or >= 6
// ("8.192e-06", "0.008388608", "4096", "524288", "1.048576e+06"); "+Inf", "-Inf", "NaN".
std::string FormatFloatLikeGo(double value);

// Rewrites every le="..." of the serializer's text with FormatFloatLikeGo.
std::string ShortestBucketBounds(const std::string& text);

// The reference: MakeLabelsUtf8, prometheus-cpp's TextSerializer, ShortestBucketBounds. It defines
// what the exposition is; ExpositionWriter must produce the same bytes (exposition_test.cpp
// compares them on random families). Not used by the daemon: 2.3-3.0 ms of CPU for a 32-device
// scrape where ExpositionWriter takes 0.13-0.16 ms.
std::string RenderExpositionWithTextSerializer(std::vector<prometheus::MetricFamily> families);

// The same text as RenderExpositionWithTextSerializer, written straight into one string: every
// value formatted with std::to_chars rather than through an ostream, each series' label block
// escaped once for all its lines, and each histogram's le strings formatted once per distinct
// set of bounds and thread (the daemon has two: sizes and latencies), not once per scrape. Metric and label names are written
// as given: they must be valid Prometheus names, as every name the daemon uses is.
class ExpositionWriter {
 public:
  // Appends the families' text to *out.
  void Write(const std::vector<prometheus::MetricFamily>& families, std::string* out);

 private:
  void WriteMetric(const prometheus::MetricFamily& family, const prometheus::ClientMetric& metric, std::string* out);
  const std::vector<std::string>& BucketLabels(const std::vector<prometheus::ClientMetric::Bucket>& buckets);

  std::string labels_;  // the current series' label block, without braces
};

// The families as exposition text (ExpositionWriter), in a string with room for `tail_bytes` more
// (text the caller appends).
std::string RenderExposition(const std::vector<prometheus::MetricFamily>& families, size_t tail_bytes = 0);

}  // namespace mergewatch
