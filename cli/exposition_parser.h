// SPDX-License-Identifier: Apache-2.0
// The one reader of the Prometheus text exposition (version 0.0.4) in the tree: the `mergewatch`
// command reads the daemon's scrape with it. Strict: a line it cannot read fails the whole parse
// with the line's number, because a figure read wrong is worse than none.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mergewatch::cli {

struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // in the order written
  double value = 0;

  // The label's value, or "" when the sample has no such label.
  const std::string& Label(const std::string& key) const;
};

// Every sample of `text` in order; HELP, TYPE and other comment lines and blank lines are
// skipped, timestamps dropped. False with `error` ("line 7: ...") on anything else.
bool ParseExposition(const std::string& text, std::vector<Sample>* samples, std::string* error);

}  // namespace mergewatch::cli
