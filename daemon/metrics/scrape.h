// SPDX-License-Identifier: Apache-2.0
// One scrape: every collector's families, the devices the filter leaves out dropped, label values
// made UTF-8, in the text format.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>

#include "metrics/device_filter.h"

namespace mergewatch {

// Families already rendered and filtered (StateCollector::TopologyText), appended as they are.
using RenderedFamilies = std::function<std::shared_ptr<const std::string>()>;

// A collector that throws is logged and left out; the others are still rendered.
std::string RenderScrape(const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables,
                         const std::vector<RenderedFamilies>& rendered, const DeviceFilter& devices);

}  // namespace mergewatch
