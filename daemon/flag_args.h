// SPDX-License-Identifier: Apache-2.0
// The command line as CLI11 should see it. "--name=" is the GNU way to give a flag the empty
// string (node_exporter's kingpin reads it so); CLI11 2.3 reads it as a bare "--name" and takes
// the next argument as the value, so "--devices.exclude= --web.listen-address=:9101" would
// silently filter on "--web.listen-address=:9101" and listen on the default port. Each
// "--name=" becomes "--name" "" before parsing.
#pragma once

#include <string>
#include <vector>

namespace mergewatch {

class FlagArgs {
 public:
  FlagArgs(int argc, const char* const* argv) {
    for (int i = 0; i < argc; ++i) {
      std::string arg = argv[i];
      const bool empty_value = i > 0 && arg.size() > 3 && arg.compare(0, 2, "--") == 0 && arg.back() == '=' &&
                               arg.find('=') == arg.size() - 1;
      if (empty_value) {
        arg.pop_back();
        args_.push_back(std::move(arg));
        args_.emplace_back();
      } else {
        args_.push_back(std::move(arg));
      }
    }
    for (const std::string& arg : args_) pointers_.push_back(arg.c_str());
  }
  int argc() const { return static_cast<int>(pointers_.size()); }
  const char* const* argv() const { return pointers_.data(); }

 private:
  std::vector<std::string> args_;
  std::vector<const char*> pointers_;
};

}  // namespace mergewatch
