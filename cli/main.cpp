// SPDX-License-Identifier: Apache-2.0
// mergewatch: the on-call view of what mergewatchd sees. The I/O (HTTP, the terminal, the clock)
// is here; what is computed and printed is in the pure parts beside it.
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "device_view.h"
#include "exposition_parser.h"
#include "http_client.h"
#include "metrics/metric_names.h"
#include "options.h"
#include "render.h"
#include "status_doc.h"

namespace mergewatch::cli {
namespace {

constexpr int kExitUnusable = 2;

struct Reading {
  ScrapeFacts facts;
  StatusDoc status;
  std::chrono::steady_clock::time_point taken;
};

std::string HttpHint(long status) {
  if (status == 401) return " (basic auth: --user with --password-file, or basic_auth in --config)";
  if (status == 403) return " (the daemon wants a client certificate: --cert-file and --key-file)";
  if (status == 404) return " (is the telemetry path right? give it in --url, like http://host:9863/path)";
  return "";
}

// The scrape and /status; false with one line saying why the answer cannot be used.
bool Read(const CommandLine& c, Reading* reading, std::string* why) {
  const std::string metrics_url = c.endpoint.base + c.endpoint.telemetry_path;
  Response metrics = Get(metrics_url, c.client);
  reading->taken = std::chrono::steady_clock::now();
  if (metrics.status == 0) {
    *why = "cannot reach mergewatchd at " + metrics_url + ": " + metrics.error;
    return false;
  }
  if (metrics.status != 200) {
    *why = metrics_url + " answered HTTP " + std::to_string(metrics.status) + HttpHint(metrics.status);
    return false;
  }
  std::vector<Sample> samples;
  std::string error;
  if (!ParseExposition(metrics.body, &samples, &error)) {
    *why = metrics_url + " answered something that is not a Prometheus exposition: " + error;
    return false;
  }
  bool ours = false;
  for (const Sample& s : samples) ours |= s.name == metric_names::kBuildInfo;
  if (!ours) {
    *why = metrics_url + " answers metrics, but not mergewatchd's (no " + metric_names::kBuildInfo + ")";
    return false;
  }
  reading->facts = ReadScrape(samples);

  const std::string status_url = c.endpoint.base + c.endpoint.status_path;
  Response status = Get(status_url, c.client);
  reading->status = StatusDoc{};
  if (status.status == 404) return true;  // an older mergewatchd: the gauges are all there is
  if (status.status != 200) {
    *why = status.status == 0 ? "cannot reach " + status_url + ": " + status.error
                              : status_url + " answered HTTP " + std::to_string(status.status) + HttpHint(status.status);
    return false;
  }
  if (!ParseStatusDoc(status.body, &reading->status, &error)) {
    *why = status_url + ": " + error;
    return false;
  }
  return true;
}

std::string Url(const CommandLine& c) { return c.endpoint.base + c.endpoint.telemetry_path; }

int RunStatus(const CommandLine& c) {
  Reading first, second;
  std::string why;
  if (!Read(c, &first, &why)) {
    std::cerr << "mergewatch: " << why << "\n";
    return kExitUnusable;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(c.interval_seconds));
  if (!Read(c, &second, &why)) {
    std::cerr << "mergewatch: " << why << "\n";
    return kExitUnusable;
  }
  const double seconds = std::chrono::duration<double>(second.taken - first.taken).count();
  const View view = BuildView(first.facts, second.facts, seconds, second.status, c.all);
  const int exit_status = ExitStatusOf(view);
  std::cout << (c.json ? RenderJson(view, Url(c), exit_status) : RenderStatus(view, Url(c))) << std::flush;
  return exit_status;
}

volatile sig_atomic_t g_quit = 0;
volatile sig_atomic_t g_resized = 0;

// The terminal as it was, restored on every way out.
class RawTerminal {
 public:
  RawTerminal() {
    if (tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    active_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    // The alternate screen, cursor hidden: the shell's screen comes back on exit.
    std::fputs("\033[?1049h\033[?25l", stdout);
    std::fflush(stdout);
  }
  ~RawTerminal() {
    std::fputs("\033[?25h\033[?1049l", stdout);
    std::fflush(stdout);
    if (active_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }

 private:
  termios saved_{};
  bool active_ = false;
};

void Draw(const std::vector<std::string>& lines) {
  std::string frame = "\033[H\033[2J";
  for (size_t i = 0; i < lines.size(); ++i) frame += lines[i] + (i + 1 < lines.size() ? "\r\n" : "");
  std::fputs(frame.c_str(), stdout);
  std::fflush(stdout);
}

void Size(int* width, int* height) {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    *width = ws.ws_col;
    *height = ws.ws_row;
  } else {
    *width = 80;
    *height = 24;
  }
}

int RunTop(const CommandLine& c) {
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
    std::cerr << "mergewatch: top needs a terminal; for scripts use mergewatch status (--json)\n";
    return kExitUnusable;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    if (sig == SIGWINCH) g_resized = 1;
    else g_quit = 1;
  };
  sigemptyset(&sa.sa_mask);  // no SA_RESTART: poll returns and the loop sees the flag
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  sigaction(SIGWINCH, &sa, nullptr);

  RawTerminal terminal;
  std::optional<Reading> previous;
  std::optional<View> view;
  std::string problem = "reading " + Url(c) + " ...";
  auto title = [&] {
    char clock[16];
    const time_t now = time(nullptr);
    strftime(clock, sizeof(clock), "%H:%M:%S", localtime(&now));
    return "mergewatch top  " + Url(c) + "  " + clock + "  q quits";
  };
  auto redraw = [&] {
    int width, height;
    Size(&width, &height);
    if (view && problem.empty()) {
      Draw(RenderTop(*view, title(), width, height));
    } else {
      std::vector<std::string> lines = RenderTop(View{}, title(), width, height);
      for (std::string& line : lines)
        if (line == kNoDevices) line = "  " + problem;
      Draw(lines);
    }
  };
  auto next_refresh = std::chrono::steady_clock::now();
  while (!g_quit) {
    if (std::chrono::steady_clock::now() >= next_refresh) {
      next_refresh += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(c.interval_seconds));
      Reading current;
      std::string why;
      if (!Read(c, &current, &why)) {
        problem = why;  // shown until the daemon answers again; top keeps trying
        previous.reset();
      } else {
        if (previous) {
          view = BuildView(previous->facts, current.facts,
                           std::chrono::duration<double>(current.taken - previous->taken).count(), current.status,
                           c.all);
          problem.clear();
        } else {
          problem = "first scrape taken, the rates follow in " + FormatSeconds(c.interval_seconds);
        }
        previous = std::move(current);
      }
      redraw();
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_refresh - std::chrono::steady_clock::now());
    pollfd in{STDIN_FILENO, POLLIN, 0};
    const int ready = poll(&in, 1, static_cast<int>(std::max<int64_t>(0, wait.count())));
    if (g_resized) {
      g_resized = 0;
      redraw();
    }
    if (ready > 0) {
      char key;
      const ssize_t n = read(STDIN_FILENO, &key, 1);
      if (n == 0 && (in.revents & POLLHUP)) break;  // the terminal went away
      if (n == 1 && (key == 'q' || key == 'Q')) break;
    }
  }
  return 0;
}

}  // namespace
}  // namespace mergewatch::cli

int main(int argc, char** argv) {
  using namespace mergewatch::cli;
  const ParsedCommandLine parsed = ParseCommandLine(argc, argv);
  if (!parsed.run) {
    (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.output << std::flush;
    return parsed.exit_code;
  }
  return parsed.command_line.command == Command::kTop ? RunTop(parsed.command_line) : RunStatus(parsed.command_line);
}
