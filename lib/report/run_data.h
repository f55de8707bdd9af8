// SPDX-License-Identifier: MIT
// What `mpx report` reads from run directories: summary.json, config.yaml and
// metrics.jsonl, with a status for every run (also the failed, diverged,
// interrupted and unfinished ones) and a reason for every folder that is not a
// run (docs/report.md).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mpx::report {

/// @brief One run directory as the report shows it.
struct RunData {
  std::string dir;      // the path as given (or found under a folder of runs)
  std::string name;     // a short unique label: the folder name, with its parent when names repeat
  std::string status;   // summary.json's status; "running" or "incomplete" without one; "unreadable"
  std::string message;  // summary.json's message, or why the status is what it is
  nlohmann::json summary = nlohmann::json::object();  // {} without summary.json
  /// config.yaml flattened to "key.path" / "key[i]" -> the value's YAML text, in file order.
  std::vector<std::pair<std::string, std::string>> config;
  std::string config_text;  // config.yaml as written
  std::vector<nlohmann::json> steps, epochs;  // metrics.jsonl records of kind step / epoch
  int bad_metrics_lines = 0;                  // lines of metrics.jsonl that are not JSON (a cut-off last line)
  /// The step and epoch records metrics.jsonl holds; `steps` and `epochs` keep at most
  /// kMaxCurvePoints of each, evenly spaced, and the last one.
  size_t step_records = 0, epoch_records = 0;
};

/// What `mpx report` reads of a run directory (docs/inputs.md, "Run directories").
constexpr size_t kMaxCurvePoints = 2048;          // records of one kind kept per run (decimated beyond)
constexpr size_t kMaxMetricsLine = 64 * 1024;     // bytes; a longer line counts as unreadable
constexpr size_t kMaxRecordFields = 64;           // numeric fields kept per record
constexpr size_t kMaxSummaryBytes = 1024 * 1024;  // summary.json
constexpr int kMaxJsonDepth = 32;                 // nesting of a summary.json or metrics.jsonl value

/// @brief A folder given to `mpx report` that holds no run, and why.
struct NotARun {
  std::string dir, reason;
};

struct Loaded {
  std::vector<RunData> runs;
  std::vector<NotARun> not_runs;
};

/**
 * @brief Reads every folder of `dirs`. A folder with summary.json, metrics.jsonl or
 * config.yaml is a run; a folder without them whose sub-folders are runs (a
 * `mpx compare` folder, a sweep's parent) stands for those runs, in name order;
 * anything else is a NotARun with the reason. A run file that is not a regular file or
 * is larger than its limit throws DataError naming it; nothing else throws for a bad folder.
 */
Loaded load_runs(const std::vector<std::string>& dirs);

/// One run directory (the folder must be a run: see load_runs).
RunData load_run(const std::string& dir);

/// The config keys whose values are not the same in every run (a key missing from a run
/// counts as different), in the order of the first run that has them.
std::vector<std::string> differing_keys(const std::vector<RunData>& runs);

/// The value of a flattened config key in `run`, "" when it has none.
std::string config_value(const RunData& run, const std::string& key);

}  // namespace mpx::report
