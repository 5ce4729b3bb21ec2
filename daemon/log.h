// SPDX-License-Identifier: Apache-2.0
// Logging to stderr in a form journald keeps levels for.
//
// Under systemd (JOURNAL_STREAM set) every line starts with a "<N>" syslog priority
// prefix, which journald turns into the entry's PRIORITY; on a terminal or in a file
// each line carries a timestamp instead. The body is logfmt, like Prometheus exporters.
#pragma once

#include <string>

namespace mergewatch {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Parses "debug", "info", "warn", "error"; false on anything else.
bool ParseLogLevel(const std::string& text, LogLevel* level);

// --log.format: logfmt (above) or json, one whole JSON object per line
// ({"ts":"...","level":"info","msg":"..."}), never with the journald "<N>" prefix in front, so every
// line parses as JSON wherever it lands (a log shipper reading the journal or a file).
enum class LogFormat { kLogfmt, kJson };
bool ParseLogFormat(const std::string& text, LogFormat* format);
void SetLogFormat(LogFormat format);

void SetLogLevel(LogLevel level);
// What SetLogLevel and SetLogFormat last set (the BPF loader process is started with the same).
LogLevel CurrentLogLevel();
LogFormat CurrentLogFormat();
bool LogEnabled(LogLevel level);

// Writes one line: level=<l> msg="<message>" (message quoted and escaped for logfmt).
void Log(LogLevel level, const std::string& message);

// The error line for a fatal signal, from its handler: async-signal-safe (no allocation, no lock, no stdio),
// in the same format as Log() (logfmt or json, the journald prefix or a timestamp). `message` is plain
// text without quotes, backslashes or control bytes, so it needs no escaping in either format.
void LogFromSignalHandler(const char* const* message_parts, int part_count);

inline void LogDebug(const std::string& m) { Log(LogLevel::kDebug, m); }
inline void LogInfo(const std::string& m) { Log(LogLevel::kInfo, m); }
inline void LogWarn(const std::string& m) { Log(LogLevel::kWarn, m); }
inline void LogError(const std::string& m) { Log(LogLevel::kError, m); }

}  // namespace mergewatch
