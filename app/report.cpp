// SPDX-License-Identifier: MIT
// `mpx report`: one HTML page of runs (curves, summaries, the table of runs), or
// with --table the table alone on stdout (docs/report.md).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "commands.h"
#include "core/error.h"
#include "report/html.h"
#include "report/table.h"

namespace mpx::app {

namespace {

struct ReportArgs {
  std::vector<std::string> dirs;
  std::string out = "report.html";
  std::string title = "mpx report";
  bool table = false;
  std::string format = "text";
  std::string sort;
  bool descending = false;
  std::vector<std::string> columns;
};

/// Config columns the text and Markdown tables show before listing the rest by name.
constexpr size_t kMaxConfigColumns = 8;

void run_report(const ReportArgs& a) {
  const report::Loaded loaded = report::load_runs(a.dirs);
  for (const auto& n : loaded.not_runs) {
    // A folder that is not there is a mistake in the command (a typo, a run not yet made);
    // a folder without run files beside runs (a glob over runs/*) only a warning.
    if (n.reason == "does not exist" || n.reason == "is not a folder")
      throw ConfigError(fmt::format("{}: {}; mpx report takes run directories or folders of runs", n.dir, n.reason));
    spdlog::warn("{}: {}", n.dir, n.reason);
  }
  if (loaded.runs.empty())
    throw ConfigError("mpx report: none of the folders given is a run directory (a run has summary.json, "
                      "metrics.jsonl or config.yaml)");
  if (a.table) {
    const report::TableFormat f = a.format == "csv"        ? report::TableFormat::Csv
                                  : a.format == "json"     ? report::TableFormat::Json
                                  : a.format == "markdown" ? report::TableFormat::Markdown
                                                           : report::TableFormat::Text;
    report::Table t = report::run_table(loaded.runs);
    if (!a.sort.empty()) report::sort_rows(t, a.sort, a.descending);
    if (!a.columns.empty()) report::select_columns(t, a.columns);
    else if (f == report::TableFormat::Text || f == report::TableFormat::Markdown)
      report::cap_config_columns(t, kMaxConfigColumns);
    std::cout << report::format_table(t, f);
    std::cout.flush();
  } else {
    report::write_report(loaded, a.title, a.out);
    spdlog::info("wrote {}: {} run{}", a.out, loaded.runs.size(), loaded.runs.size() == 1 ? "" : "s");
  }
  command_exit_code() = kExitOk;
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand(
      "report", "One HTML page of runs (curves, summaries, a sortable table), or the table of runs (--table)");
  cmd->add_option("runs", a->dirs,
                  "Run directories, or folders of runs (a compare folder, a sweep's parent)")
      ->required()
      ->type_name("RUN_DIR...");
  auto* out = cmd->add_option("-o,--out", a->out, "The HTML file to write");
  cmd->add_option("--title", a->title, "The page's title");
  auto* table = cmd->add_flag("--table", a->table, "Print the table of runs on stdout instead of writing HTML");
  table->excludes(out);
  cmd->add_option("--format", a->format, "The table's format (with --table)")
      ->check(CLI::IsMember({"text", "csv", "json", "markdown"}))
      ->needs(table);
  cmd->add_option("--sort", a->sort,
                  "Sort the table's rows by this column (a summary field such as final_test_accuracy, or a config "
                  "key); ascending, runs without a value last")
      ->needs(table);
  cmd->add_flag("--descending", a->descending, "With --sort: largest first")->needs(table);
  cmd->add_option("--columns", a->columns,
                  "Only these columns, in this order (comma-separated keys; the run name always comes first)")
      ->delimiter(',')
      ->needs(table);
  cmd->callback([a] { run_report(*a); });
}

}  // namespace mpx::app
