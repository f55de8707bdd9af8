// SPDX-License-Identifier: MIT
// metrics.jsonl and summary.json writers.
#include "train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/run_dir.h"

using nlohmann::json;

namespace mpx {

json json_number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  f_ = open_for_writing(path, append);
  if (!f_) throw IoError("cannot open '" + path + "' for writing: " + open_for_writing_error(errno));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

namespace {
// JSON has no inf/NaN; nlohmann writes them as null already, but make it explicit
// (and independent of the library version) for every number in the record.
void sanitize(json& j) {
  if (j.is_number_float()) {
    if (!std::isfinite(j.get<double>())) j = nullptr;
  } else if (j.is_structured()) {
    for (auto& v : j) sanitize(v);
  }
}
}  // namespace

void MetricsWriter::write(const json& record) {
  if (!f_) return;
  json r = record;
  sanitize(r);
  const std::string line = r.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    throw IoError("cannot write '" + path_ + "': " + std::strerror(errno));
}

namespace {
/// A record the resumed run writes again: an epoch past the checkpoint's, or any
/// record of a later step.
bool after_checkpoint(const json& r, int64_t epochs, int64_t global_step) {
  if (!r.is_object()) return true;
  const auto num = [&r](const char* key) -> int64_t {
    const auto it = r.find(key);
    return it != r.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
  };
  if (r.value("kind", std::string()) == "epoch" && num("epoch") > epochs) return true;
  return num("step") > global_step;
}
}  // namespace

int trim_metrics_for_resume(const std::string& path, int64_t epochs, int64_t global_step) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return 0;  // nothing to trim (or a device: left alone)
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return 0;
  std::string text, kept;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw IoError("cannot read '" + path + "' to resume: " + std::strerror(errno));
  int dropped = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    if (end == std::string::npos) {  // a last line without its newline: cut short by a kill
      ++dropped;
      break;
    }
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    const json r = json::parse(line, nullptr, false);
    if (r.is_discarded() || after_checkpoint(r, epochs, global_step)) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  if (dropped > 0) write_file_atomic(path, kept);
  return dropped;
}

json to_json(const MemoryReport& m) {
  return json{{"activation_bytes", m.activation_bytes}, {"workspace_bytes", m.workspace_bytes},
              {"master_bytes", m.master_bytes},         {"compute_copy_bytes", m.compute_copy_bytes},
              {"grad_bytes", m.grad_bytes},             {"state_bytes", m.state_bytes}};
}

json to_json(const TrainResult& r) {
  json j;
  j["status"] = r.status;
  j["exit_code"] = r.exit_code;
  j["message"] = r.message;
  j["epochs"] = r.epochs;
  j["steps"] = r.steps;
  j["final_test_accuracy"] = json_number(r.final_test_accuracy);
  j["best_test_accuracy"] = json_number(r.best_test_accuracy);
  j["final_test_loss"] = json_number(r.final_test_loss);
  j["final_train_loss"] = json_number(r.final_train_loss);
  j["final_train_accuracy"] = json_number(r.final_train_accuracy);
  j["images_per_sec"] = json_number(r.images_per_sec);
  j["wall_seconds"] = json_number(r.wall_seconds);
  j["skipped_steps"] = r.skipped_steps;
  j["final_loss_scale"] = json_number(r.final_loss_scale);
  j["last_skip_reason"] = r.last_skip_reason;
  j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["policy"] = r.policy;
  j["device"] = r.device;
  j["eval_policy"] = r.eval_policy;
  json mem = to_json(r.memory);
  mem["optimizer_state_bytes"] = r.optimizer_state_bytes;
  j["memory"] = mem;
  j["optimizer_state_bytes"] = r.optimizer_state_bytes;
  j["run_dir"] = r.run_dir;
  add_class_results(j, r.num_classes, r.confusion);
  if (r.target_accuracy > 0) {
    j["target_accuracy"] = r.target_accuracy;
    j["target_met"] = r.target_met;
    j["target_epoch"] = r.target_met ? json(r.target_epoch) : json(nullptr);
    j["target_step"] = r.target_met ? json(r.target_step) : json(nullptr);
    j["time_to_target_seconds"] = r.target_met ? json_number(r.time_to_target_seconds) : json(nullptr);
  }
  if (r.validation_records > 0) {
    j["validation_records"] = r.validation_records;
    j["final_validation_loss"] = json_number(r.final_validation_loss);
    j["final_validation_accuracy"] = json_number(r.final_validation_accuracy);
    j["best_validation_accuracy"] = json_number(r.best_validation_accuracy);
    j["stopped_early_epoch"] = r.stopped_early_epoch > 0 ? json(r.stopped_early_epoch) : json(nullptr);
  }
  return j;
}

void add_class_results(json& j, int num_classes, const std::vector<int64_t>& confusion) {
  const size_t K = num_classes > 0 ? static_cast<size_t>(num_classes) : 0;
  if (K == 0 || confusion.size() != K * K) {
    j["per_class_accuracy"] = nullptr;
    j["confusion_matrix"] = nullptr;
    return;
  }
  json acc = json::array(), rows = json::array();
  for (size_t t = 0; t < K; ++t) {
    json row = json::array();
    int64_t sum = 0;
    for (size_t p = 0; p < K; ++p) {
      row.push_back(confusion[t * K + p]);
      sum += confusion[t * K + p];
    }
    acc.push_back(sum > 0 ? json(static_cast<double>(confusion[t * K + t]) / static_cast<double>(sum)) : json(nullptr));
    rows.push_back(std::move(row));
  }
  j["per_class_accuracy"] = std::move(acc);
  j["confusion_matrix"] = std::move(rows);
}

void write_summary(const std::string& path, const TrainResult& r) {
  json j = to_json(r);
  sanitize(j);
  write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace mpx
