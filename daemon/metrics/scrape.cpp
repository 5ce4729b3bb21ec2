// SPDX-License-Identifier: Apache-2.0
#include "metrics/scrape.h"

#include <exception>

#include "log.h"
#include "metrics/exposition.h"

namespace mergewatch {

std::string RenderScrape(const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables,
                         const DeviceFilter& devices) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& collectable : collectables) {
    try {
      for (prometheus::MetricFamily& f : collectable->Collect()) families.push_back(std::move(f));
    } catch (const std::exception& e) {
      LogError(std::string("scrape: a collector failed: ") + e.what());
    }
  }
  DropExcludedDevices(devices, &families);
  return RenderExposition(std::move(families));
}

}  // namespace mergewatch
