// SPDX-License-Identifier: MIT
// `mpx validate`: checks a config without training: prints the resolved YAML,
// builds the model on the CPU backend and prints its summary (with each layer's
// compute/variable dtype), the memory plan for the configured batch and the
// start-up precision warnings. A bad config is exit 2, like `mpx train`.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <iostream>

#include "backend/backend.h"
#include "commands.h"
#include "config/config.h"
#include "core/error.h"
#include "nn/model.h"
#include "nn/tensor_cores.h"
#include "train/optimizer.h"
#include "train/session.h"
#include "train/trainer.h"

namespace mpx::app {

namespace {

struct ValidateArgs {
  std::string config;
  std::vector<std::string> sets;
};

void run_validate(const ValidateArgs& a) {
  const Config cfg = load_config(a.config, a.sets);

  // Device and policy as `mpx train` would resolve them on this machine; the model is planned on the CPU.
  std::unique_ptr<Session> session;
  try {
    session = std::make_unique<Session>(cfg);
  } catch (const Error& e) {
    spdlog::warn("device '{}' is not usable here ({}); validating for the CPU", cfg.device, e.what());
    Config cpu_cfg = cfg;
    cpu_cfg.device = "cpu";
    session = std::make_unique<Session>(cpu_cfg);
  }
  session->plan_on_cpu();
  const std::string device = session->device().device, device_reason = session->device().reason;
  const DeviceInfo& info = session->target();
  const bool gpu_visible = device != "cpu" && session->target_visible();
  const Policy policy = session->policy();
  const std::string policy_reason = session->policy_reason();
  const int H = session->H(), W = session->W(), C = session->C();
  const int num_classes = session->num_classes();  // every supported data set has 10 classes
  const int64_t batch = cfg.data.batch_size;
  // Planned, not allocated: validate reports a plan too large instead of running out of memory.
  std::unique_ptr<Model> model_ptr = session->plan_model(batch);
  const Model& model = *model_ptr;
  const MemoryReport m = model.memory_report();
  const size_t opt_bytes = Optimizer::state_bytes_for(cfg.optimizer, model.num_params());

  const std::string yaml = to_yaml(cfg);
  std::cout << "# resolved configuration (" << a.config << ")\n" << yaml;
  if (!yaml.empty() && yaml.back() != '\n') std::cout << '\n';
  std::cout << "\n# ---- model ----\n";
  // The reasons already name what was chosen ("device cpu (set in the config)").
  std::cout << (device_reason.empty() ? "device " + device : device_reason) << '\n';
  std::cout << (policy_reason.empty() ? std::string("policy ") + policy_name(policy) : policy_reason) << '\n';
  std::cout << fmt::format("input: {}x{}x{} (HxWxC), {} classes\n\n", H, W, C, num_classes);
  const std::string table = model.summary_table();
  std::cout << table;
  if (!table.empty() && table.back() != '\n') std::cout << '\n';

  const size_t total = m.activation_bytes + m.workspace_bytes + m.master_bytes + m.grad_bytes +
                       m.compute_copy_bytes + m.state_bytes + opt_bytes;
  std::cout << fmt::format("\nmemory for batch {} (planned once, before training):\n", batch)
            << fmt::format("  activations       {:>12}\n", format_bytes(m.activation_bytes))
            << fmt::format("  workspace         {:>12}\n", format_bytes(m.workspace_bytes))
            << fmt::format("  master weights    {:>12}  (float32)\n", format_bytes(m.master_bytes))
            << fmt::format("  gradients         {:>12}  (float32)\n", format_bytes(m.grad_bytes))
            << fmt::format("  compute copy      {:>12}\n", format_bytes(m.compute_copy_bytes))
            << fmt::format("  batch-norm state  {:>12}\n", format_bytes(m.state_bytes))
            << fmt::format("  optimizer state   {:>12}  ({})\n", format_bytes(opt_bytes), cfg.optimizer.name)
            << fmt::format("  total             {:>12}\n", format_bytes(total));

  const auto warnings = session->warnings();
  if (warnings.empty()) {
    std::cout << "\nprecision warnings: none\n";
  } else {
    std::cout << "\nprecision warnings:\n";
    for (const auto& w : warnings) std::cout << "  - " << w << '\n';
  }
  // Tensor Cores: only for a config that runs on a GPU (device cuda / cuda:N, or auto where one is present).
  if (device.rfind("cuda", 0) == 0) {
    const int cc = gpu_visible ? info.compute_capability : 0;
    const auto tc = tensor_core_warnings(model, batch, cc);
    const std::string target =
        gpu_visible ? fmt::format("{}, compute capability {}.{}", device, cc / 10, cc % 10)
                    : fmt::format("{}; no GPU visible here, so the shapes only", device);
    if (tc.empty()) {
      std::cout << "\ntensor core warnings (" << target << "): none\n";
    } else {
      std::cout << "\ntensor core warnings (" << target << "):\n";
      for (const auto& w : tc) std::cout << "  - " << w << '\n';
      spdlog::warn("{} place{} where Tensor Cores will sit idle on {} (listed under 'tensor core warnings')",
                   tc.size(), tc.size() == 1 ? "" : "s", device);
    }
  }
  // On the CPU, the plan must fit the machine's memory (a GPU's is known only where it runs).
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const size_t host = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  if (device == "cpu" && host > 0 && total > host) {
    std::cout << fmt::format("\nmemory: the plan needs {}, more than the {} of memory of this machine\n",
                             format_bytes(total), format_bytes(host));
    std::cout.flush();
    throw ConfigError(fmt::format("{}: the memory plan for batch {} needs {} ({} bytes), more than this machine's {} "
                                  "of memory: lower data.batch_size, the input shape or the layer widths",
                                  a.config, batch, format_bytes(total), total, format_bytes(host)));
  }
  std::cout << "\nconfig OK\n";
  command_exit_code() = kExitOk;
}

}  // namespace

void add_validate_command(CLI::App& app) {
  auto a = std::make_shared<ValidateArgs>();
  auto* cmd = app.add_subcommand(
      "validate", "Check a config: print it resolved, the model summary with dtypes, its memory and warnings");
  cmd->add_option("-c,--config", a->config, "YAML config file")->required()->check(CLI::ExistingFile);
  add_set_option(cmd, a->sets);
  cmd->callback([a] { run_validate(*a); });
}

}  // namespace mpx::app
