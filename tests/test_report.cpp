// SPDX-License-Identifier: MIT
// `mpx report` on run folders written by hand (docs/report.md): every status
// shown with its message, folders that are not runs named with the reason, the
// table's cells equal to the summaries (CSV and JSON read back), the config keys
// that differ as columns, and the HTML page parsed: every run, every curve, the
// last points' values, the skipped-step marks.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "report/html.h"
#include "report/run_data.h"
#include "report/table.h"
#include "support/cli.h"
#include "support/html_scan.h"

using namespace mpx::report;
using nlohmann::json;
using support::TempDir;
using support::write_file;
namespace fs = std::filesystem;

namespace {

json summary(const std::string& status, double acc, double ips, const std::string& msg = "") {
  return {{"status", status},   {"exit_code", status == "completed" ? 0 : 4},
          {"message", msg},     {"epochs", 2},
          {"steps", 8},         {"final_test_accuracy", acc},
          {"best_test_accuracy", acc + 0.001},
          {"final_test_loss", 0.5},
          {"final_train_loss", 0.25},
          {"images_per_sec", ips},
          {"wall_seconds", 3.5},
          {"skipped_steps", 2},
          {"final_loss_scale", 16384.0},
          {"peak_memory_bytes", 14251008},
          {"policy", "mixed_float16"},
          {"device", "cpu"}};
}

std::string config(const std::string& lr, const std::string& policy) {
  return "name: sweep\nseed: 1\npolicy: " + policy + "\noptimizer:\n  name: adam\n  learning_rate: " + lr +
         "\ndata:\n  normalize: {mean: [0.5], std: [0.25]}\nmodel:\n  layers:\n    - {type: flatten}\n"
         "    - {type: dense, units: 10}\n";
}

/// Four log windows and two epochs; skipped steps rise at steps 2 and 6.
std::string metrics(double scale_factor) {
  std::string s;
  const int skipped[] = {1, 1, 2, 2};
  for (int i = 0; i < 4; ++i) {
    const int step = 2 * (i + 1);
    s += json{{"kind", "step"}, {"step", step}, {"epoch", i / 2 + 1}, {"loss", 2.0 - 0.25 * i},
              {"accuracy", 0.1 * (i + 1)}, {"learning_rate", 1e-3 * scale_factor},
              {"loss_scale", 32768.0 / (1 << skipped[i])},
              {"skipped_steps", skipped[i]}, {"images_per_sec", 100.0 + i}, {"memory_bytes", 1000}}
             .dump() + "\n";
    if (i % 2 == 1)
      s += json{{"kind", "epoch"}, {"epoch", i / 2 + 1}, {"step", step}, {"train_loss", 1.5}, {"train_accuracy", 0.4},
                {"test_loss", 0.75 - 0.125 * (i / 2) * scale_factor}, {"test_accuracy", 0.5 + 0.0625 * i}}
               .dump() + "\n";
  }
  return s;
}

void make_run(const fs::path& d, const json& sum, const std::string& cfg, const std::string& met) {
  fs::create_directories(d);
  if (!sum.is_null()) write_file(d / "summary.json", sum.dump(2));
  if (!cfg.empty()) write_file(d / "config.yaml", cfg);
  if (!met.empty()) write_file(d / "metrics.jsonl", met);
}

struct Fixture {
  TempDir t{"mpx_test_report"};
  std::vector<std::string> dirs;
  Fixture() {
    make_run(t.path / "lr1e-3", summary("completed", 0.9375, 120.5), config("1.0e-3", "float32"), metrics(1));
    make_run(t.path / "lr3e-3", summary("completed", 0.96875, 99.25), config("3.0e-3", "float32"), metrics(3));
    make_run(t.path / "lr1e+1", summary("diverged", 0.125, 80, "training diverged: non-finite loss at step 3"),
             config("10.0", "mixed_float16"), metrics(2));
    make_run(t.path / "killed", json(), config("1.0e-3", "float32"), metrics(1) + "{\"kind\": \"st");
    fs::create_directories(t.path / "empty");
    write_file(t.path / "plain.txt", "x");
    for (const char* n : {"lr1e-3", "lr3e-3", "lr1e+1", "killed", "empty", "plain.txt", "missing"})
      dirs.push_back((t.path / n).string());
  }
};

}  // namespace

TEST_CASE("report: statuses, messages and folders that are not runs", "[report]") {
  Fixture f;
  const Loaded l = load_runs(f.dirs);
  REQUIRE(l.runs.size() == 4);
  CHECK(l.runs[0].status == "completed");
  CHECK(l.runs[2].status == "diverged");
  CHECK(l.runs[2].message == "training diverged: non-finite loss at step 3");
  CHECK(l.runs[3].status == "incomplete");
  CHECK(l.runs[3].message.find("no summary.json") != std::string::npos);
  CHECK(l.runs[3].bad_metrics_lines == 1);  // the cut-off last line
  CHECK(l.runs[3].steps.size() == 4);
  REQUIRE(l.not_runs.size() == 3);
  CHECK(l.not_runs[0].reason.find("not a run directory") != std::string::npos);
  CHECK(l.not_runs[1].reason == "is not a folder");
  CHECK(l.not_runs[2].reason == "does not exist");

  // A folder of runs (a compare folder) stands for the runs in it.
  const Loaded parent = load_runs({f.t.str()});
  CHECK(parent.runs.size() == 4);
  CHECK(parent.not_runs.empty());
}

TEST_CASE("report: the table's cells are the summaries' values; differing config keys are columns", "[report]") {
  Fixture f;
  const Loaded l = load_runs(f.dirs);
  const Table t = run_table(l.runs);
  std::vector<std::string> config_cols;
  for (const auto& c : t.columns)
    if (c.config) config_cols.push_back(c.key);
  // policy differs too, but is a summary column already.
  CHECK(config_cols == std::vector<std::string>{"optimizer.learning_rate"});

  // JSON read back: every summary field of every run.
  const json arr = json::parse(format_table(t, TableFormat::Json));
  REQUIRE(arr.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    const json& row = arr[i];
    const json& s = l.runs[i].summary;
    CHECK(row["run"] == fs::path(f.dirs[i]).filename().string());
    CHECK(row["status"] == l.runs[i].status);
    for (const char* k : {"final_test_accuracy", "images_per_sec", "final_train_loss", "skipped_steps",
                          "peak_memory_bytes", "final_loss_scale"})
      CHECK(row[k] == (s.contains(k) ? s[k] : json(nullptr)));
  }
  CHECK(arr[1]["optimizer.learning_rate"] == 3.0e-3);  // the YAML number as a JSON number
  CHECK(arr[2]["policy"] == "mixed_float16");  // from summary.json
  CHECK(arr[2]["message"] == "training diverged: non-finite loss at step 3");

  // CSV read back (no field of these runs needs quotes): the numbers round-trip exactly.
  const std::string csv = format_table(t, TableFormat::Csv);
  std::vector<std::vector<std::string>> cells;
  size_t pos = 0;
  while (pos < csv.size()) {
    const size_t eol = csv.find("\r\n", pos);
    std::vector<std::string> row;
    std::string line = csv.substr(pos, eol - pos), cell;
    for (char c : line) {
      if (c == ',') row.push_back(cell), cell.clear();
      else cell += c;
    }
    row.push_back(cell);
    cells.push_back(row);
    pos = eol + 2;
  }
  REQUIRE(cells.size() == 5);
  const auto col = [&](const std::string& k) {
    for (size_t j = 0; j < cells[0].size(); ++j)
      if (cells[0][j] == k) return j;
    FAIL("no column " << k);
    return size_t{0};
  };
  CHECK(std::stod(cells[2][col("final_test_accuracy")]) == 0.96875);
  CHECK(std::stod(cells[1][col("images_per_sec")]) == 120.5);
  CHECK(cells[4][col("final_test_accuracy")].empty());  // the killed run has no summary

  // Markdown: a heading, a rule and one line per run.
  const std::string md = format_table(t, TableFormat::Markdown);
  CHECK(std::count(md.begin(), md.end(), '\n') == 6);
  CHECK(md.find("| 0.9688 |") != std::string::npos);
  // Text: the sizes for people.
  CHECK(format_table(t, TableFormat::Text).find("13.6 MiB") != std::string::npos);
}

TEST_CASE("report: the HTML page has every run, every curve and the last points' values", "[report]") {
  Fixture f;
  const Loaded l = load_runs(f.dirs);
  const std::string html = render_html(l, "sweep <lr>");
  // Self-contained: no address other than the SVG namespace, no src= or <link>.
  std::string rest = html;
  for (size_t p; (p = rest.find("http://www.w3.org/2000/svg")) != std::string::npos;) rest.erase(p, 26);
  CHECK(rest.find("http") == std::string::npos);
  CHECK(rest.find("src=") == std::string::npos);
  CHECK(rest.find("<link") == std::string::npos);
  const support::HtmlDoc doc = support::parse_html(html);
  const auto by = [&](int root, const std::string& name, const std::string& cls) {
    return doc.find(root, [&](const support::HtmlElement& e) {
      return e.name == name && (cls.empty() || e.has_class(cls));
    });
  };
  CHECK(doc.at(by(0, "title", "")[0]).text == "sweep <lr>");

  // Not-runs named with their reason.
  const auto not_runs = by(0, "li", "");
  REQUIRE(not_runs.size() == 3);
  CHECK(doc.at(not_runs[2]).attr("data-dir") == f.dirs[6]);

  // The table: a row per run, the status shown.
  const auto rows = by(0, "tr", "");
  REQUIRE(rows.size() == 5);
  CHECK(doc.at(rows[3]).attr("data-run") == "lr1e+1");

  // One section per run, each with every curve; the last point equals the last record.
  const auto sections = by(0, "section", "run");
  REQUIRE(sections.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    const auto& run = l.runs[i];
    const int sec = sections[i];
    CHECK(doc.at(sec).attr("data-run") == run.name);
    CHECK(doc.at(sec).attr("data-status") == run.status);
    const auto figs = by(sec, "figure", "chart");
    REQUIRE(figs.size() == curve_ids().size());
    for (size_t c = 0; c < figs.size(); ++c) {
      const std::string curve = doc.at(figs[c]).attr("data-curve");
      CHECK(curve == curve_ids()[c]);
      const auto series = by(figs[c], "g", "series");
      INFO("run " << run.name << " curve " << curve);
      REQUIRE(series.size() == 1);
      const auto& g = doc.at(series[0]);
      CHECK(g.attr("data-run") == run.name);
      const bool epoch = curve.rfind("test_", 0) == 0;
      const json& last = epoch ? run.epochs.back() : run.steps.back();
      const char* key = curve == "train_loss" ? "loss" : curve == "train_accuracy" ? "accuracy" : curve.c_str();
      CHECK(std::stod(g.attr("data-last-x")) == last["step"].get<double>());
      CHECK(std::stod(g.attr("data-last-y")) == Approx(last[key].get<double>()).epsilon(1e-8));
      CHECK(std::stoul(g.attr("data-points")) == (epoch ? run.epochs.size() : run.steps.size()));
      CHECK(!by(series[0], "polyline", "").empty());
      if (curve == "loss_scale") CHECK(by(series[0], "path", "skip").size() == 2);  // steps 2 and 6
    }
    if (run.status != "completed") {
      const auto msg = by(sec, "p", "message");
      REQUIRE(msg.size() == 1);
      CHECK(doc.at(msg[0]).text == run.message);
    }
  }

  // The overlay: every curve with one series per run.
  const auto overlay = doc.find(0, [](const support::HtmlElement& e) { return e.attr("id") == "overlay"; });
  REQUIRE(overlay.size() == 1);
  const auto figs = by(overlay[0], "figure", "chart");
  REQUIRE(figs.size() == curve_ids().size());
  for (int fig : figs) CHECK(by(fig, "g", "series").size() == 4);
}

TEST_CASE("report: one run has no overlay; a run without metrics says 'no data'", "[report]") {
  TempDir t{"mpx_test_report"};
  make_run(t.path / "only", summary("failed", 0, 0, "data missing"), config("1.0e-3", "float32"), "");
  const std::string html = render_html(load_runs({(t.path / "only").string()}), "one");
  const support::HtmlDoc doc = support::parse_html(html);
  CHECK(doc.find(0, [](const support::HtmlElement& e) { return e.attr("id") == "overlay"; }).empty());
  CHECK(doc.find(0, [](const support::HtmlElement& e) { return e.has_class("no-data"); }).size() == curve_ids().size());
}

TEST_CASE("report: skip marks share no run's colour; a loss that spans decades is on a log axis; names do not wrap",
          "[report]") {
  RunData r;
  r.dir = r.name = "blowup";
  r.status = "diverged";
  const double losses[] = {2.3, 0.5, 40.0, 4.6e4};
  for (int i = 0; i < 4; ++i)
    r.steps.push_back({{"kind", "step"}, {"step", i + 1}, {"loss", losses[i]}, {"accuracy", 0.1 + 0.1 * i},
                       {"learning_rate", 1e-3}, {"loss_scale", 1.0}, {"skipped_steps", i}});
  Loaded l;
  for (int i = 0; i < 10; ++i) {  // more runs than the palette has colours
    RunData c = r;
    c.name = "run" + std::to_string(i);
    l.runs.push_back(c);
  }
  const std::string html = render_html(l, "t");
  const auto doc = support::parse_html(html);
  std::set<std::string> colours;
  for (int p : doc.find(0, [](const support::HtmlElement& e) { return e.name == "polyline"; }))
    colours.insert(doc.at(p).attr("stroke"));
  const auto skips = doc.find(0, [](const support::HtmlElement& e) { return e.name == "path" && e.has_class("skip"); });
  REQUIRE(!skips.empty());
  for (int s : skips) {
    CHECK(doc.at(s).attr("stroke") == "#000");
    CHECK(colours.count(doc.at(s).attr("stroke")) == 0);
  }
  // train_loss spans 0.5 .. 46000: ticks at powers of ten; train_accuracy (0.1 .. 0.4) stays linear.
  const auto tick_texts = [&](const std::string& curve) {
    std::set<std::string> t;
    const auto fig = doc.find(0, [&](const support::HtmlElement& e) { return e.attr("data-curve") == curve; });
    REQUIRE(!fig.empty());
    for (int x : doc.find(fig[0], [](const support::HtmlElement& e) { return e.name == "text" && e.has_class("tick"); }))
      t.insert(doc.at(x).text);
    return t;
  };
  const auto loss = tick_texts("train_loss");
  for (const char* want : {"1", "10", "100", "1000", "10000"}) CHECK(loss.count(want) == 1);
  const auto acc = tick_texts("train_accuracy");
  CHECK(acc.count("10") == 0);
  CHECK(acc.count("0.2") == 1);
  CHECK(html.find("table.runs td:first-child,table.runs td:first-child a{white-space:nowrap}") != std::string::npos);
}
