// SPDX-License-Identifier: MIT
// A run's TensorBoard scalars: every metrics.jsonl record also becomes scalars in
// <run>/tensorboard/train and <run>/tensorboard/validation, under the tags Keras'
// TensorBoard callback uses (docs/report.md has the table of tags and steps).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "io/event_file.h"

namespace mpx {

class TensorBoardLog {
 public:
  /// The folders are created and the files opened on the first record.
  explicit TensorBoardLog(const std::string& run_dir);
  /// One metrics.jsonl record ("kind" step or epoch) as scalars; other kinds are ignored.
  /// A null number (non-finite in the run) is written as NaN.
  void record(const nlohmann::json& rec);

 private:
  EventFileWriter& writer(std::unique_ptr<EventFileWriter>& w, const char* sub);
  std::string dir_;
  std::unique_ptr<EventFileWriter> train_, validation_;
};

}  // namespace mpx
