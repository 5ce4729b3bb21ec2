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

// One line of the text format (without its '\n'), read left to right: each step consumes its part or says
// why it cannot.
class LineReader {
 public:
  explicit LineReader(const std::string& line) : line_(line) {}

  bool Read(Sample* sample, std::string* why) {
    SkipBlanks();
    if (!ReadName(&sample->name)) {
      *why = "expected a metric name";
      return false;
    }
    sample->labels.clear();
    const size_t after_name = i_;
    SkipBlanks();
    if (At('{')) {
      ++i_;
      if (!ReadLabels(&sample->labels, why)) return false;
    } else {
      i_ = after_name;  // no labels: the blank before the value stays
    }
    if (!At(' ') && !At('\t')) {
      *why = "expected a blank and a value after " + sample->name;
      return false;
    }
    SkipBlanks();
    if (!ReadValue(&sample->value, why)) return false;
    SkipBlanks();
    return AtEnd() || ReadTimestamp(why);
  }

 private:
  bool AtEnd() const { return i_ == line_.size(); }
  bool At(char c) const { return i_ < line_.size() && line_[i_] == c; }
  void SkipBlanks() {
    while (At(' ') || At('\t')) ++i_;
  }

  bool ReadName(std::string* name) {
    if (AtEnd() || !NameStart(line_[i_])) return false;
    const size_t start = i_;
    while (!AtEnd() && NameChar(line_[i_])) ++i_;
    *name = line_.substr(start, i_ - start);
    return true;
  }

  // After the '{': label="value" pairs up to and including the '}'.
  bool ReadLabels(std::vector<std::pair<std::string, std::string>>* labels, std::string* why) {
    SkipBlanks();
    if (At('}')) {
      ++i_;
      return true;
    }
    for (;;) {
      std::string key, value;
      if (!ReadName(&key)) {
        *why = "expected a label name or '}'";
        return false;
      }
      SkipBlanks();
      bool quoted = At('=');
      if (quoted) {
        ++i_;
        SkipBlanks();
        quoted = At('"');
      }
      if (!quoted) {
        *why = "expected =\" after label " + key;
        return false;
      }
      ++i_;
      if (!ReadQuoted(key, &value, why)) return false;
      for (const auto& [k, v] : *labels) {
        if (k == key) {
          *why = "label " + key + " given twice";
          return false;
        }
      }
      labels->emplace_back(std::move(key), std::move(value));
      SkipBlanks();
      const bool comma = At(',');
      if (comma) {
        ++i_;
        SkipBlanks();
      }
      if (At('}')) {  // after a label, or after a trailing comma
        ++i_;
        return true;
      }
      if (!comma) {
        *why = "expected ',' or '}' in the labels";
        return false;
      }
    }
  }

  // After the opening '"': the label's value up to and including the closing '"', unescaped.
  bool ReadQuoted(const std::string& key, std::string* value, std::string* why) {
    for (;;) {
      if (AtEnd()) {
        *why = "unterminated value of label " + key;
        return false;
      }
      const char c = line_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        *value += c;
        continue;
      }
      if (AtEnd()) {
        *why = "unterminated escape in label " + key;
        return false;
      }
      const char e = line_[i_++];
      if (e == 'n') {
        *value += '\n';
      } else if (e == '\\' || e == '"') {
        *value += e;
      } else {
        *why = std::string("unknown escape \\") + e + " in label " + key;
        return false;
      }
    }
  }

  bool ReadValue(double* value, std::string* why) {
    const size_t start = i_;
    while (!AtEnd() && !At(' ') && !At('\t')) ++i_;
    const std::string token = line_.substr(start, i_ - start);
    if (token == "+Inf" || token == "Inf") {
      *value = HUGE_VAL;
      return true;
    }
    if (token == "-Inf") {
      *value = -HUGE_VAL;
      return true;
    }
    if (token == "NaN") {
      *value = NAN;
      return true;
    }
    // strtod would also take "inf", "0x1p3" and the like, which the format does not have.
    char* end = nullptr;
    if (!token.empty() && token.find_first_not_of("0123456789+-.eE") == std::string::npos) {
      errno = 0;
      *value = std::strtod(token.c_str(), &end);
    }
    if (end != token.c_str() + token.size() || token.empty()) {
      *why = "not a number: \"" + token + "\"";
      return false;
    }
    return true;
  }

  // A timestamp: an integer of milliseconds, and nothing after it.
  bool ReadTimestamp(std::string* why) {
    const size_t start = i_;
    if (At('-')) ++i_;
    while (!AtEnd() && std::isdigit(static_cast<unsigned char>(line_[i_]))) ++i_;
    if (i_ == start || (line_[start] == '-' && i_ == start + 1)) {
      *why = "unexpected text after the value";
      return false;
    }
    SkipBlanks();
    if (!AtEnd()) {
      *why = "unexpected text after the timestamp";
      return false;
    }
    return true;
  }

  const std::string& line_;
  size_t i_ = 0;
};

bool ParseLine(const std::string& line, Sample* sample, std::string* why) {
  return LineReader(line).Read(sample, why);
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
