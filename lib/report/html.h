// SPDX-License-Identifier: MIT
// `mpx report`'s HTML page: one self-contained file (inline SVG, inline CSS and a
// few lines of inline script for sorting the table; nothing fetched), with the
// table of runs, overlaid curves and one section per run (docs/report.md).
#pragma once

#include <string>
#include <vector>

#include "report/run_data.h"

namespace mpx::report {

/// The curves every run section and the overlay section draw, by id.
const std::vector<std::string>& curve_ids();

std::string render_html(const Loaded& loaded, const std::string& title);

/// Writes render_html() to `path` atomically; throws IoError (exit 6) naming it.
void write_report(const Loaded& loaded, const std::string& title, const std::string& path);

}  // namespace mpx::report
