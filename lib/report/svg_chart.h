// SPDX-License-Identifier: MIT
// A line chart as inline SVG: axes with ticks, one polyline per series, point
// markers, and extra marks (the skipped steps on the loss-scale curve).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mpx::report {

using Point = std::pair<double, double>;

struct ChartSeries {
  std::string run;    // the run's label (data-run)
  std::string color;  // CSS colour
  std::vector<Point> points;
  std::vector<Point> marks;             // drawn as black crosses (skipped steps): no run has black
  std::vector<std::string> mark_notes;  // a tooltip per mark
};

struct ChartSpec {
  std::string curve;  // id: train_loss, test_accuracy, loss_scale... (data-curve)
  std::string title, x_label;
  bool log_y = false;  // base-2 logarithmic y axis (the loss scale)
  bool log10_y = false;  // base-10 logarithmic y axis (a loss that spans decades); ticks 0.01, 1, 100
};

/// `<figure class="chart" data-curve=...>` holding the SVG; every series is a
/// `<g class="series" data-run data-points data-last-x data-last-y>` (numbers with 9
/// significant digits). Without any point: the figure says "no data".
std::string svg_chart(const ChartSpec& spec, const std::vector<ChartSeries>& series);

/// Text safe inside HTML elements and attribute values.
std::string html_escape(const std::string& s);

/// "%.9g": the numbers of the data attributes.
std::string num(double v);

}  // namespace mpx::report
