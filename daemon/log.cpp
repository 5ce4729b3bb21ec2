// SPDX-License-Identifier: Apache-2.0
#include "log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include <unistd.h>

#include "text.h"

namespace mergewatch {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kLogfmt)};
std::mutex g_write_mutex;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

// syslog(3) priorities: LOG_DEBUG 7, LOG_INFO 6, LOG_WARNING 4, LOG_ERR 3.
int SyslogPriority(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 7;
    case LogLevel::kInfo: return 6;
    case LogLevel::kWarn: return 4;
    case LogLevel::kError: return 3;
  }
  return 6;
}

// Messages quote sysfs names, which may hold any byte: invalid UTF-8 is written as \xHH the
// way label values are (LabelText), so the journal and log shippers get text.
std::string QuoteLogfmt(const std::string& text) {
  std::string out = "\"";
  for (char c : LabelText(text)) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  out += '"';
  return out;
}

// A JSON string (RFC 8259): the text is valid UTF-8 once LabelText has escaped invalid bytes.
std::string QuoteJson(const std::string& text) {
  std::string out = "\"";
  for (char c : LabelText(text)) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (byte < 0x20 || byte == 0x7f) {
      char escaped[8];
      snprintf(escaped, sizeof(escaped), "\\u%04x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

std::string Timestamp() {
  char stamp[40];
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  size_t n = strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  snprintf(stamp + n, sizeof(stamp) - n, ".%03ldZ", now.tv_nsec / 1000000);
  return stamp;
}

// Appends text to a fixed buffer, truncating at its end (signal-handler use: no allocation).
struct FixedLine {
  char text[512];
  size_t length = 0;
  void Add(const char* part) {
    while (*part != '\0' && length < sizeof(text) - 1) text[length++] = *part++;
  }
  void AddDigits(long value, int width) {
    char digits[24];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value > 0 || n < width);
    while (n > 0 && length < sizeof(text) - 1) text[length++] = digits[--n];
  }
};

// Timestamp() without gmtime_r/strftime, which are not async-signal-safe: days to a civil date by
// Howard Hinnant's days_from_civil inverse (proleptic Gregorian, valid for every time_t after 1970).
void AddTimestamp(FixedLine* line) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const long seconds_of_day = now.tv_sec % 86400;
  long z = now.tv_sec / 86400 + 719468;
  const long era = z / 146097;
  const long day_of_era = z - era * 146097;
  const long year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36524 - day_of_era / 146096) / 365;
  const long day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
  const long mp = (5 * day_of_year + 2) / 153;
  const long day = day_of_year - (153 * mp + 2) / 5 + 1;
  const long month = mp < 10 ? mp + 3 : mp - 9;
  const long year = year_of_era + era * 400 + (month <= 2 ? 1 : 0);
  line->AddDigits(year, 4);
  line->Add("-");
  line->AddDigits(month, 2);
  line->Add("-");
  line->AddDigits(day, 2);
  line->Add("T");
  line->AddDigits(seconds_of_day / 3600, 2);
  line->Add(":");
  line->AddDigits(seconds_of_day / 60 % 60, 2);
  line->Add(":");
  line->AddDigits(seconds_of_day % 60, 2);
  line->Add(".");
  line->AddDigits(now.tv_nsec / 1000000, 3);
  line->Add("Z");
}

}  // namespace

void LogFromSignalHandler(const char* const* message_parts, int part_count) {
  // getenv is not async-signal-safe in general, but only setenv/putenv make it unsafe and the daemon
  // calls neither; Log() reads the same variable.
  const bool to_journal = std::getenv("JOURNAL_STREAM") != nullptr;
  FixedLine line;
  if (g_format == static_cast<int>(LogFormat::kJson)) {
    line.Add("{\"ts\":\"");
    AddTimestamp(&line);
    line.Add("\",\"level\":\"error\",\"msg\":\"");
  } else {
    if (to_journal) {
      line.Add("<3>");
    } else {
      line.Add("ts=");
      AddTimestamp(&line);
      line.Add(" ");
    }
    line.Add("level=error msg=\"");
  }
  for (int i = 0; i < part_count; ++i) line.Add(message_parts[i]);
  line.Add(g_format == static_cast<int>(LogFormat::kJson) ? "\"}\n" : "\"\n");
  ssize_t unused = write(STDERR_FILENO, line.text, line.length);
  (void)unused;
}

bool ParseLogFormat(const std::string& text, LogFormat* format) {
  if (text == "logfmt") {
    *format = LogFormat::kLogfmt;
  } else if (text == "json") {
    *format = LogFormat::kJson;
  } else {
    return false;
  }
  return true;
}

void SetLogFormat(LogFormat format) { g_format = static_cast<int>(format); }
LogFormat CurrentLogFormat() { return static_cast<LogFormat>(g_format.load()); }
LogLevel CurrentLogLevel() { return static_cast<LogLevel>(g_min_level.load()); }

bool ParseLogLevel(const std::string& text, LogLevel* level) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (text == LevelName(l)) {
      *level = l;
      return true;
    }
  }
  return false;
}

void SetLogLevel(LogLevel level) { g_min_level = static_cast<int>(level); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_min_level; }

void Log(LogLevel level, const std::string& message) {
  if (!LogEnabled(level)) return;
  static const bool to_journal = std::getenv("JOURNAL_STREAM") != nullptr;
  std::string line;
  if (g_format == static_cast<int>(LogFormat::kJson)) {
    line = "{\"ts\":\"" + Timestamp() + "\",\"level\":\"" + LevelName(level) + "\",\"msg\":" + QuoteJson(message) +
           "}\n";
  } else {
    line = to_journal ? "<" + std::to_string(SyslogPriority(level)) + ">" : "ts=" + Timestamp() + " ";
    line += std::string("level=") + LevelName(level) + " msg=" + QuoteLogfmt(message) + "\n";
  }
  std::lock_guard<std::mutex> lock(g_write_mutex);
  fputs(line.c_str(), stderr);
  fflush(stderr);
}

}  // namespace mergewatch
