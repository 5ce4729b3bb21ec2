// SPDX-License-Identifier: Apache-2.0
#include "metrics/scrape.h"

#include <exception>

#include "log.h"
#include "metrics/exposition.h"

namespace mergewatch {

std::string RenderScrape(const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables,
                         const std::vector<RenderedFamilies>& rendered, const DeviceFilter& devices) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& collectable : collectables) {
    try {
      for (prometheus::MetricFamily& f : collectable->Collect()) families.push_back(std::move(f));
    } catch (const std::exception& e) {
      LogError(std::string("scrape: a collector failed: ") + e.what());
    }
  }
  DropExcludedDevices(devices, &families);
  std::vector<std::shared_ptr<const std::string>> parts;
  size_t tail_bytes = 0;
  for (const RenderedFamilies& part : rendered) {
    try {
      parts.push_back(part());
      tail_bytes += parts.back()->size();
    } catch (const std::exception& e) {
      LogError(std::string("scrape: rendering families failed: ") + e.what());
    }
  }
  std::string text = RenderExposition(families, tail_bytes);
  for (const auto& part : parts) text += *part;
  return text;
}

}  // namespace mergewatch
