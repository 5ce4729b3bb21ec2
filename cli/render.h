// SPDX-License-Identifier: Apache-2.0
// The text and JSON the command prints: pure functions of a View.
#pragma once

#include <string>
#include <vector>

#include "device_view.h"

namespace mergewatch::cli {

// Compact figures: 4096 -> "4K", 15234 -> "15.2k", 3.1e-05 s -> "31us"; NaN -> "-".
std::string FormatBytes(double bytes);
std::string FormatRate(double per_second);
std::string FormatSeconds(double seconds);

// `mergewatch status`: the device tree with its figures, the queue settings, the size
// distributions, then every active collapse and finding with evidence, cause and remedy.
std::string RenderStatus(const View& view, const std::string& url);

// `mergewatch status --json`: the view with the raw counters of both scrapes beside the rates.
std::string RenderJson(const View& view, const std::string& url, int exit_status);

// One screen of `mergewatch top`, `width` x `height` characters at most: devices sorted by
// request rate, the collapsing ones marked "!", then the active collapses and findings.
// Columns drop from the right when narrower than 80, and the header says so; below the
// narrowest layout a single line says the terminal is too narrow.
std::vector<std::string> RenderTop(const View& view, const std::string& title, int width, int height);
// The narrowest terminal RenderTop draws a table for.
constexpr int kTopMinWidth = 30;
// RenderTop's row when the view has no device.
inline constexpr char kNoDevices[] = "  no block device has I/O data yet";

}  // namespace mergewatch::cli
