#include "exposition.h"

#include <prometheus/text_serializer.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace mergewatch {
namespace {

// Length of the valid UTF-8 sequence starting at s[i] (RFC 3629), or 0 if there is none.
size_t Utf8SequenceLength(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t length;
  unsigned char low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
    if (c == 0xE0) low = 0xA0;   // no overlong forms
    if (c == 0xED) high = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
    if (c == 0xF0) low = 0x90;   // no overlong forms
    if (c == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + length > s.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return length;
}

void AppendHex(unsigned char c, std::string* out) {
  char hex[5];
  snprintf(hex, sizeof(hex), "\\x%02x", c);
  out->append(hex, 4);
}

}  // namespace

std::string LabelText(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    if (bytes[i] == '\\') {
      AppendHex('\\', &out);
      ++i;
      continue;
    }
    const size_t length = Utf8SequenceLength(bytes, i);
    if (length == 0) {
      AppendHex(static_cast<unsigned char>(bytes[i]), &out);
      ++i;
    } else {
      out.append(bytes, i, length);
      i += length;
    }
  }
  return out;
}

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
  const auto sci = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  const std::string scientific(buf, sci.ptr);
  const int exponent = std::atoi(scientific.c_str() + scientific.find('e') + 1);
  // strconv's %g with the shortest precision decides on precision 6 (ftoa.go: "if shortest { eprec = 6 }").
  if (exponent < -4 || exponent >= 6) return scientific;
  const auto fixed = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed);
  return std::string(buf, fixed.ptr);
}

std::string ShortestBucketBounds(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t done = 0;
  // A '"' inside a label value is always written escaped (\"), so le=" only ever starts the
  // le label itself; it follows '{' or ','.
  for (size_t at = text.find("le=\""); at != std::string::npos; at = text.find("le=\"", at + 4)) {
    if (at == 0 || (text[at - 1] != ',' && text[at - 1] != '{')) continue;
    const size_t start = at + 4;
    const size_t end = text.find('"', start);
    if (end == std::string::npos) break;
    const std::string bound = text.substr(start, end - start);
    if (bound == "+Inf") continue;
    char* parsed_end = nullptr;
    const double value = std::strtod(bound.c_str(), &parsed_end);
    if (parsed_end != bound.c_str() + bound.size()) continue;
    out.append(text, done, start - done);
    out += FormatFloatLikeGo(value);
    done = end;
  }
  out.append(text, done, std::string::npos);
  return out;
}

std::string RenderExposition(std::vector<prometheus::MetricFamily> families) {
  MakeLabelsUtf8(&families);
  return ShortestBucketBounds(prometheus::TextSerializer().Serialize(families));
}

}  // namespace mergewatch
