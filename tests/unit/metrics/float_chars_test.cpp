// SPDX-License-Identifier: Apache-2.0
// DoubleToChars's fallback (snprintf and strtod, for C++ libraries without std::to_chars for double:
// GCC 10's, which the release binaries are built with) against std::to_chars itself, where the
// library building the tests has it: the same text for every value tried.
#include "metrics/float_chars.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using mergewatch::float_chars_internal::ShortestWithPrintf;

std::string Fallback(double value, std::chars_format format) {
  char buf[400];
  const auto r = ShortestWithPrintf(buf, buf + sizeof(buf), value, format);
  EXPECT_EQ(r.ec, std::errc());
  return std::string(buf, r.ptr);
}

TEST(DoubleToChars, FallbackSpellsKnownValues) {
  EXPECT_EQ(Fallback(0.0, std::chars_format::scientific), "0e+00");
  EXPECT_EQ(Fallback(-0.0, std::chars_format::fixed), "-0");
  EXPECT_EQ(Fallback(0.1, std::chars_format::scientific), "1e-01");
  EXPECT_EQ(Fallback(1.5e-7, std::chars_format::scientific), "1.5e-07");
  EXPECT_EQ(Fallback(123456.0, std::chars_format::fixed), "123456");
  EXPECT_EQ(Fallback(0.00025, std::chars_format::fixed), "0.00025");
  EXPECT_EQ(Fallback(2.5, std::chars_format::fixed), "2.5");
  EXPECT_EQ(Fallback(1e300, std::chars_format::scientific), "1e+300");
  EXPECT_EQ(Fallback(5e-324, std::chars_format::scientific), "5e-324");
  EXPECT_EQ(Fallback(std::numeric_limits<double>::max(), std::chars_format::scientific), "1.7976931348623157e+308");
  EXPECT_EQ(Fallback(-std::numeric_limits<double>::infinity(), std::chars_format::scientific), "-inf");
}

TEST(DoubleToChars, WithPrecisionIsPrintf) {
  char buf[64];
  for (double value : {0.0, 1.0, 0.1, 1e16, 123456789.125, -2.5e-9, 1.0 / 3}) {
    const auto r = mergewatch::DoubleToChars(buf, buf + sizeof(buf), value, std::chars_format::general, 16);
    char expected[64];
    std::snprintf(expected, sizeof(expected), "%.16g", value);
    EXPECT_EQ(std::string(buf, r.ptr), expected);
  }
}

#ifdef __cpp_lib_to_chars
std::string Library(double value, std::chars_format format) {
  char buf[400];
  const auto r = std::to_chars(buf, buf + sizeof(buf), value, format);
  return std::string(buf, r.ptr);
}

uint64_t Bits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

void ExpectSame(double value) {
  ASSERT_EQ(Fallback(value, std::chars_format::scientific), Library(value, std::chars_format::scientific))
      << "bits " << std::hex << Bits(value);
  // Fixed: where FormatFloatLikeGo uses it (10^-5 < |value| < 10^6), and up to 2^53, where every
  // integer is a double and the shortest digits followed by zeros are the integer itself.
  if (std::fabs(value) < 9007199254740992.0) {
    ASSERT_EQ(Fallback(value, std::chars_format::fixed), Library(value, std::chars_format::fixed))
        << "bits " << std::hex << Bits(value);
  }
}

TEST(DoubleToChars, FallbackMatchesStdToCharsOnPowersOfTwoAndTheirNeighbours) {
  // Next to a power of two the lower neighbour is twice as close as the upper one: where the
  // correctly rounded decimal of a length does not read back but the next one does.
  for (int e = -1074; e <= 1023; ++e) {
    const double p = std::ldexp(1.0, e);
    ExpectSame(p);
    ExpectSame(std::nextafter(p, 0.0));
    ExpectSame(std::nextafter(p, INFINITY));
  }
}

TEST(DoubleToChars, FallbackMatchesStdToCharsOnDecimalsAndIntegers) {
  for (int i = -20000; i <= 20000; ++i) {
    ExpectSame(i / 1000.0);
    ExpectSame(i * 1e-7);
    ExpectSame(static_cast<double>(i) * 97);
  }
  for (double value : {0.0, -0.0, 1e22, 1e23, 9007199254740993.0, 5e-324, 2.2250738585072014e-308,
                       std::numeric_limits<double>::max(), 0.3, 2.0 / 3, 1e-5, 9.999999999999999e-5, 999999.9999999999})
    ExpectSame(value);
}

TEST(DoubleToChars, FallbackMatchesStdToCharsOnRandomBitPatterns) {
  std::mt19937_64 random(20261127);
  // MERGEWATCH_FLOAT_CHARS_SAMPLES=N tries N instead (5,000,000 passed, 2026-11-27).
  const char* samples = std::getenv("MERGEWATCH_FLOAT_CHARS_SAMPLES");
  const long count = samples != nullptr ? std::atol(samples) : 20000;
  for (long i = 0; i < count; ++i) {
    uint64_t bits = random();
    double value;
    std::memcpy(&value, &bits, sizeof(value));
    if (!std::isfinite(value)) continue;
    ExpectSame(value);
  }
}
#endif

}  // namespace
