// SPDX-License-Identifier: MIT
// Helpers shared by the sub-command files (see commands.h).
#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <iostream>

#include "commands.h"
#include "core/error.h"

namespace mpx::app {

int& command_exit_code() {
  static int code = 0;
  return code;
}

std::atomic<bool>& stop_at_step_boundary() {
  static std::atomic<bool> on{false};
  return on;
}

CLI::Option* add_set_option(CLI::App* cmd, std::vector<std::string>& sets) {
  return cmd
      ->add_option("--set", sets,
                   "Override a config key before validation, e.g. --set optimizer.learning_rate=3e-3 "
                   "(repeatable)")
      ->type_name("KEY=VALUE")
      ->default_str("")
      ->allow_extra_args(false)
      ->check([](const std::string& s) -> std::string {
        const auto eq = s.find('=');
        if (eq == std::string::npos || eq == 0) return "expected KEY=VALUE (e.g. train.epochs=3), got '" + s + "'";
        return {};
      });
}

void print_json(const nlohmann::ordered_json& j) {
  std::cout << j.dump() << '\n';
  std::cout.flush();
}

double to_mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string timestamp_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

}  // namespace mpx::app
