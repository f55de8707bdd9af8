// SPDX-License-Identifier: MIT
// `mpx report` and `mpx compare --report` through the binary, on real runs
// (docs/report.md): the table in every format against summary.json, the HTML
// file written and parsed, folders that are not runs warned about, and the
// exit codes of bad input.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "support/cli.h"
#include "support/html_scan.h"

using nlohmann::json;
using support::run_mpx;
using support::TempDir;
using support::write_file;
namespace fs = std::filesystem;

namespace {

const char* kYaml =
    "name: rep\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 8, synthetic_train: 32, synthetic_test: 8}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 2, log_every: 2}\n";

json read_json(const fs::path& p) { return json::parse(support::read_file(p)); }

}  // namespace

TEST_CASE("cli report: the table of two runs in every format; HTML written; a non-run folder warned about",
          "[cli][report]") {
  TempDir t{"mpx_test_cli_report"};
  write_file(t.path / "c.yaml", kYaml);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --run-dir runs/a", t.path).code == 0);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --set optimizer.learning_rate=3e-3 --run-dir runs/b", t.path)
              .code == 0);
  fs::create_directories(t.path / "notes");

  const auto js = run_mpx("report --table --format json runs/a runs/b notes", t.path);
  REQUIRE(js.code == 0);
  CHECK(js.err.find("notes: not a run directory") != std::string::npos);
  const json arr = json::parse(js.out);
  REQUIRE(arr.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const json s = read_json(t.path / "runs" / (i ? "b" : "a") / "summary.json");
    for (const char* k : {"status", "final_test_accuracy", "best_test_accuracy", "final_train_loss", "images_per_sec",
                          "wall_seconds", "steps", "epochs", "peak_memory_bytes", "policy", "device"})
      CHECK(arr[i][k] == s[k]);
  }
  CHECK(arr[0]["optimizer.learning_rate"] != arr[1]["optimizer.learning_rate"]);

  const auto csv = run_mpx("report --table --format csv runs/a runs/b", t.path);
  REQUIRE(csv.code == 0);
  CHECK(csv.out.rfind("run,status,policy,", 0) == 0);
  CHECK(std::count(csv.out.begin(), csv.out.end(), '\n') == 3);
  const auto text = run_mpx("report --table runs", t.path);  // the parent folder stands for its runs
  REQUIRE(text.code == 0);
  CHECK(text.out.find("completed") != std::string::npos);
  CHECK(std::count(text.out.begin(), text.out.end(), '\n') == 3);

  const auto html = run_mpx("report runs/a runs/b --out r.html", t.path);
  REQUIRE(html.code == 0);
  const auto doc = support::parse_html(support::read_file(t.path / "r.html"));
  CHECK(doc.find(0, [](const support::HtmlElement& e) { return e.has_class("run"); }).size() == 2);
}

TEST_CASE("cli report: bad input", "[cli][report]") {
  TempDir t{"mpx_test_cli_report"};
  fs::create_directories(t.path / "empty");
  const auto none = run_mpx("report empty", t.path);
  CHECK(none.code == 2);
  CHECK(none.err.find("none of the folders given is a run directory") != std::string::npos);
  // A folder that does not exist is an error, also beside real runs.
  const auto missing = run_mpx("report empty missing", t.path);
  CHECK(missing.code == 2);
  CHECK(missing.err.find("missing: does not exist; mpx report takes run directories") != std::string::npos);
  CHECK(run_mpx("report --table --format yaml empty", t.path).code == 2);
  CHECK(run_mpx("report --format csv empty", t.path).code == 2);  // --format needs --table

  // The HTML cannot be written: exit 6 naming the file.
  write_file(t.path / "c.yaml", kYaml);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --set train.epochs=1 --run-dir runs/a", t.path).code == 0);
  const auto io = run_mpx("report runs/a --out no/such/folder/r.html", t.path);
  CHECK(io.code == 6);
  CHECK(io.err.find("no/such/folder/r.html") != std::string::npos);
  const auto beside = run_mpx("report --table runs/a runs/typo", t.path);
  CHECK(beside.code == 2);
  CHECK(beside.err.find("runs/typo: does not exist") != std::string::npos);
  CHECK(run_mpx("report --table runs/a --sort no_such_column", t.path).code == 2);
}

TEST_CASE("cli report: JSON types, null for what a failed run lacks, --sort, --columns, capped config columns",
          "[cli][report]") {
  TempDir t{"mpx_test_cli_report"};
  write_file(t.path / "c.yaml", kYaml);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --run-dir runs/a", t.path).code == 0);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --set optimizer.learning_rate=3e-2 --run-dir runs/b", t.path)
              .code == 0);
  // A run of another model whose data is missing: it fails before any step (exit 3).
  write_file(t.path / "big.yaml",
             "name: rep\n"
             "device: cpu\n"
             "data: {dataset: mnist, path: no_data_here}\n"
             "model:\n"
             "  layers:\n"
             "    - {type: conv2d, filters: 4, kernel: 3, activation: relu}\n"
             "    - {type: conv2d, filters: 4, kernel: 3, activation: relu}\n"
             "    - {type: max_pool}\n"
             "    - {type: flatten}\n"
             "    - {type: dense, units: 32, activation: relu}\n"
             "    - {type: dense, units: 10, activation: softmax}\n");
  REQUIRE(run_mpx("train --no-progress --config big.yaml --run-dir runs/c", t.path).code == 3);

  const auto js = run_mpx("report --table --format json runs", t.path);
  REQUIRE(js.code == 0);
  const json arr = json::parse(js.out);
  REQUIRE(arr.size() == 3);
  CHECK(arr[0]["optimizer.learning_rate"].is_number_float());  // numbers as numbers, not "0.001"
  CHECK(arr[0]["optimizer.learning_rate"].get<double>() == 0.001);
  CHECK(arr[1]["optimizer.learning_rate"].get<double>() == 0.03);
  CHECK(arr[0]["epochs"].is_number_integer());
  CHECK(arr[2]["status"] == "failed");
  for (const char* k : {"final_test_accuracy", "best_test_accuracy", "final_test_loss", "final_train_loss",
                        "images_per_sec"}) {
    INFO(k);
    CHECK(arr[2][k].is_null());
  }

  // Text: "–" where a value is missing, never 0.0000; at most 8 config columns, the rest named.
  const auto text = run_mpx("report --table runs", t.path);
  REQUIRE(text.code == 0);
  const std::string failed_line = text.out.substr(text.out.find("\nc "));
  CHECK(failed_line.find("0.0000") == std::string::npos);
  CHECK(failed_line.find("–") != std::string::npos);
  CHECK(text.out.find("more config keys differ: ") != std::string::npos);
  CHECK(text.out.find("--columns KEY,... shows them") != std::string::npos);
  const auto all_md = run_mpx("report --table --format markdown runs", t.path);
  REQUIRE(all_md.code == 0);
  const std::string head = all_md.out.substr(0, all_md.out.find('\n'));
  // 15 summary columns, 8 config columns, the message: 24 cells, 25 bars.
  CHECK(std::count(head.begin(), head.end(), '|') == 25);
  CHECK(all_md.out.find("more config keys differ: ") != std::string::npos);

  // Markdown: the same titles as the text form (units in the header match the cells).
  const auto md = run_mpx("report --table --format markdown runs/a runs/b", t.path);
  REQUIRE(md.code == 0);
  CHECK(md.out.find("| peak memory |") != std::string::npos);
  CHECK(md.out.find("peak_memory_bytes") == std::string::npos);

  // --sort and --columns.
  const auto sorted = run_mpx("report --table --format json runs --sort optimizer.learning_rate --descending "
                              "--columns status,optimizer.learning_rate,final_train_loss",
                              t.path);
  REQUIRE(sorted.code == 0);
  const json s = json::parse(sorted.out);
  REQUIRE(s.size() == 3);
  CHECK(s[0]["run"] == "b");
  CHECK(s[1]["run"] == "a");
  CHECK(s[0].size() == 4);  // run + the three columns asked for
  CHECK(s[0].contains("final_train_loss"));
  const auto asc = run_mpx("report --table --format json runs --sort final_train_loss", t.path);
  REQUIRE(asc.code == 0);
  const json a = json::parse(asc.out);
  CHECK(a[0]["final_train_loss"].get<double>() <= a[1]["final_train_loss"].get<double>());
  CHECK(a[2]["run"] == "c");  // null last
}

TEST_CASE("cli compare --report: the A/B runs as one HTML report", "[cli][report]") {
  TempDir t{"mpx_test_cli_report"};
  write_file(t.path / "c.yaml", kYaml);
  const auto r = run_mpx("compare --config c.yaml --policies float32,mixed_bfloat16 --steps 4 --run-dir cmp "
                         "--no-progress --report ab.html",
                         t.path);
  REQUIRE(r.code == 0);
  const auto doc = support::parse_html(support::read_file(t.path / "ab.html"));
  const auto sections = doc.find(0, [](const support::HtmlElement& e) { return e.has_class("run"); });
  REQUIRE(sections.size() == 2);
  CHECK(doc.at(sections[0]).attr("data-run") == "float32");
  CHECK(doc.at(sections[1]).attr("data-run") == "mixed_bfloat16");
  CHECK(doc.find(0, [](const support::HtmlElement& e) { return e.attr("id") == "overlay"; }).size() == 1);
  // The figures the command prints, against float32: the same as compare.json's.
  const auto rows = doc.find(0, [](const support::HtmlElement& e) { return e.name == "tr" && !e.attr("data-policy").empty(); });
  REQUIRE(rows.size() == 2);
  const json cmp = read_json(t.path / "cmp" / "compare.json");
  for (size_t i = 0; i < 2; ++i) {
    CHECK(doc.at(rows[i]).attr("data-policy") == cmp[i]["policy"]);
    const auto cell = [&](const std::string& key) {
      const auto c = doc.find(rows[i], [&](const support::HtmlElement& e) { return e.attr("data-key") == key; });
      REQUIRE(c.size() == 1);
      return doc.at(c[0]).text;
    };
    CHECK(cell("speedup") == fmt::format("{:.2f}x", cmp[i]["speedup"].get<double>()));
    CHECK(cell("gap") == fmt::format("{:+.2f}", cmp[i]["accuracy_gap_points"].get<double>()));
    CHECK(cell("saving") == fmt::format("{:.0f}%", cmp[i]["activation_saving_percent"].get<double>()));
  }
  CHECK(doc.at(rows[0]).attr("data-policy") == "float32");
}

TEST_CASE("cli: a run timed to train.target_accuracy shows its time in the table; eval --test-data and --tta",
          "[cli][report][fast_cifar]") {
  TempDir t("mpx_cli_target");
  write_file(t.path / "c.yaml", kYaml);
  // synthetic's test split is learnt at once: a target of 0.05 is met by the first evaluation.
  REQUIRE(run_mpx("train --no-progress --config c.yaml --set train.target_accuracy=0.05 --run-dir runs/a", t.path).code == 0);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --run-dir runs/b", t.path).code == 0);
  const json sa = read_json(t.path / "runs/a/summary.json");
  CHECK(sa.at("target_met").get<bool>());
  CHECK(sa.at("target_epoch").get<int>() == 1);
  CHECK_FALSE(read_json(t.path / "runs/b/summary.json").contains("target_accuracy"));
  const auto js = run_mpx("report --table --format json runs/a runs/b", t.path);
  REQUIRE(js.code == 0);
  const json rows = json::parse(js.out);
  REQUIRE(rows.size() == 2);
  for (const json& r : rows) {
    const bool timed = r.at("run").get<std::string>() == "a";
    CHECK(r.contains("time_to_target_seconds"));
    if (timed) CHECK(r.at("time_to_target_seconds").get<double>() == sa.at("time_to_target_seconds").get<double>());
    else CHECK(r.at("time_to_target_seconds").is_null());
  }
  const auto text = run_mpx("report --table runs", t.path);
  CHECK(text.out.find("to target s") != std::string::npos);
  // Without a timed run there is no such column.
  CHECK(run_mpx("report --table runs/b", t.path).out.find("to target") == std::string::npos);

  // eval --test-data: another folder of the same data set (here the same files copied), whole file.
  const auto base = run_mpx("eval --checkpoint runs/b --json", t.path);
  REQUIRE(base.code == 0);
  const auto tta = run_mpx("eval --checkpoint runs/b --tta mirror --json", t.path);
  REQUIRE(tta.code == 0);
  CHECK(json::parse(tta.out).at("tta") == "mirror");
  CHECK(json::parse(tta.out).at("count") == json::parse(base.out).at("count"));
  CHECK(run_mpx("eval --checkpoint runs/b --tta sideways", t.path).code != 0);
  CHECK(run_mpx("eval --checkpoint runs/b --test-data no_such_folder", t.path).code != 0);

  // On CIFAR-10: a run on the subset (its 1,000 lossless test records, limited to 100), then the
  // whole 10,000-record JPEG-decoded test file of another folder.
  const std::string shared = MPX_SHARED_DATA;
  write_file(t.path / "cifar.yaml",
             "name: cif\ndevice: cpu\ndata: {dataset: cifar10, path: " + shared +
                 "/cifar10-subset, batch_size: 50, train_limit: 100, test_limit: 100}\n"
                 "model:\n  layers:\n    - {type: conv2d, filters: 4, kernel: 3}\n    - {type: flatten}\n"
                 "    - {type: dense, units: 10, activation: softmax}\ntrain: {epochs: 1}\n");
  REQUIRE(run_mpx("train --no-progress --config cifar.yaml --run-dir runs/c", t.path).code == 0);
  const auto own = run_mpx("eval --checkpoint runs/c --json", t.path);
  REQUIRE(own.code == 0);
  CHECK(json::parse(own.out).at("count") == 100);
  const auto jpeg = run_mpx("eval --checkpoint runs/c --test-data " + shared + "/cifar10-test-jpeg --json", t.path);
  REQUIRE(jpeg.code == 0);
  CHECK(json::parse(jpeg.out).at("count") == 10000);
  CHECK(json::parse(jpeg.out).at("test_data").get<std::string>().find("cifar10-test-jpeg") != std::string::npos);
  const auto cut = run_mpx("eval --checkpoint runs/c --test-data " + shared +
                               "/cifar10-test-jpeg --set data.test_limit=1000", t.path);
  REQUIRE(cut.code == 0);
  CHECK(cut.out.find("/1000 correct") != std::string::npos);
  CHECK(cut.out.find("test data ") != std::string::npos);
}
