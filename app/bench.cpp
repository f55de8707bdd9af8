// SPDX-License-Identifier: MIT
// `mpx bench`: times training steps of a config (after warm-up) and reports
// throughput, step-time spread and peak memory.
#include <fmt/format.h>

#include <iostream>

#include "commands.h"
#include "commands/bench.h"
#include "config/config.h"
#include "core/error.h"
#include "train/trainer.h"

namespace mpx::app {

namespace {

struct BenchArgs {
  std::string config;
  std::vector<std::string> sets;
  int64_t steps = 20;
  int64_t warmup = 3;
  bool json = false;
};

void run_bench(const BenchArgs& a) {
  const Config cfg = load_config(a.config, a.sets);
  const BenchResult r = bench(cfg, a.steps, a.warmup);
  if (a.json) {
    nlohmann::ordered_json j;
    j["images_per_sec"] = r.images_per_sec;
    if (r.images_per_sec_pipelined > 0)
      j["images_per_sec_pipelined"] = r.images_per_sec_pipelined;
    else
      j["images_per_sec_pipelined"] = nullptr;
    j["step_ms_median"] = r.step_ms_median;
    j["step_ms_min"] = r.step_ms_min;
    j["step_ms_max"] = r.step_ms_max;
    j["peak_memory_bytes"] = r.peak_memory_bytes;
    j["activation_bytes"] = r.memory.activation_bytes;
    j["policy"] = r.policy;
    j["device"] = r.device;
    j["batch_size"] = r.batch_size;
    j["steps"] = r.steps;
    j["library"] = r.library;
    j["kernels"] = nlohmann::ordered_json::array();
    for (const auto& k : r.kernels) j["kernels"].push_back({{"op", k.op}, {"impl", k.impl}});
    j["pieces"] = r.pieces;  // docs/cpu-performance.md, "Pieces of the batch"
    j["conv_pool"] = r.conv_pool;  // "The first convolution's forward with max pooling"
    // The algorithm, math type and workspace of every cuDNN / cuBLASLt plan (docs/gpu.md).
    j["plans"] = nlohmann::ordered_json::array();
    for (const PlanReport& p : r.plans)
      j["plans"].push_back({{"library", p.library},
                            {"op", p.op},
                            {"algo", p.algo},
                            {"math", p.math},
                            {"workspace_bytes", p.workspace_bytes}});
    // Which 16-bit path the convolutions and dense layers took (docs/precision.md).
    j["math16"] = nlohmann::ordered_json::array();
    for (const Math16Report& m : r.math16)
      j["math16"].push_back({{"dtype", m.dtype},
                             {"path", m.path},
                             {"detail", m.detail},
                             {"native_ops", m.native_ops},
                             {"widened_ops", m.widened_ops}});
    print_json(j);
  } else {
    std::cout << fmt::format("device       {}\n", r.device)
              << fmt::format("policy       {}\n", r.policy)
              << fmt::format("batch size   {}\n", r.batch_size)
              << fmt::format("steps        {} (after {} warm-up)\n", r.steps, a.warmup)
              << fmt::format("images/s     {:.1f}{}\n", r.images_per_sec,
                             r.images_per_sec_pipelined > 0
                                 ? fmt::format(" (timed per step); {:.1f} pipelined (train.sync log, one block)",
                                               r.images_per_sec_pipelined)
                                 : std::string())
              << fmt::format("step time    median {:.3f} ms, min {:.3f} ms, max {:.3f} ms\n", r.step_ms_median,
                             r.step_ms_min, r.step_ms_max)
              << fmt::format("activations  {}\n", format_bytes(r.memory.activation_bytes))
              << fmt::format("peak memory  {}\n", format_bytes(r.peak_memory_bytes));
    if (!r.library.empty()) std::cout << fmt::format("library      {}\n", r.library);
    for (const Math16Report& m : r.math16)
      std::cout << fmt::format("16-bit path  {}: {}\n", m.dtype, m.detail);
    if (!r.kernels.empty()) std::cout << "kernels\n";
    for (const auto& k : r.kernels) std::cout << fmt::format("  {:<16} {}\n", k.impl, k.op);
    for (const std::string& p : r.pieces) std::cout << fmt::format("forward      {}\n", p);
    for (const std::string& p : r.conv_pool) std::cout << fmt::format("forward      {}\n", p);
  }
  command_exit_code() = kExitOk;
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "Time training steps of a config: images/s, step times, peak memory");
  cmd->add_option("-c,--config", a->config, "YAML config file")->required()->check(CLI::ExistingFile);
  add_set_option(cmd, a->sets);
  cmd->add_option("--steps", a->steps, "Timed training steps")->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", a->warmup, "Untimed warm-up steps before them")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", a->json, "Print one JSON object on stdout");
  cmd->callback([a] {
    stop_at_step_boundary().store(true);  // a stop signal saves the state at the next step
    run_bench(*a);
  });
}

}  // namespace mpx::app
