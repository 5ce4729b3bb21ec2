// SPDX-License-Identifier: Apache-2.0
#include "metrics/float_chars.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mergewatch {
namespace float_chars_internal {
namespace {

std::to_chars_result Put(char* first, char* last, const std::string& text) {
  if (text.size() > static_cast<size_t>(last - first)) return {last, std::errc::value_too_large};
  std::memcpy(first, text.data(), text.size());
  return {first + text.size(), std::errc()};
}

// A decimal significand d.ddd (no point, no sign, first digit not 0 unless the value is 0) and the
// power of ten of its first digit.
struct Decimal {
  std::string digits;
  int exponent = 0;
};

double Parse(const Decimal& d) {
  std::string text = d.digits.substr(0, 1) + "." + d.digits.substr(1) + "e" + std::to_string(d.exponent);
  return std::strtod(text.c_str(), nullptr);
}

// `d` moved by one unit of its last digit up (+1) or down (-1), carries and borrows included.
Decimal Step(Decimal d, int direction) {
  std::string& s = d.digits;
  int i = static_cast<int>(s.size()) - 1;
  if (direction > 0) {
    while (i >= 0 && s[i] == '9') s[i--] = '0';
    if (i >= 0) {
      ++s[i];
    } else {  // 9.99 -> 10.00: one digit more in front, the same count of digits
      s.insert(s.begin(), '1');
      s.pop_back();
      ++d.exponent;
    }
  } else {
    while (i >= 0 && s[i] == '0') s[i--] = '9';
    if (i >= 0) --s[i];
    if (s[0] == '0' && s.size() > 1) {  // 1.00 -> 0.99: 9.9 one power of ten down, the last digit a 9
      s.erase(s.begin());
      s.push_back('9');
      --d.exponent;
    }
  }
  return d;
}

// The shortest significand that reads back as `value` (> 0, finite), the one nearest to it where two
// of that length do, as std::to_chars (Ryu) picks. printf's %.*e rounds correctly to each length; where
// that rounding falls just outside the values that read back (next to a power of two, whose lower
// neighbour is closer than its upper one), the next decimal of the same length may still be inside.
Decimal Shortest(double value) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, value);
    Decimal d;
    const char* e = std::strchr(buf, 'e');
    for (const char* p = buf; p < e; ++p)
      if (*p != '.') d.digits += *p;
    d.exponent = std::atoi(e + 1);
    if (Parse(d) == value) return d;
    for (int direction : {+1, -1}) {
      const Decimal next = Step(d, direction);
      if (next.digits.size() == d.digits.size() && next.digits[0] != '0' && Parse(next) == value) return next;
    }
  }
  // 17 significant digits always read back (max_digits10); not reached.
  std::snprintf(buf, sizeof(buf), "%.16e", value);
  Decimal d;
  const char* e = std::strchr(buf, 'e');
  for (const char* p = buf; p < e; ++p)
    if (*p != '.') d.digits += *p;
  d.exponent = std::atoi(e + 1);
  return d;
}

}  // namespace

std::to_chars_result ShortestWithPrintf(char* first, char* last, double value, std::chars_format format) {
  std::string out;
  if (std::signbit(value)) out += '-';
  if (std::isnan(value)) return Put(first, last, out + "nan");
  if (std::isinf(value)) return Put(first, last, out + "inf");
  const double magnitude = std::fabs(value);
  Decimal d;
  if (magnitude == 0) {
    d.digits = "0";
  } else {
    d = Shortest(magnitude);
  }
  while (d.digits.size() > 1 && d.digits.back() == '0') d.digits.pop_back();
  if (format == std::chars_format::scientific) {
    out += d.digits[0];
    if (d.digits.size() > 1) out += "." + d.digits.substr(1);
    char exponent[16];
    std::snprintf(exponent, sizeof(exponent), "e%c%02d", d.exponent < 0 ? '-' : '+', std::abs(d.exponent));
    return Put(first, last, out + exponent);
  }
  if (format != std::chars_format::fixed) return {last, std::errc::invalid_argument};
  const int digits = static_cast<int>(d.digits.size());
  if (d.exponent < 0) {
    out += "0." + std::string(static_cast<size_t>(-d.exponent - 1), '0') + d.digits;
  } else if (d.exponent + 1 >= digits) {
    out += d.digits + std::string(static_cast<size_t>(d.exponent + 1 - digits), '0');
  } else {
    out += d.digits.substr(0, static_cast<size_t>(d.exponent + 1)) + "." +
           d.digits.substr(static_cast<size_t>(d.exponent + 1));
  }
  return Put(first, last, out);
}

}  // namespace float_chars_internal

#ifdef __cpp_lib_to_chars

std::to_chars_result DoubleToChars(char* first, char* last, double value, std::chars_format format) {
  return std::to_chars(first, last, value, format);
}

std::to_chars_result DoubleToChars(char* first, char* last, double value, std::chars_format format, int precision) {
  return std::to_chars(first, last, value, format, precision);
}

#else

std::to_chars_result DoubleToChars(char* first, char* last, double value, std::chars_format format) {
  return float_chars_internal::ShortestWithPrintf(first, last, value, format);
}

std::to_chars_result DoubleToChars(char* first, char* last, double value, std::chars_format format, int precision) {
  const char* conversion = format == std::chars_format::scientific ? "%.*e"
                           : format == std::chars_format::fixed    ? "%.*f"
                           : format == std::chars_format::general  ? "%.*g"
                                                                   : nullptr;
  if (conversion == nullptr) return {last, std::errc::invalid_argument};
  // The process never calls setlocale(): printf's numbers are the C locale's, as to_chars's.
  const int n = std::snprintf(first, static_cast<size_t>(last - first), conversion, precision, value);
  if (n < 0 || n >= last - first) return {last, std::errc::value_too_large};
  return {first + n, std::errc()};
}

#endif

}  // namespace mergewatch
