// SPDX-License-Identifier: MIT
// `mpx compare`: trains one config from one seed under several policies, one
// after another (a run directory each), and prints one table of accuracy,
// speed and memory against float32: the question mixed precision must answer.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <optional>

#include "commands.h"
#include "config/config.h"
#include "core/error.h"
#include "data/dataset.h"
#include "io/run_dir.h"
#include "report/html.h"
#include "train/trainer.h"

namespace mpx::app {

namespace {

struct CompareArgs {
  std::string config;
  std::vector<std::string> policies{"float32", "mixed_float16", "mixed_bfloat16"};
  std::vector<std::string> sets;
  int64_t steps = 0;
  int64_t epochs = 0;
  std::string run_dir;
  bool no_progress = false;
  bool json = false;
  std::string report;  // also write the runs as an HTML report (mpx report)
};

struct Row {
  std::string policy;
  TrainResult r;
};

/// Training steps per epoch of `cfg` (loads the training split to count it).
int64_t steps_per_epoch(const Config& cfg) {
  const Dataset ds = load_dataset(cfg.data, Split::Train, cfg.seed);
  const int64_t n = ds.size(), b = cfg.data.batch_size;
  if (b <= 0) return 1;
  const int64_t s = cfg.data.drop_last ? n / b : (n + b - 1) / b;
  return std::max<int64_t>(s, 1);
}

std::string or_dash(const std::optional<double>& v, const char* fmt_spec) {
  return v ? fmt::format(fmt::runtime(fmt_spec), *v) : std::string("-");
}

nlohmann::ordered_json opt_json(const std::optional<double>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

void run_compare(const CompareArgs& a) {
  // Validate the config once before any run, and size the runs.
  std::vector<std::string> common = a.sets;
  const Config base_cfg = load_config(a.config, common);
  if (a.steps > 0) {
    common.push_back("train.max_steps=" + std::to_string(a.steps));
    const int64_t spe = steps_per_epoch(base_cfg);
    const int64_t need = (a.steps + spe - 1) / spe;
    if (need > base_cfg.train.epochs) common.push_back("train.epochs=" + std::to_string(need));
  } else if (a.epochs > 0) {
    common.push_back("train.epochs=" + std::to_string(a.epochs));
    common.push_back("train.max_steps=0");
  }
  std::vector<std::string> policies;
  for (const auto& p : a.policies) {
    if (std::find(policies.begin(), policies.end(), p) != policies.end())
      throw ConfigError("--policies: '" + p + "' is listed twice");
    policies.push_back(p);
  }
  // Every policy's config is checked before the first (long) run starts.
  std::vector<Config> configs;
  for (const auto& p : policies) {
    auto sets = common;
    sets.push_back("policy=" + p);
    configs.push_back(load_config(a.config, sets));
  }

  const std::string base = a.run_dir.empty() ? "runs/compare-" + base_cfg.name + "-" + timestamp_now() : a.run_dir;
  ::mkdir("runs", 0777);
  ::mkdir(base.c_str(), 0777);

  std::vector<Row> rows;
  int exit_code = kExitOk;
  for (size_t i = 0; i < policies.size(); ++i) {
    spdlog::info("compare [{}/{}]: {} -> {}/{}", i + 1, policies.size(), policies[i], base, policies[i]);
    TrainOptions opts;
    opts.run_dir = base + "/" + policies[i];
    opts.progress = !a.no_progress;
    Row row{policies[i], train(configs[i], opts)};
    if (row.r.status != "completed") {
      spdlog::warn("compare: {} ended {} (exit code {}){}{}", policies[i], row.r.status, row.r.exit_code,
                   row.r.message.empty() ? "" : ": ", row.r.message);
      if (exit_code == kExitOk) exit_code = row.r.exit_code;
    }
    rows.push_back(std::move(row));
    if (stop_requested().load()) {
      exit_code = kExitInterrupted;
      break;
    }
  }

  // Baseline: the completed float32 run (gaps and ratios are "-" without one).
  const TrainResult* ref = nullptr;
  for (const auto& row : rows)
    if (row.policy == "float32" && row.r.status == "completed") ref = &row.r;

  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  struct Cells {
    std::optional<double> gap, speedup, saving;
  };
  std::vector<Cells> cells;
  for (const auto& row : rows) {
    const TrainResult& r = row.r;
    Cells c;
    if (ref && r.status == "completed") {
      c.gap = (r.final_test_accuracy - ref->final_test_accuracy) * 100.0;
      if (ref->images_per_sec > 0) c.speedup = r.images_per_sec / ref->images_per_sec;
      if (ref->memory.activation_bytes > 0)
        c.saving = (1.0 - static_cast<double>(r.memory.activation_bytes) /
                              static_cast<double>(ref->memory.activation_bytes)) * 100.0;
    }
    cells.push_back(c);
    nlohmann::ordered_json j;
    j["policy"] = row.policy;
    j["status"] = r.status;
    j["exit_code"] = r.exit_code;
    j["steps"] = r.steps;
    j["final_loss"] = r.final_train_loss;
    j["test_accuracy"] = r.final_test_accuracy;
    j["accuracy_gap_points"] = opt_json(c.gap);
    j["images_per_sec"] = r.images_per_sec;
    j["speedup"] = opt_json(c.speedup);
    j["activation_bytes"] = r.memory.activation_bytes;
    j["activation_mib"] = to_mib(r.memory.activation_bytes);
    j["activation_saving_percent"] = opt_json(c.saving);
    j["peak_memory_bytes"] = r.peak_memory_bytes;
    j["skipped_steps"] = r.skipped_steps;
    j["final_loss_scale"] = r.final_loss_scale;
    j["device"] = r.device;
    j["run_dir"] = r.run_dir;
    arr.push_back(j);
  }
  write_file_atomic(base + "/compare.json", arr.dump(2) + "\n");
  if (!a.report.empty()) {
    std::vector<std::string> dirs;
    for (const auto& row : rows) dirs.push_back(base + "/" + row.policy);
    report::Loaded loaded = report::load_runs(dirs);
    loaded.comparison = nlohmann::json::parse(arr.dump());  // the table above, on the page
    report::write_report(loaded, "mpx compare: " + base_cfg.name, a.report);
    spdlog::info("compare: wrote the report {}", a.report);
  }

  if (a.json) {
    print_json(arr);
  } else {
    std::cout << fmt::format("compare: {} from seed {}, runs in {}\n\n", base_cfg.name, base_cfg.seed, base);
    std::cout << fmt::format("{:<15} {:<11} {:>10} {:>9} {:>9} {:>10} {:>8} {:>9} {:>8} {:>11} {:>7} {:>10}\n",
                             "policy", "status", "final loss", "test acc", "gap pts", "images/s", "speed-up",
                             "act MiB", "act save", "peak mem", "skipped", "loss scale");
    for (size_t i = 0; i < rows.size(); ++i) {
      const TrainResult& r = rows[i].r;
      std::cout << fmt::format(
          "{:<15} {:<11} {:>10.4f} {:>9.4f} {:>9} {:>10.1f} {:>8} {:>9.2f} {:>8} {:>11} {:>7} {:>10g}\n",
          rows[i].policy, r.status, r.final_train_loss, r.final_test_accuracy, or_dash(cells[i].gap, "{:+.2f}"),
          r.images_per_sec, or_dash(cells[i].speedup, "{:.2f}x"), to_mib(r.memory.activation_bytes),
          or_dash(cells[i].saving, "{:.0f}%"), format_bytes(r.peak_memory_bytes), r.skipped_steps,
          r.final_loss_scale);
    }
    if (!ref) std::cout << "\n(no completed float32 run: gaps, speed-ups and savings are not shown)\n";
  }
  command_exit_code() = exit_code;
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto a = std::make_shared<CompareArgs>();
  auto* cmd = app.add_subcommand(
      "compare", "Train one config under several policies from the same seed; one table of accuracy, speed, memory");
  cmd->add_option("-c,--config", a->config, "YAML config file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--policies", a->policies, "Policies to compare, in this order (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"float32", "mixed_float16", "mixed_bfloat16", "auto"}));
  auto* steps = cmd->add_option("--steps", a->steps, "Train each policy for this many steps (train.max_steps; default: as the config says)")
                    ->default_str("")
                    ->check(CLI::PositiveNumber);
  auto* epochs = cmd->add_option("--epochs", a->epochs, "Train each policy for this many epochs (train.epochs; default: as the config says)")
                     ->default_str("")
                     ->check(CLI::PositiveNumber);
  steps->excludes(epochs);
  add_set_option(cmd, a->sets);
  cmd->add_option("--run-dir", a->run_dir,
                  "Parent of the per-policy run directories (default: runs/compare-<name>-<timestamp>)");
  cmd->add_flag("--no-progress", a->no_progress, "No live progress line on a terminal");
  cmd->add_flag("--json", a->json, "Print one JSON array (an object per policy) on stdout");
  cmd->add_option("--report", a->report, "Also write the runs as one HTML report (as mpx report does) to this file");
  cmd->callback([a] {
    stop_at_step_boundary().store(true);  // a stop signal saves the state at the next step
    run_compare(*a);
  });
}

}  // namespace mpx::app
