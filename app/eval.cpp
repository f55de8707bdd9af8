// SPDX-License-Identifier: MIT
// `mpx eval`: test loss and accuracy of a checkpoint. --json prints exactly one
// object with nothing that varies between runs, so equal weights print equal text.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>

#include "commands.h"
#include "commands/eval.h"
#include "commands/inspect.h"
#include "config/config.h"
#include "core/error.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace mpx::app {

namespace {

struct EvalArgs {
  std::string config;
  std::string checkpoint;
  std::string weights;  // safetensors file instead of a checkpoint (needs --config)
  std::string test_data;  // --test-data: another folder with the data set's test file
  std::string tta;        // --tta: overrides train.tta
  std::vector<std::string> sets;
  bool json = false;
  bool no_progress = false;
};

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// Without --config: the config.yaml of the run the checkpoint belongs to
/// (<run>/ or <run>/checkpoints/<file>).
std::string config_of_checkpoint(const std::string& ckpt) {
  if (is_dir(ckpt)) {
    if (is_file(ckpt + "/config.yaml")) return ckpt + "/config.yaml";
  } else {
    const auto slash = ckpt.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : ckpt.substr(0, slash);
    if (is_file(dir + "/../config.yaml")) return dir + "/../config.yaml";
    if (is_file(dir + "/config.yaml")) return dir + "/config.yaml";
  }
  throw ConfigError("--checkpoint " + ckpt + ": no config.yaml found next to it; give --config");
}

void run_eval(const EvalArgs& a) {
  if (a.checkpoint.empty() && a.weights.empty()) throw ConfigError("eval: give --checkpoint or --weights");
  if (!a.weights.empty() && a.config.empty()) throw ConfigError("eval: --weights needs --config");
  const std::string config = a.config.empty() ? config_of_checkpoint(a.checkpoint) : a.config;
  std::vector<std::string> sets;
  if (!a.test_data.empty()) {
    // The whole test file of that folder (the run's test_limit was for its own; --set may cut it).
    sets.push_back("data.path=" + a.test_data);
    sets.push_back("data.test_limit=0");
  }
  if (!a.tta.empty()) sets.push_back("train.tta=" + a.tta);
  sets.insert(sets.end(), a.sets.begin(), a.sets.end());
  const Config cfg = load_config(config, sets);
  const bool progress = !a.no_progress && ::isatty(STDERR_FILENO) != 0;
  const EvalResult r = a.weights.empty() ? evaluate_checkpoint(cfg, a.checkpoint, progress)
                                         : evaluate_weights(cfg, a.weights, progress);
  if (a.json) {
    nlohmann::ordered_json j;
    j["loss"] = r.loss;  // shortest text that round-trips the double
    j["accuracy"] = r.accuracy;
    j["count"] = r.count;
    j["policy"] = r.policy;
    if (!a.test_data.empty()) j["test_data"] = cfg.data.path;
    if (cfg.train.tta != TtaMode::None) j["tta"] = enum_name(cfg.train.tta);
    nlohmann::json classes;
    add_class_results(classes, r.num_classes, r.confusion);
    j["per_class_accuracy"] = classes["per_class_accuracy"];
    j["confusion_matrix"] = classes["confusion_matrix"];
    print_json(j);
  } else {
    const auto correct = static_cast<int64_t>(r.accuracy * static_cast<double>(r.count) + 0.5);
    std::string extra;
    if (cfg.train.tta != TtaMode::None) extra += fmt::format(", tta {}", enum_name(cfg.train.tta));
    if (!a.test_data.empty()) extra += fmt::format(", test data {}", cfg.data.path);
    std::cout << fmt::format("test loss {:.6f}, accuracy {:.4f} ({}/{} correct), policy {}{}\n", r.loss, r.accuracy,
                             correct, r.count, r.policy, extra);
  }
  command_exit_code() = kExitOk;
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  auto* cmd = app.add_subcommand("eval", "Evaluate a checkpoint (or a --weights file) on the test split");
  cmd->add_option("-c,--config", a->config,
                  "YAML config file (default: the config.yaml of the checkpoint's run directory)")
      ->check(CLI::ExistingFile);
  auto* ck = cmd->add_option("--checkpoint", a->checkpoint, "Checkpoint file, or a run directory (uses checkpoints/last)")
                 ->check(CLI::ExistingPath);
  cmd->add_option("--weights", a->weights, "Weights file (.safetensors, keras or pytorch layout) instead of a checkpoint")
      ->check(CLI::ExistingFile)
      ->excludes(ck);
  cmd->add_option("--test-data", a->test_data,
                  "Evaluate on the whole test file of this folder instead (the same data set and file format)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--tta", a->tta, "Test-time augmentation: none, mirror or mirror_translate (default: the config's train.tta)")
      ->check(CLI::IsMember({"none", "mirror", "mirror_translate"}));
  add_set_option(cmd, a->sets);
  cmd->add_flag("--json", a->json,
                "Print one JSON object {loss, accuracy, count, policy, per_class_accuracy, confusion_matrix} "
                "on stdout (no timings: equal weights print equal text)");
  cmd->add_flag("--no-progress", a->no_progress, "No live progress line on a terminal");
  cmd->callback([a] { run_eval(*a); });
}

}  // namespace mpx::app
