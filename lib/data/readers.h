// SPDX-License-Identifier: MIT
// Internal to lib/data: the per-format readers behind load_dataset (IDX for
// MNIST/Fashion-MNIST, CIFAR-10 binary, synthetic) and their file helpers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace mpx::data {

/// No data file's content (decompressed) may exceed this: 4 GiB, far above the
/// largest file of the formats mpx reads (docs/inputs.md).
constexpr uint64_t kMaxDataFileBytes = uint64_t{1} << 32;
/// Deflate cannot expand data by more than about 1032:1; a gzip file whose
/// header promises more than this many times its size cannot hold it.
constexpr uint64_t kMaxGzipRatio = 1032;

/// The first bytes of a file's content.
struct FileContent {
  std::vector<uint8_t> bytes;
  bool more = false;       // content continues past `bytes`
  bool gzip = false;       // the file is gzip (the bytes are the inflated content)
  uint64_t disk_size = 0;  // the file's size on disk (0 when not a regular file)
};

/// Reads at most `limit` bytes of `path`'s content, gunzipping gzip files (one
/// or more whole members, found by their magic bytes; anything else after the
/// last member is an error); nothing past `limit` + 1 is read or inflated.
/// Throws DataError naming the file (and the byte offset, for corrupt gzip).
FileContent read_file_prefix(const std::string& path, uint64_t limit);
/// The whole content of `path`; more than `max_bytes` is a DataError naming the file.
std::vector<uint8_t> read_file_bytes(const std::string& path, uint64_t max_bytes = kMaxDataFileBytes);

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
