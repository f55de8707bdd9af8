// SPDX-License-Identifier: MIT
// metrics.jsonl records as TensorBoard scalars (tensorboard.h, docs/report.md).
#include "io/tensorboard.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

namespace mpx {

namespace {

float value_of(const nlohmann::json& rec, const char* key) {
  const auto it = rec.find(key);
  if (it == rec.end() || !it->is_number()) return std::numeric_limits<float>::quiet_NaN();
  return static_cast<float>(it->get<double>());
}

int64_t int_of(const nlohmann::json& rec, const char* key) {
  const auto it = rec.find(key);
  return it != rec.end() && it->is_number() ? it->get<int64_t>() : 0;
}

}  // namespace

TensorBoardLog::TensorBoardLog(const std::string& run_dir)
    : dir_((std::filesystem::path(run_dir) / "tensorboard").string()) {}

EventFileWriter& TensorBoardLog::writer(std::unique_ptr<EventFileWriter>& w, const char* sub) {
  if (!w) w = std::make_unique<EventFileWriter>((std::filesystem::path(dir_) / sub).string());
  return *w;
}

void TensorBoardLog::record(const nlohmann::json& rec) {
  const std::string kind = rec.value("kind", "");
  if (kind == "step") {
    // Keras' batch-level names (update_freq), at the global step.
    writer(train_, "train")
        .write_scalars(int_of(rec, "step"), {{"batch_loss", value_of(rec, "loss")},
                                             {"batch_accuracy", value_of(rec, "accuracy")},
                                             {"batch_learning_rate", value_of(rec, "learning_rate")},
                                             {"batch_loss_scale", value_of(rec, "loss_scale")},
                                             {"batch_skipped_steps", value_of(rec, "skipped_steps")},
                                             {"batch_images_per_sec", value_of(rec, "images_per_sec")},
                                             {"batch_memory_bytes", value_of(rec, "memory_bytes")}});
  } else if (kind == "epoch") {
    // Keras' epoch-level names at the 0-based epoch index, as Keras writes them.
    const int64_t epoch = int_of(rec, "epoch") - 1;
    writer(train_, "train")
        .write_scalars(epoch, {{"epoch_loss", value_of(rec, "train_loss")},
                               {"epoch_accuracy", value_of(rec, "train_accuracy")},
                               {"epoch_learning_rate", value_of(rec, "learning_rate")},
                               {"epoch_loss_scale", value_of(rec, "loss_scale")},
                               {"epoch_skipped_steps", value_of(rec, "skipped_steps")},
                               {"epoch_images_per_sec", value_of(rec, "images_per_sec")}});
    // Keras' "validation" curves: the validation split's where data.validation_split holds one
    // out, else the test split's (the evaluation that runs every eval_every epochs).
    const auto va = rec.find("validation_accuracy");
    const bool held_out = va != rec.end() && !va->is_null();
    const char* loss_key = held_out ? "validation_loss" : "test_loss";
    const char* acc_key = held_out ? "validation_accuracy" : "test_accuracy";
    const auto acc = rec.find(acc_key);
    if (acc == rec.end() || acc->is_null()) return;  // not evaluated this epoch
    EventFileWriter& v = writer(validation_, "validation");
    v.write_scalars(epoch, {{"epoch_loss", value_of(rec, loss_key)},  //
                            {"epoch_accuracy", value_of(rec, acc_key)}});
    // Keras' evaluation curves against the training step.
    v.write_scalars(int_of(rec, "step"), {{"evaluation_loss_vs_iterations", value_of(rec, loss_key)},
                                          {"evaluation_accuracy_vs_iterations", value_of(rec, acc_key)}});
  }
}

}  // namespace mpx
