// SPDX-License-Identifier: MIT
// Internal to lib/data: the per-format readers behind load_dataset (IDX for
// MNIST/Fashion-MNIST, CIFAR-10 binary, synthetic) and their file helpers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace mpx::data {

/// Reads a whole file, transparently gunzipping .gz content (zlib's gzread also
/// passes plain files through). Throws DataError naming the file.
std::vector<uint8_t> read_file_bytes(const std::string& path);

bool file_exists(const std::string& path);
bool dir_exists(const std::string& path);
std::string join_path(const std::string& dir, const std::string& name);

/// "<script> (offline: MPX_DATA_MIRROR=/path/to/copy <script>)" for missing-file messages.
std::string fetch_hint(DatasetName dataset, const std::string& folder);

/// MNIST / Fashion-MNIST: the two IDX files of `split` under cfg.path.
Dataset load_idx_dataset(DatasetName dataset, const std::string& folder, Split split);
/// Parses one IDX image file / label file already in memory (exposed for tests of the checks).
void parse_idx_images(const std::vector<uint8_t>& bytes, const std::string& file, int64_t& n, int& rows, int& cols,
                      std::vector<uint8_t>& images);
void parse_idx_labels(const std::vector<uint8_t>& bytes, const std::string& file, int64_t& n,
                      std::vector<int32_t>& labels);

/// CIFAR-10 binary version.
Dataset load_cifar10(const std::string& folder, Split split);

/// Synthetic, learnable, deterministic from the seed.
Dataset make_synthetic(int64_t records, Split split, uint64_t seed);

}  // namespace mpx::data
