// SPDX-License-Identifier: Apache-2.0
#include "exposition_parser.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace mergewatch::cli {
namespace {

bool NameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
bool NameChar(char c) { return NameStart(c) || std::isdigit(static_cast<unsigned char>(c)); }

// Reads one line (without its '\n') into *sample; false with a reason.
bool ParseLine(const std::string& line, Sample* sample, std::string* why) {
  size_t i = 0;
  const size_t n = line.size();
  auto skip_blanks = [&] {
    while (i < n && (line[i] == ' ' || line[i] == '\t')) ++i;
  };
  skip_blanks();
  if (i == n || !NameStart(line[i])) {
    *why = "expected a metric name";
    return false;
  }
  const size_t name_start = i;
  while (i < n && NameChar(line[i])) ++i;
  sample->name = line.substr(name_start, i - name_start);
  sample->labels.clear();
  const size_t after_name = i;
  skip_blanks();
  if (i == n || line[i] != '{') i = after_name;  // no labels: the blank before the value stays
  if (i < n && line[i] == '{') {
    ++i;
    for (;;) {
      skip_blanks();
      if (i < n && line[i] == '}') {
        ++i;
        break;
      }
      if (i == n || !NameStart(line[i])) {
        *why = "expected a label name or '}'";
        return false;
      }
      const size_t key_start = i;
      while (i < n && NameChar(line[i])) ++i;
      std::string key = line.substr(key_start, i - key_start);
      skip_blanks();
      bool quoted = i < n && line[i] == '=';
      if (quoted) {
        ++i;
        skip_blanks();
        quoted = i < n && line[i] == '"';
      }
      if (!quoted) {
        *why = "expected =\" after label " + key;
        return false;
      }
      ++i;
      std::string value;
      for (;;) {
        if (i == n) {
          *why = "unterminated value of label " + key;
          return false;
        }
        const char c = line[i++];
        if (c == '"') break;
        if (c != '\\') {
          value += c;
          continue;
        }
        if (i == n) {
          *why = "unterminated escape in label " + key;
          return false;
        }
        const char e = line[i++];
        if (e == 'n') value += '\n';
        else if (e == '\\' || e == '"') value += e;
        else {
          *why = std::string("unknown escape \\") + e + " in label " + key;
          return false;
        }
      }
      for (const auto& [k, v] : sample->labels) {
        if (k == key) {
          *why = "label " + key + " given twice";
          return false;
        }
      }
      sample->labels.emplace_back(std::move(key), std::move(value));
      skip_blanks();
      if (i < n && line[i] == ',') {
        ++i;
        continue;
      }
      if (i < n && line[i] == '}') {
        ++i;
        break;
      }
      *why = "expected ',' or '}' in the labels";
      return false;
    }
  }
  if (i == n || (line[i] != ' ' && line[i] != '\t')) {
    *why = "expected a blank and a value after " + sample->name;
    return false;
  }
  skip_blanks();
  const size_t value_start = i;
  while (i < n && line[i] != ' ' && line[i] != '\t') ++i;
  const std::string token = line.substr(value_start, i - value_start);
  if (token == "+Inf" || token == "Inf") sample->value = HUGE_VAL;
  else if (token == "-Inf") sample->value = -HUGE_VAL;
  else if (token == "NaN") sample->value = NAN;
  else {
    // strtod would also take "inf", "0x1p3" and the like, which the format does not have.
    if (token.empty() || token.find_first_not_of("0123456789+-.eE") != std::string::npos) {
      *why = "not a number: \"" + token + "\"";
      return false;
    }
    char* end = nullptr;
    errno = 0;
    sample->value = std::strtod(token.c_str(), &end);
    if (end != token.c_str() + token.size()) {
      *why = "not a number: \"" + token + "\"";
      return false;
    }
  }
  skip_blanks();
  if (i < n) {  // a timestamp: an integer of milliseconds
    const size_t ts_start = i;
    if (line[i] == '-') ++i;
    while (i < n && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
    if (i == ts_start || (line[ts_start] == '-' && i == ts_start + 1)) {
      *why = "unexpected text after the value";
      return false;
    }
    skip_blanks();
    if (i < n) {
      *why = "unexpected text after the timestamp";
      return false;
    }
  }
  return true;
}

}  // namespace

const std::string& Sample::Label(const std::string& key) const {
  static const std::string kNone;
  for (const auto& [k, v] : labels)
    if (k == key) return v;
  return kNone;
}

bool ParseExposition(const std::string& text, std::vector<Sample>* samples, std::string* error) {
  samples->clear();
  size_t start = 0, line_number = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++line_number;
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find('\0') != std::string::npos) {
      *error = "line " + std::to_string(line_number) + ": a NUL byte";
      return false;
    }
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    Sample sample;
    std::string why;
    if (!ParseLine(line, &sample, &why)) {
      *error = "line " + std::to_string(line_number) + ": " + why;
      return false;
    }
    samples->push_back(std::move(sample));
  }
  return true;
}

}  // namespace mergewatch::cli
