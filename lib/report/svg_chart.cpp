// SPDX-License-Identifier: MIT
// Inline SVG line charts (svg_chart.h).
#include "report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace mpx::report {

namespace {

constexpr double kW = 560, kH = 260, kLeft = 64, kRight = 14, kTop = 12, kBottom = 40;

struct Axis {
  double lo = 0, hi = 1;
  bool log2 = false, log10 = false;
  double unit(double v) const { return log2 ? std::log2(v) : log10 ? std::log10(v) : v; }
  double map(double v, double a, double b) const {  // value -> pixel between a and b
    const double t = (unit(v) - lo) / (hi - lo);
    return a + t * (b - a);
  }
};

Axis make_axis(double lo, double hi, bool log2, bool log10 = false) {
  Axis ax;
  ax.log2 = log2;
  ax.log10 = log10 && !log2;
  lo = ax.unit(lo), hi = ax.unit(hi);
  if (!(hi > lo)) {
    const double pad = std::max(std::fabs(lo) * 0.05, log2 || ax.log10 ? 1.0 : 1e-3);
    lo -= pad, hi += pad;
  }
  const double margin = (hi - lo) * 0.04;  // keep lines off the frame
  ax.lo = lo - margin, ax.hi = hi + margin;
  return ax;
}

/// About five round tick values covering [lo, hi] (in axis units: log2 units when log).
std::vector<double> ticks(const Axis& ax) {
  std::vector<double> t;
  const double span = ax.hi - ax.lo;
  double step = std::pow(10.0, std::floor(std::log10(span / 5)));
  if (ax.log2 || ax.log10) step = std::max(1.0, std::ceil(span / 6));
  else if (span / step > 10) step *= 5;
  else if (span / step > 5) step *= 2;
  for (double v = std::ceil(ax.lo / step) * step; v <= ax.hi + step * 1e-9; v += step) t.push_back(v);
  return t;
}

std::string tick_label(double v, bool log2, bool log10 = false) {
  if (log2) return fmt::format("2^{:g}", v);  // as the log writes loss scales
  if (log10) return fmt::format("{:g}", std::pow(10.0, v));  // 0.01, 1, 100
  if (std::fabs(v) < 1e-12) return "0";
  return fmt::format("{:.4g}", v);
}

bool usable(const Point& p, bool log_y) {
  return std::isfinite(p.first) && std::isfinite(p.second) && (!log_y || p.second > 0);
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v) {
  if (!std::isfinite(v)) return "NaN";
  return fmt::format("{:.9g}", v);
}

std::string svg_chart(const ChartSpec& spec, const std::vector<ChartSeries>& series) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  size_t n = 0;
  const bool log_y = spec.log_y || spec.log10_y;
  for (const auto& s : series)
    for (const auto& p : s.points)
      if (usable(p, log_y)) {
        x0 = std::min(x0, p.first), x1 = std::max(x1, p.first);
        y0 = std::min(y0, p.second), y1 = std::max(y1, p.second);
        ++n;
      }
  std::string o = fmt::format("<figure class=\"chart\" data-curve=\"{}\"><figcaption>{}</figcaption>\n",
                              html_escape(spec.curve), html_escape(spec.title));
  if (n == 0) return o + "<p class=\"no-data\">no data</p></figure>\n";
  const Axis ax = make_axis(x0, x1, false), ay = make_axis(y0, y1, spec.log_y, spec.log10_y);
  const double pl = kLeft, pr = kW - kRight, pt = kTop, pb = kH - kBottom;
  o += fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" viewBox=\"0 0 {} {}\" width=\"{}\" "
                   "height=\"{}\" role=\"img\">\n",
                   kW, kH, kW, kH);
  o += fmt::format("<rect class=\"area\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fbfbfd\" "
                   "stroke=\"#888\"/>\n",
                   pl, pt, pr - pl, pb - pt);
  for (double v : ticks(ay)) {
    const double y = pb + (v - ay.lo) / (ay.hi - ay.lo) * (pt - pb);
    o += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e3e3e8\"/>"
                     "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" class=\"tick\">{}</text>\n",
                     pl, pr, y, y, pl - 4, y + 4, tick_label(v, spec.log_y, ay.log10));
  }
  for (double v : ticks(ax)) {
    const double x = ax.map(v, pl, pr);
    o += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\" stroke=\"#e3e3e8\"/>"
                     "<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" class=\"tick\">{}</text>\n",
                     x, x, pt, pb, x, pb + 14, tick_label(v, false));
  }
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" class=\"axis-label\">{}</text>\n",
                   (pl + pr) / 2, kH - 6, html_escape(spec.x_label));
  for (const auto& s : series) {
    std::vector<Point> pts;
    for (const auto& p : s.points)
      if (usable(p, log_y)) pts.push_back(p);
    if (pts.empty()) continue;
    o += fmt::format("<g class=\"series\" data-run=\"{}\" data-points=\"{}\" data-last-x=\"{}\" data-last-y=\"{}\">",
                     html_escape(s.run), pts.size(), num(pts.back().first), num(pts.back().second));
    std::string poly;
    for (const auto& p : pts)
      poly += fmt::format("{:.1f},{:.1f} ", ax.map(p.first, pl, pr), ay.map(p.second, pb, pt));
    o += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" points=\"{}\"/>", s.color, poly);
    if (pts.size() <= 60)
      for (const auto& p : pts)
        o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\">"
                         "<title>{}: {} at {}</title></circle>",
                         ax.map(p.first, pl, pr), ay.map(p.second, pb, pt), s.color, html_escape(s.run),
                         num(p.second), num(p.first));
    for (size_t i = 0; i < s.marks.size(); ++i) {
      const Point& m = s.marks[i];
      if (!usable(m, log_y)) continue;
      const double x = ax.map(m.first, pl, pr), y = ay.map(m.second, pb, pt);
      o += fmt::format("<path class=\"skip\" d=\"M{:.1f},{:.1f}l8,8m0,-8l-8,8\" stroke=\"#000\" stroke-width=\"2\">"
                       "<title>{}</title></path>",
                       x - 4, y - 4, html_escape(i < s.mark_notes.size() ? s.mark_notes[i] : "skipped steps"));
    }
    o += "</g>\n";
  }
  return o + "</svg></figure>\n";
}

}  // namespace mpx::report
