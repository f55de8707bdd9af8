// SPDX-License-Identifier: MIT
// `mpx export`: a checkpoint's float32 master weights and batch-norm moving
// statistics as a safetensors file in Keras or PyTorch names and layouts.
#include <fmt/format.h>
#include <mpx/config.hpp>
#include <spdlog/spdlog.h>

#include "backend/backend.h"
#include "commands.h"
#include "config/config.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "nn/model.h"
#include "train/session.h"
#include "weights/weights.h"

namespace mpx::app {

namespace {

struct ExportArgs {
  std::string config, checkpoint, out, layout = "keras";
  std::vector<std::string> sets;
};

void run_export(const ExportArgs& a) {
  const Config cfg = load_config(a.config, a.sets);
  const WeightsLayout layout = *parse_weights_layout(a.layout);
  std::string policy = policy_name(cfg.policy), source;
  std::optional<Checkpoint> ck;
  std::string ck_path;
  if (!a.checkpoint.empty()) {
    ck_path = resolve_checkpoint_path(a.checkpoint);
    ck = load_checkpoint(ck_path);
    policy = ck->header.policy;
  }
  // Storage only: the master weights are float32 whatever the policy, so the CPU backend will do.
  Config storage = cfg;
  storage.device = "cpu";
  Session session(storage);
  session.plan_on_cpu();
  const auto p = parse_policy(policy);
  const Shape in = session.input_shape();
  std::unique_ptr<Model> model_ptr = session.make_model(1, p && *p != Policy::Auto ? *p : Policy::Float32, cfg);
  Model& model = *model_ptr;
  source = session.init_weights(model, "", a.checkpoint);
  if (!ck && cfg.weights.init_from.empty())
    spdlog::info("no --checkpoint: exporting the initial weights (seed {})", cfg.seed);
  const StFile f = export_weights(model, session.backend(), cfg, in, layout,
                                  {{"config", cfg.name}, {"policy", policy}, {"mpx_version", MPX_VERSION},
                                   {"dataset", enum_name(cfg.data.dataset)}, {"source", source}});
  write_safetensors(a.out, f);
  size_t bytes = 0;
  for (const auto& t : f.tensors) bytes += t.bytes.size();
  spdlog::info("wrote {}: {} float32 tensors ({}), {} layout, from {}", a.out, f.tensors.size(), format_bytes(bytes),
               weights_layout_name(layout), source);
  command_exit_code() = kExitOk;
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand(
      "export", "Write a checkpoint's float32 weights (and batch-norm statistics) as safetensors, in Keras or PyTorch "
                "names and layouts");
  cmd->add_option("-c,--config", a->config, "YAML config file of the model")->required()->check(CLI::ExistingFile);
  cmd->add_option("--checkpoint", a->checkpoint,
                  "Checkpoint file, or a run directory (uses checkpoints/last); default: weights.init_from, else the "
                  "seeded initialization")
      ->check(CLI::ExistingPath);
  cmd->add_option("-o,--out", a->out, "Output .safetensors file (written atomically)")->required();
  cmd->add_option("--layout", a->layout,
                  "keras: <layer>/kernel (conv HWIO, dense (in, out)), gamma, beta, moving_mean, moving_variance; "
                  "pytorch: <layer>.weight (conv OIHW, linear (out, in)), bias, running_mean, running_var")
      ->check(CLI::IsMember({"keras", "pytorch"}));
  add_set_option(cmd, a->sets);
  cmd->callback([a] { run_export(*a); });
}

}  // namespace mpx::app
