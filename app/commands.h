// SPDX-License-Identifier: MIT
// What the sub-command files of app/ share: their registration functions (one
// file per sub-command, micromamba style), the exit code a command hands back
// to main(), and small output helpers (JSON on stdout, byte sizes, timestamps).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "core/format.h"

namespace mpx::app {

void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_validate_command(CLI::App& app);
void add_devices_command(CLI::App& app);
void add_compare_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_config_reference_command(CLI::App& app);
void add_report_command(CLI::App& app);

/// The process exit code a command's callback sets (callbacks cannot return one);
/// main() returns it after a successful parse. Failures that are exceptions
/// (mpx::Error) carry their own code instead.
int& command_exit_code();

/// Set by a command that stops at a step boundary and saves its state on SIGINT, SIGTERM or
/// SIGHUP (train, compare, bench); any other command ends at once on such a signal
/// (app/main.cpp, docs/design.md "Signals").
std::atomic<bool>& stop_at_step_boundary();

/// Adds the repeatable `--set key.path=value` option (config overrides).
CLI::Option* add_set_option(CLI::App* cmd, std::vector<std::string>& sets);

/// Prints one JSON value on stdout, on one line, and flushes.
void print_json(const nlohmann::ordered_json& j);

/// "12.3 MiB" style (binary units).
using mpx::format_bytes;
/// MiB as a double.
double to_mib(size_t bytes);
/// Local time as YYYYmmdd-HHMMSS (run directory names).
std::string timestamp_now();

}  // namespace mpx::app
