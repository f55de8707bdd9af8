// SPDX-License-Identifier: MIT
// The machine-readable records of a run: metrics.jsonl (one JSON object per
// line, flushed as written) and summary.json (written atomically).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "train/train_result.h"

namespace mpx {

/// @brief Appends JSON objects to metrics.jsonl, one per line, flushed each line.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  /// Opens `path` for appending (`append`) or truncates it. Throws Error.
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  bool is_open() const { return f_ != nullptr; }
  /// One line; non-finite numbers are written as null (JSON has no inf/NaN).
  void write(const nlohmann::json& record);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

/**
 * @brief Before a resume appends to `path` (metrics.jsonl): drops the records written
 * after the checkpoint being resumed (completed `epochs`, `global_step`), which the
 * resumed run writes again, and a last line cut short by a kill. A run killed between
 * its metrics record and its checkpoint would otherwise list that epoch twice.
 * Rewrites the file atomically; returns the number of lines dropped. Throws IoError.
 */
int trim_metrics_for_resume(const std::string& path, int64_t epochs, int64_t global_step);

/// Every TrainResult field (summary.json); non-finite numbers become null.
nlohmann::json to_json(const TrainResult& r);
nlohmann::json to_json(const MemoryReport& m);
/// Writes summary.json atomically (pretty-printed).
void write_summary(const std::string& path, const TrainResult& r);

/// A double that JSON can hold: itself, or null when inf/NaN.
nlohmann::json json_number(double v);

/// Sets j["per_class_accuracy"] (one number per class, null for a class without records)
/// and j["confusion_matrix"] (rows: true class, columns: predicted class) from a K x K
/// confusion matrix (EvalResult); both null when it is empty (docs/report.md).
void add_class_results(nlohmann::json& j, int num_classes, const std::vector<int64_t>& confusion);

}  // namespace mpx
