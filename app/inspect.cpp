// SPDX-License-Identifier: MIT
// `mpx inspect`: one forward and backward pass on the first test images with
// every layer's activation and gradient summarized (and dumped), so the first
// layer that overflows or underflows under a policy is visible at a glance.
#include <spdlog/spdlog.h>

#include <iostream>

#include "commands.h"
#include "commands/inspect.h"
#include "config/config.h"
#include "core/error.h"

namespace mpx::app {

namespace {

struct InspectArgs {
  std::string config;
  InspectOptions opts;
  std::vector<std::string> sets;
};

void run_inspect(const InspectArgs& a) {
  const Config cfg = load_config(a.config, a.sets);
  const InspectResult r = inspect(cfg, a.opts);
  std::cout << format_inspect(r) << std::flush;
  if (!a.opts.out.empty()) spdlog::info("wrote {}", a.opts.out);
  command_exit_code() = kExitOk;
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand(
      "inspect", "One forward/backward pass on the first test images: per-layer activation and gradient statistics "
                 "(min, max, mean |x|, inf, NaN, zeros) and a safetensors dump");
  cmd->add_option("-c,--config", a->config, "YAML config file")->required()->check(CLI::ExistingFile);
  auto* w = cmd->add_option("--weights", a->opts.weights, "Weights file (.safetensors, keras or pytorch layout)")
                ->check(CLI::ExistingFile);
  cmd->add_option("--checkpoint", a->opts.checkpoint, "Checkpoint file, or a run directory (uses checkpoints/last)")
      ->check(CLI::ExistingPath)
      ->excludes(w);
  cmd->add_option("--batch", a->opts.batch, "Number of test images (the first N)")->check(CLI::PositiveNumber);
  cmd->add_option("-o,--out", a->opts.out,
                  "Dump file (.safetensors): <layer>/output, <layer>/input_grad in their dtypes, grads/<layer>/<param>, "
                  "logits, eval/logits, labels, loss, loss_scale");
  add_set_option(cmd, a->sets);
  cmd->callback([a] { run_inspect(*a); });
}

}  // namespace mpx::app
