// mergewatchd: thin entry point; everything else is in libmergewatch.
#include <cstdio>

#include "config.h"
#include "daemon.h"
#include "exit_codes.h"

int main(int argc, char** argv) {
  mergewatch::ParseResult parsed = mergewatch::ParseFlags(argc, argv);
  if (!parsed.run) {
    fputs(parsed.output.c_str(), parsed.exit_code == mergewatch::kExitOk ? stdout : stderr);
    return parsed.exit_code;
  }
  // Before any thread exists (civetweb's), so only the main loop receives these signals.
  mergewatch::BlockDaemonSignals();
  try {
    return mergewatch::RunDaemon(parsed.config);
  } catch (const std::exception& e) {
    fprintf(stderr, "mergewatchd: fatal: %s\n", e.what());
    return mergewatch::kExitFailure;
  }
}
