// SPDX-License-Identifier: MIT
// In-memory data sets (uint8 NHWC images + int32 labels) and the per-epoch
// loader: deterministic shuffling from the run seed, batching, normalization
// statistics, CIFAR augmentation on the host.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace mpx {

enum class Split { Train, Test };

/// @brief A whole split in host memory, NHWC uint8.
struct Dataset {
  std::string name;  // mnist | fashion_mnist | cifar10 | synthetic
  int H = 0, W = 0, C = 0;
  int num_classes = 10;
  std::vector<uint8_t> images;  // size() * H * W * C
  std::vector<int32_t> labels;  // size()
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t image_bytes() const { return static_cast<int64_t>(H) * W * C; }
};

/// One H x W x C uint8 image translated by (dy, dx) with reflected edges, then mirrored:
/// out(y, x) = in(r(y + dy), r((flip ? W-1-x : x) + dx)), r the reflection about the edge
/// pixel without repeating it (|dy| < H, |dx| < W). The loader's reflect-padded crop and the
/// test-time augmentation's views (docs/fast-cifar.md).
void shift_reflect(const uint8_t* src, int H, int W, int C, int dy, int dx, bool flip, uint8_t* dst);

/// @brief Reads one split as DataConfig says (dataset, path, limits). Throws
/// DataError naming the file (and byte offset for corrupt files) and the
/// data_scripts/ command that fetches it.
Dataset load_dataset(const DataConfig& cfg, Split split, uint64_t seed);

/// Standard per-channel statistics of a dataset's training split (after /255).
void default_normalization(DatasetName dataset, std::vector<double>& mean, std::vector<double>& std);

/// The folder a dataset is read from when DataConfig::path is empty: "data/<dataset>".
std::string default_data_path(DatasetName dataset);

/// The data_scripts/ command that fetches `dataset` ("data_scripts/get_mnist.sh"); "" for synthetic.
std::string fetch_script(DatasetName dataset);

/// @brief One batch as the loader hands it out (host memory, reused between calls).
struct Batch {
  int64_t n = 0;                 // records in this batch (<= batch size): this rank's shard
  int64_t global_n = 0;          // records of the global batch over all ranks (== n with one rank)
  std::vector<uint8_t> images;   // n * H * W * C, NHWC
  std::vector<int32_t> labels;   // n
  std::vector<int64_t> indices;  // n: each record's index in the Dataset (tests, debugging)
};

/// @brief Iterates a Dataset in batches. Epoch e's order is a pure function of
/// (seed, e), so a resumed run sees exactly the batches it would have seen.
///
/// Data-parallel: with `world` > 1 ranks every rank computes the same global
/// order and batches of the global `batch_size`; rank r receives the r-th of
/// `world` contiguous, near-equal slices of each global batch (exactly
/// batch_size / world records when it divides). Steps and positions count
/// global batches, so they are the same on every rank.
class Loader {
 public:
  Loader(const Dataset& ds, int64_t batch_size, bool shuffle, bool drop_last, const AugmentConfig& augment,
         uint64_t seed, int rank = 0, int world = 1);
  /// The Loader keeps a reference to the Dataset: a temporary would dangle.
  Loader(Dataset&&, int64_t, bool, bool, const AugmentConfig&, uint64_t, int = 0, int = 1) = delete;
  /// Batches per epoch.
  int64_t steps_per_epoch() const;
  /// Starts epoch `epoch` (0-based) at batch `first_step` (resume mid-epoch).
  void start_epoch(int64_t epoch, int64_t first_step = 0);
  /// Fills `b` with the next batch; false at the end of the epoch.
  bool next(Batch& b);
  /// Batches already handed out in the current epoch.
  int64_t position() const { return pos_; }
  /// The current epoch (set by start_epoch; 0 before the first call).
  int64_t epoch() const { return epoch_; }
  /// Records per epoch actually handed out (all, or full batches only with drop_last).
  int64_t records_per_epoch() const;
  int64_t batch_size() const { return batch_size_; }
  /// Whether record `index` is mirrored in the current epoch (data.augment.horizontal_flip
  /// and flip_mode); a pure function of (seed, epoch, index).
  bool flips(int64_t index) const;

 private:
  const Dataset& ds_;
  int64_t batch_size_;
  bool shuffle_, drop_last_;
  AugmentConfig augment_;
  uint64_t seed_;
  int rank_ = 0, world_ = 1;
  int64_t epoch_ = 0, pos_ = 0;
  std::vector<int64_t> order_;
  uint64_t augment_seed_ = 0;  // per-epoch key of the augmentation hash

  void copy_record(int64_t index, uint8_t* dst) const;
  uint64_t epoch_augment_seed(int64_t epoch) const;
};

}  // namespace mpx
