// SPDX-License-Identifier: MIT
// The TrainOptions of an in-process test run: a run directory, an optional
// --resume, no progress line.
#pragma once

#include <filesystem>
#include <string>

#include "train/trainer.h"

namespace support {

inline mpx::TrainOptions options(const std::filesystem::path& run_dir, const std::string& resume = "") {
  mpx::TrainOptions o;
  o.run_dir = run_dir.string();
  o.resume = resume;
  o.progress = false;
  return o;
}

}  // namespace support
