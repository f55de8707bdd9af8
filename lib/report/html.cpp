// SPDX-License-Identifier: MIT
// The HTML report page (html.h).
#include "report/html.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "core/format.h"
#include "io/run_dir.h"
#include "report/svg_chart.h"
#include "report/table.h"

using nlohmann::json;

namespace mpx::report {

namespace {

const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

struct Curve {
  const char* id;
  const char* title;
  bool epoch;       // from the epoch records (else the step records)
  const char* key;  // the metrics.jsonl field
  bool log_y;
};

const Curve kCurves[] = {
    {"train_loss", "train loss (per log window)", false, "loss", false},
    {"train_accuracy", "train accuracy (per log window)", false, "accuracy", false},
    {"test_loss", "test loss (per evaluation)", true, "test_loss", false},
    {"test_accuracy", "test accuracy (per evaluation)", true, "test_accuracy", false},
    {"learning_rate", "learning rate", false, "learning_rate", false},
    {"loss_scale", "loss scale (x: skipped steps in the window)", false, "loss_scale", true},
};

double number(const json& rec, const char* key) {
  const auto it = rec.find(key);
  return it != rec.end() && it->is_number() ? it->get<double>() : std::nan("");
}

ChartSeries series_of(const RunData& r, const Curve& c, const std::string& color) {
  ChartSeries s{r.name, color, {}, {}, {}};
  for (const auto& rec : c.epoch ? r.epochs : r.steps) {
    if (c.epoch && rec.value("test_accuracy", json()).is_null()) continue;  // not evaluated
    s.points.emplace_back(number(rec, "step"), number(rec, c.key));
  }
  if (std::string(c.id) == "loss_scale") {
    double prev = 0;
    for (const auto& rec : r.steps) {
      const double k = number(rec, "skipped_steps");
      if (std::isfinite(k) && k > prev) {
        s.marks.emplace_back(number(rec, "step"), number(rec, "loss_scale"));
        s.mark_notes.push_back(fmt::format("{} step(s) skipped up to step {} ({} in all)", k - prev,
                                           number(rec, "step"), k));
        prev = k;
      }
    }
  }
  return s;
}

std::string charts(const std::vector<const RunData*>& runs, const std::vector<std::string>& colors) {
  std::string o = "<div class=\"charts\">\n";
  for (const Curve& c : kCurves) {
    std::vector<ChartSeries> ss;
    for (size_t i = 0; i < runs.size(); ++i) ss.push_back(series_of(*runs[i], c, colors[i]));
    ChartSpec spec{c.id, c.title, "step", c.log_y};
    // A loss that spans two decades or more (a blow-up, or a loss far below its start) is drawn
    // on a base-10 logarithmic axis, where every part of the curve shows.
    if (std::string(c.key).find("loss") != std::string::npos && !c.log_y) {
      double lo = std::numeric_limits<double>::infinity(), hi = 0;
      for (const auto& s : ss)
        for (const auto& p : s.points)
          if (std::isfinite(p.second) && p.second > 0) lo = std::min(lo, p.second), hi = std::max(hi, p.second);
      spec.log10_y = hi > 0 && hi / lo >= 100.0;
    }
    o += svg_chart(spec, ss);
  }
  return o + "</div>\n";
}

/// How many records metrics.jsonl holds and how many the curves show (docs/inputs.md,
/// "Run directories": the curves keep at most kMaxCurvePoints of a kind).
std::string metrics_note(const RunData& r) {
  std::string o = fmt::format("{} step and {} epoch records", r.step_records, r.epoch_records);
  if (r.steps.size() < r.step_records || r.epochs.size() < r.epoch_records)
    o += fmt::format("; the curves show {} and {} of them, evenly spaced, the last included", r.steps.size(),
                     r.epochs.size());
  if (r.bad_metrics_lines > 0)
    o += fmt::format("; {} unreadable line{} skipped", r.bad_metrics_lines, r.bad_metrics_lines == 1 ? "" : "s");
  return o;
}

std::string summary_list(const RunData& r) {
  const json& s = r.summary;
  auto field = [&](const char* key) -> std::string {
    const auto it = s.find(key);
    if (it == s.end() || it->is_null()) return "-";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_float()) return fmt::format("{:.6g}", it->get<double>());
    return it->dump(-1, ' ', false, json::error_handler_t::replace);
  };
  std::vector<std::pair<std::string, std::string>> items = {
      {"status", r.status},
      {"policy", field("policy")},
      {"device", field("device")},
      {"epochs / steps", field("epochs") + " / " + field("steps")},
      {"test accuracy (best)", field("final_test_accuracy") + " (" + field("best_test_accuracy") + ")"},
      {"test loss", field("final_test_loss")},
      {"train loss", field("final_train_loss")},
      {"images/s", field("images_per_sec")},
      {"wall time", field("wall_seconds") == "-" ? "-" : field("wall_seconds") + " s"},
      {"skipped steps", field("skipped_steps")},
      {"final loss scale", field("final_loss_scale")},
      {"last skip reason", field("last_skip_reason")},
      {"peak memory", s.contains("peak_memory_bytes") && s["peak_memory_bytes"].is_number_unsigned()
                          ? format_bytes(s["peak_memory_bytes"].get<size_t>())
                          : "-"},
      {"metrics.jsonl", metrics_note(r)},
      {"folder", r.dir},
  };
  std::string o = "<dl class=\"summary\">";
  for (const auto& [k, v] : items)
    o += fmt::format("<div><dt>{}</dt><dd data-key=\"{}\">{}</dd></div>", html_escape(k), html_escape(k),
                     html_escape(v.empty() ? "-" : v));
  return o + "</dl>\n";
}

/// summary.json's confusion matrix as a table: rows the true class, columns the predicted
/// one, each cell shaded by its share of its row, the per-class accuracy at the end of the
/// row; "" when the run has none.
std::string confusion_table(const RunData& r) {
  const auto it = r.summary.find("confusion_matrix");
  if (it == r.summary.end() || !it->is_array() || it->empty()) return "";
  const json& m = *it;
  const size_t K = m.size();
  for (const json& row : m)
    if (!row.is_array() || row.size() != K) return "";  // not a square matrix: not drawn
  std::string o = "<figure class=\"confusion\"><figcaption>Confusion matrix (test set, last evaluation): rows the "
                  "true class, columns the predicted class</figcaption>\n<table class=\"confusion\"><thead><tr>"
                  "<th>true / predicted</th>";
  for (size_t p = 0; p < K; ++p) o += fmt::format("<th>{}</th>", p);
  o += "<th>accuracy</th></tr></thead><tbody>\n";
  for (size_t t = 0; t < K; ++t) {
    double sum = 0;
    for (const json& v : m[t]) sum += v.is_number() ? v.get<double>() : 0.0;
    o += fmt::format("<tr><th>{}</th>", t);
    for (size_t p = 0; p < K; ++p) {
      const double v = m[t][p].is_number() ? m[t][p].get<double>() : 0.0;
      const double share = sum > 0 ? v / sum : 0.0;
      // Blue for the diagonal (right), red elsewhere (wrong), darker for a larger share.
      const char* hue = t == p ? "33,102,172" : "178,24,43";
      o += fmt::format("<td data-v=\"{}\" style=\"background:rgba({},{:.3f})\">{}</td>", m[t][p].dump(), hue,
                       share, m[t][p].dump());
    }
    o += fmt::format("<td class=\"acc\">{}</td></tr>\n",
                     sum > 0 ? fmt::format("{:.4f}", m[t][t].is_number() ? m[t][t].get<double>() / sum : 0.0)
                             : std::string("–"));
  }
  return o + "</tbody></table></figure>\n";
}

/// `mpx compare --report`: the figures the command prints, against the float32 run.
std::string comparison_table(const json& rows) {
  if (!rows.is_array() || rows.empty()) return "";
  const auto cell = [](const json& row, const char* key, const char* pattern) -> std::string {
    const auto it = row.find(key);
    if (it == row.end() || !it->is_number()) return "–";
    return fmt::format(fmt::runtime(pattern), it->get<double>());
  };
  std::string o = "<section id=\"comparison\"><h2>Comparison against float32</h2>\n<table class=\"runs compare\">"
                  "<thead><tr><th>policy</th><th>status</th><th>test acc</th><th>gap pts</th><th>images/s</th>"
                  "<th>speed-up</th><th>activation saving</th><th>peak memory</th></tr></thead><tbody>\n";
  for (const json& r : rows) {
    const std::string peak = r.contains("peak_memory_bytes") && r["peak_memory_bytes"].is_number_unsigned()
                                 ? format_bytes(r["peak_memory_bytes"].get<size_t>())
                                 : "–";
    o += fmt::format("<tr data-policy=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td data-key=\"gap\">{}</td><td>{}</td>"
                     "<td data-key=\"speedup\">{}</td><td data-key=\"saving\">{}</td><td>{}</td></tr>\n",
                     html_escape(r.value("policy", "")), html_escape(r.value("policy", "")),
                     html_escape(r.value("status", "")), cell(r, "test_accuracy", "{:.4f}"),
                     cell(r, "accuracy_gap_points", "{:+.2f}"), cell(r, "images_per_sec", "{:.1f}"),
                     cell(r, "speedup", "{:.2f}x"), cell(r, "activation_saving_percent", "{:.0f}%"), peak);
  }
  return o + "</tbody></table></section>\n";
}

std::string runs_table(const std::vector<RunData>& runs) {
  const Table t = run_table(runs);
  std::string o = "<div class=\"table-wrap\"><table class=\"runs sortable\"><thead><tr>";
  for (const auto& c : t.columns)
    o += fmt::format("<th data-key=\"{}\" title=\"sort by {}\">{}</th>", html_escape(c.key), html_escape(c.title),
                     html_escape(c.title));
  o += "</tr></thead><tbody>\n";
  for (size_t i = 0; i < t.rows.size(); ++i) {
    o += fmt::format("<tr data-run=\"{}\">", html_escape(runs[i].name));
    for (size_t j = 0; j < t.columns.size(); ++j) {
      const json& v = t.rows[i][j];
      const std::string sort_value = v.is_null()     ? ""
                                     : v.is_string() ? v.get<std::string>()
                                                     : v.dump(-1, ' ', false, json::error_handler_t::replace);
      std::string text = html_escape(cell_text(t.columns[j], v));
      if (t.columns[j].key == "run") text = fmt::format("<a href=\"#run-{}\">{}</a>", i, text);
      if (t.columns[j].key == "status")
        text = fmt::format("<span class=\"status {}\">{}</span>", html_escape(sort_value), text);
      o += fmt::format("<td data-v=\"{}\">{}</td>", html_escape(sort_value), text);
    }
    o += "</tr>\n";
  }
  return o + "</tbody></table></div>\n";
}

const char* kStyle = R"(body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:22px}.table-wrap{overflow-x:auto}h2{font-size:18px;margin-top:32px}
table.runs{border-collapse:collapse;font-size:13px}
table.runs th,table.runs td{border:1px solid #ccc;padding:3px 6px;text-align:left}
table.runs th{background:#f0f0f4;cursor:pointer}
table.runs th[data-dir=asc]::after{content:" \25B2"}table.runs th[data-dir=desc]::after{content:" \25BC"}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0;border:1px solid #ddd;padding:6px}
figcaption{font-weight:600;font-size:13px}
.tick{font-size:10px;fill:#555}.axis-label{font-size:11px;fill:#333}.no-data{color:#999;width:560px}
dl.summary{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:4px 16px}
dl.summary dt{font-size:12px;color:#666}dl.summary dd{margin:0}
.status{font-weight:600}.status.completed{color:#1a7f37}
.status.diverged,.status.failed,.status.unreadable{color:#c00}
.status.interrupted,.status.running,.status.incomplete{color:#b36b00}
.legend span{margin-right:14px;white-space:nowrap}
h2,table.runs td:first-child,table.runs td:first-child a{white-space:nowrap}
.swatch{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
.message{white-space:pre-wrap;background:#fff4f4;padding:4px 8px}pre{background:#f6f6f8;padding:8px;overflow:auto}
figure.confusion{margin:12px 0}table.confusion{border-collapse:collapse;font-size:12px}
table.confusion th,table.confusion td{border:1px solid #ccc;padding:2px 6px;text-align:right}
)";

// Sorting the table by a column (numbers as numbers), and the self-check the browser test
// reads (docs/report.md): with #selftest in the address, the plot areas' boxes on the console.
const char* kScript = R"(
(function () {
  var tables = document.querySelectorAll('table.sortable');
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.addEventListener('click', function () {
        var asc = th.getAttribute('data-dir') !== 'asc';
        Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute('data-dir'); });
        th.setAttribute('data-dir', asc ? 'asc' : 'desc');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
          var nx = parseFloat(x), ny = parseFloat(y);
          var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
          return asc ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  if (location.hash === '#selftest') {
    var boxes = Array.prototype.map.call(document.querySelectorAll('svg.plot rect.area'), function (r) {
      var b = r.getBoundingClientRect();
      return [Math.round(b.left + window.scrollX), Math.round(b.top + window.scrollY),
              Math.round(b.width), Math.round(b.height)];
    });
    var page = document.documentElement;
    console.log('mpx-selftest ' + JSON.stringify({plots: boxes, width: page.scrollWidth, height: page.scrollHeight}));
  }
})();
)";

}  // namespace

const std::vector<std::string>& curve_ids() {
  static const std::vector<std::string> ids = [] {
    std::vector<std::string> v;
    for (const Curve& c : kCurves) v.emplace_back(c.id);
    return v;
  }();
  return ids;
}

std::string render_html(const Loaded& loaded, const std::string& title) {
  const auto& runs = loaded.runs;
  std::vector<std::string> colors;
  for (size_t i = 0; i < runs.size(); ++i) colors.emplace_back(kPalette[i % std::size(kPalette)]);
  std::string o = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>\n";
  o += fmt::format("<title>{}</title>\n<style>{}</style></head>\n<body>\n<h1>{}</h1>\n", html_escape(title), kStyle,
                   html_escape(title));
  o += fmt::format("<p class=\"counts\" data-runs=\"{}\" data-not-runs=\"{}\">{} run{}{}</p>\n", runs.size(),
                   loaded.not_runs.size(), runs.size(), runs.size() == 1 ? "" : "s",
                   loaded.not_runs.empty() ? "" : fmt::format("; {} folder(s) are not runs", loaded.not_runs.size()));
  if (!loaded.not_runs.empty()) {
    o += "<ul class=\"not-runs\">";
    for (const auto& n : loaded.not_runs)
      o += fmt::format("<li data-dir=\"{}\"><code>{}</code>: {}</li>", html_escape(n.dir), html_escape(n.dir),
                       html_escape(n.reason));
    o += "</ul>\n";
  }
  if (runs.empty()) return o + "</body></html>\n";
  o += comparison_table(loaded.comparison);
  o += "<section id=\"table\"><h2>Runs</h2>\n" + runs_table(runs) + "</section>\n";
  std::string legend = "<p class=\"legend\">";
  for (size_t i = 0; i < runs.size(); ++i)
    legend += fmt::format("<span><i class=\"swatch\" style=\"background:{}\"></i>{}</span>", colors[i],
                          html_escape(runs[i].name));
  legend += "</p>\n";
  if (runs.size() > 1) {
    std::vector<const RunData*> all;
    for (const auto& r : runs) all.push_back(&r);
    o += "<section id=\"overlay\"><h2>All runs</h2>\n" + legend + charts(all, colors) + "</section>\n";
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    o += fmt::format("<section class=\"run\" id=\"run-{}\" data-run=\"{}\" data-status=\"{}\">\n"
                     "<h2>{} <span class=\"status {}\">{}</span></h2>\n",
                     i, html_escape(r.name), html_escape(r.status), html_escape(r.name), html_escape(r.status),
                     html_escape(r.status));
    if (!r.message.empty()) o += "<p class=\"message\">" + html_escape(r.message) + "</p>\n";
    o += summary_list(r) + charts({&r}, {colors[i]}) + confusion_table(r);
    o += "<details><summary>Resolved config (config.yaml)</summary><pre class=\"config\">" +
         html_escape(r.config_text.empty() ? "(no config.yaml)" : r.config_text) + "</pre></details>\n</section>\n";
  }
  return o + "<script>" + kScript + "</script>\n</body></html>\n";
}

void write_report(const Loaded& loaded, const std::string& title, const std::string& path) {
  try {
    write_file_atomic(path, render_html(loaded, title));
  } catch (const IoError& e) {
    throw IoError(fmt::format("cannot write the report '{}' ({})", path, e.what()));
  }
}

}  // namespace mpx::report
