// SPDX-License-Identifier: Apache-2.0
// mergewatchd: thin entry point; everything else is in libmergewatch.
#include <malloc.h>

#include <cstdio>
#include <cstring>

#include "config.h"
#include "daemon.h"
#include "exit_codes.h"
#include "signals.h"
#include "source/bpf_loader.h"

int main(int argc, char** argv) {
  // The BPF loader: this binary started again by the daemon (bpf_loader.h), single-threaded.
  if (argc > 1 && strcmp(argv[1], mergewatch::kLoaderModeFlag) == 0) return mergewatch::RunLoaderMode(argc, argv);
  // One malloc arena: scrapes are serialized by the collector's lock, so per-thread arenas for
  // the HTTP server's threads only kept freed scrape buffers resident (3 MiB more RSS measured
  // with 8 concurrent scrapers of 99 devices, under civetweb's thread-per-connection).
  mallopt(M_ARENA_MAX, 1);
  mergewatch::ParseResult parsed = mergewatch::ParseFlags(argc, argv);
  if (!parsed.run) {
    fputs(parsed.output.c_str(), parsed.exit_code == mergewatch::kExitOk ? stdout : stderr);
    return parsed.exit_code;
  }
  // Before any thread exists (the HTTP server's), so only the main loop receives these signals.
  mergewatch::BlockDaemonSignals();
  try {
    return mergewatch::RunDaemon(parsed.config);
  } catch (const std::exception& e) {
    fprintf(stderr, "mergewatchd: fatal: %s\n", e.what());
    return mergewatch::kExitFailure;
  }
}
