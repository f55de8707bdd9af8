// SPDX-License-Identifier: MIT
// `mpx train`: load the config (with --set overrides), run the trainer, print
// the run directory and a one-line result; the exit code is the run's.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <fstream>
#include <iostream>

#include "commands.h"
#include "config/config.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "train/trainer.h"

namespace mpx::app {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string run_dir;
  std::string resume;
  bool no_progress = false;
  bool json = false;
};

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

void run_train(const TrainArgs& a) {
  if (!a.resume.empty() && !path_exists(a.resume)) {
    throw ConfigError("--resume " + a.resume +
                      ": no such run directory or checkpoint file (give a run directory or its "
                      "checkpoints/last.ckpt)");
  }
  const Config cfg = load_config(a.config, a.sets);

  TrainOptions opts;
  opts.run_dir = a.run_dir;
  opts.resume = a.resume;
  opts.progress = !a.no_progress;
  const TrainResult r = train(cfg, opts);

  if (world().rank() != 0) {  // data parallel: rank 0 speaks for the job (stdout too)
    command_exit_code() = r.exit_code;
    return;
  }
  if (a.json) {
    // The run's summary.json as written, so a script needs no second read.
    std::ifstream in(r.run_dir + "/summary.json");
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(in);
    } catch (const std::exception&) {
      j = {{"status", r.status}, {"exit_code", r.exit_code}, {"run_dir", r.run_dir}};
    }
    print_json(j);
  } else {
    std::cout << "run directory: " << r.run_dir << '\n';
    if (r.status == "completed") {
      std::cout << fmt::format(
          "completed: {} epoch{}, {} steps, test accuracy {:.4f} (best {:.4f}), train loss {:.4f}, "
          "{:.0f} images/s, {:.1f} s, {} on {}",
          r.epochs, r.epochs == 1 ? "" : "s", r.steps, r.final_test_accuracy, r.best_test_accuracy,
          r.final_train_loss, r.images_per_sec, r.wall_seconds, r.policy, r.device);
      if (r.skipped_steps > 0) std::cout << fmt::format(", {} skipped steps", r.skipped_steps);
      std::cout << '\n';
    } else {
      std::cout << fmt::format("{} after {} steps (exit code {}){}{}\n", r.status, r.steps, r.exit_code,
                               r.message.empty() ? "" : ": ", r.message);
    }
    std::cout.flush();
  }
  command_exit_code() = r.exit_code;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "Train a network as a YAML config says; writes a run directory");
  cmd->add_option("-c,--config", a->config, "YAML config file")->required()->check(CLI::ExistingFile);
  add_set_option(cmd, a->sets);
  cmd->add_option("--run-dir", a->run_dir, "Run directory (default: runs/<config name>-<timestamp>)");
  cmd->add_option("--resume", a->resume,
                  "Continue a run from its run directory or a checkpoint file (bit-exact on the same backend)");
  cmd->add_flag("--no-progress", a->no_progress, "No live progress line on a terminal");
  cmd->add_flag("--json", a->json, "Print the run's summary.json on stdout instead of the result line");
  cmd->callback([a] {
    stop_at_step_boundary().store(true);  // a stop signal saves the state at the next step
    run_train(*a);
  });
}

}  // namespace mpx::app
