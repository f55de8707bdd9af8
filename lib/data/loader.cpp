// SPDX-License-Identifier: MIT
// The Loader: per-epoch shuffle, batching and host-side augmentation. Every
// random choice is a pure function of (seed, epoch, record index), so a run
// resumed at (epoch, step) sees bit-exactly the batches it would have seen.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "data/dataset.h"

namespace mpx {

Loader::Loader(const Dataset& ds, int64_t batch_size, bool shuffle, bool drop_last, const AugmentConfig& augment,
               uint64_t seed, int rank, int world)
    : ds_(ds), batch_size_(batch_size), shuffle_(shuffle), drop_last_(drop_last), augment_(augment), seed_(seed),
      rank_(rank), world_(world) {
  MPX_CHECK_MSG(world_ >= 1 && rank_ >= 0 && rank_ < world_,
                "rank " + std::to_string(rank_) + " of " + std::to_string(world_));
  if (batch_size_ <= 0) throw ConfigError("data.batch_size must be > 0, got " + std::to_string(batch_size_));
  if (augment_.random_crop_padding < 0) {
    throw ConfigError("data.augment.random_crop_padding must be >= 0, got " +
                      std::to_string(augment_.random_crop_padding));
  }
  if (augment_.padding_mode == PadMode::Reflect && augment_.random_crop_padding > 0 &&
      (augment_.random_crop_padding >= ds_.H || augment_.random_crop_padding >= ds_.W)) {
    throw ConfigError("data.augment.padding_mode: reflect needs data.augment.random_crop_padding (" +
                      std::to_string(augment_.random_crop_padding) + ") smaller than the image's height and width (" +
                      std::to_string(ds_.H) + "x" + std::to_string(ds_.W) +
                      "): lower the padding or use padding_mode: zeros");
  }
  if (ds_.size() == 0) throw DataError("data set '" + ds_.name + "' holds no records");
  if (steps_per_epoch() == 0) {
    throw ConfigError("data.drop_last is true and data.batch_size " + std::to_string(batch_size_) + " exceeds the " +
                      std::to_string(ds_.size()) + " records of '" + ds_.name +
                      "': an epoch would hold no batch (lower batch_size or set drop_last: false)");
  }
  start_epoch(0, 0);
}

int64_t Loader::steps_per_epoch() const {
  const int64_t n = ds_.size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

int64_t Loader::records_per_epoch() const {
  return drop_last_ ? steps_per_epoch() * batch_size_ : ds_.size();
}

void Loader::start_epoch(int64_t epoch, int64_t first_step) {
  MPX_CHECK_MSG(epoch >= 0, "epoch " + std::to_string(epoch));
  if (first_step < 0 || first_step > steps_per_epoch()) {
    throw Error("Loader::start_epoch: step " + std::to_string(first_step) + " outside [0, " +
                std::to_string(steps_per_epoch()) + "] (resume position does not fit this data set and batch size)");
  }
  epoch_ = epoch;
  pos_ = first_step;
  const int64_t n = ds_.size();
  order_.resize(static_cast<size_t>(n));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (shuffle_) {
    // Fisher-Yates; the order of epoch e depends on (seed, e) only.
    Rng rng(mix64(seed_ ^ static_cast<uint64_t>(epoch + 1)));
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(i + 1)));
      std::swap(order_[i], order_[j]);
    }
  }
  augment_seed_ = epoch_augment_seed(epoch);
}

uint64_t Loader::epoch_augment_seed(int64_t epoch) const {
  return mix64(seed_ ^ mix64(0x617567ULL + static_cast<uint64_t>(epoch)));  // "aug"
}

bool Loader::flips(int64_t index) const {
  if (!augment_.horizontal_flip) return false;
  const uint64_t key = static_cast<uint64_t>(index) * 4 + 2;
  if (augment_.flip_mode == FlipMode::Random) return hash_uniform(augment_seed_, key) < 0.5f;
  // Alternating: epoch 0's coin, inverted on odd epochs (docs/fast-cifar.md, "Augmentation").
  const bool first = hash_uniform(epoch_augment_seed(0), key) < 0.5f;
  return first != (epoch_ % 2 == 1);
}

namespace {

/// Position i of a row of n values padded by reflection about its end values (n > 1, and
/// |i| < n - 1 past either end: the padding is below the size).
inline int reflect_index(int i, int n) {
  if (i < 0) return -i;
  if (i >= n) return 2 * (n - 1) - i;
  return i;
}

}  // namespace

void shift_reflect(const uint8_t* src, int H, int W, int C, int dy, int dx, bool flip, uint8_t* dst) {
  for (int y = 0; y < H; ++y) {
    uint8_t* out = dst + static_cast<int64_t>(y) * W * C;
    const uint8_t* row = src + static_cast<int64_t>(reflect_index(y + dy, H)) * W * C;
    for (int x = 0; x < W; ++x) {
      const int sx = reflect_index((flip ? W - 1 - x : x) + dx, W);
      std::memcpy(out + x * C, row + sx * C, static_cast<size_t>(C));
    }
  }
}

void Loader::copy_record(int64_t index, uint8_t* dst) const {
  const int64_t bytes = ds_.image_bytes();
  const uint8_t* src = ds_.images.data() + index * bytes;
  const int pad = augment_.random_crop_padding;
  if (pad == 0 && !augment_.horizontal_flip) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
  // Crop from the zero-padded image at offset (pad + dy, pad + dx), then mirror:
  // out(y, x) = in(y + dy, (flip ? W-1-x : x) + dx), zero outside the image.
  const uint64_t key = static_cast<uint64_t>(index) * 4;
  int dy = 0, dx = 0;
  if (pad > 0) {
    const int span = 2 * pad + 1;
    dy = std::min(static_cast<int>(hash_uniform(augment_seed_, key + 0) * span), span - 1) - pad;
    dx = std::min(static_cast<int>(hash_uniform(augment_seed_, key + 1) * span), span - 1) - pad;
  }
  const bool flip = flips(index);
  const int H = ds_.H, W = ds_.W, C = ds_.C;
  if (augment_.padding_mode == PadMode::Reflect && pad > 0) {
    shift_reflect(src, H, W, C, dy, dx, flip, dst);
    return;
  }
  for (int y = 0; y < H; ++y) {
    uint8_t* out = dst + static_cast<int64_t>(y) * W * C;
    const int sy = y + dy;
    if (sy < 0 || sy >= H) {
      std::memset(out, 0, static_cast<size_t>(W) * C);
      continue;
    }
    const uint8_t* row = src + static_cast<int64_t>(sy) * W * C;
    if (!flip) {
      // Source columns x + dx: a shifted copy with zeros at one edge, valid for x in [x0, x1).
      const int x0 = std::max(0, -dx), x1 = std::min(W, W - dx);
      if (x1 <= x0) {  // shifted out entirely (padding >= width)
        std::memset(out, 0, static_cast<size_t>(W) * C);
        continue;
      }
      std::memset(out, 0, static_cast<size_t>(x0) * C);
      std::memcpy(out + x0 * C, row + (x0 + dx) * C, static_cast<size_t>(x1 - x0) * C);
      std::memset(out + x1 * C, 0, static_cast<size_t>(W - x1) * C);
    } else {
      // Source column W-1-x+dx is inside the image for x in [x0, x1).
      const int x0 = std::max(0, dx), x1 = std::min(W, W + dx);
      if (x1 <= x0) {
        std::memset(out, 0, static_cast<size_t>(W) * C);
        continue;
      }
      std::memset(out, 0, static_cast<size_t>(x0) * C);
      std::memset(out + x1 * C, 0, static_cast<size_t>(W - x1) * C);
      const uint8_t* s = row + (W - 1 - x0 + dx) * C;  // walks left as x walks right
      if (C == 1) {
        for (int x = x0; x < x1; ++x, --s) out[x] = *s;
      } else {
        for (int x = x0; x < x1; ++x, s -= C)
          for (int c = 0; c < C; ++c) out[x * C + c] = s[c];
      }
    }
  }
}

bool Loader::next(Batch& b) {
  if (pos_ >= steps_per_epoch()) return false;
  // The global batch [g0, g0 + gn) of the epoch's order; this rank's slice of it.
  const int64_t g0 = pos_ * batch_size_;
  const int64_t gn = std::min(batch_size_, ds_.size() - g0);
  const int64_t base = gn / world_, extra = gn % world_;
  const int64_t start = g0 + rank_ * base + std::min<int64_t>(rank_, extra);
  const int64_t n = base + (rank_ < extra ? 1 : 0);
  const int64_t bytes = ds_.image_bytes();
  // Size the buffers for a full batch once; later batches (and the shorter last one) reuse them.
  if (b.images.capacity() < static_cast<size_t>(batch_size_ * bytes)) b.images.reserve(batch_size_ * bytes);
  if (b.labels.capacity() < static_cast<size_t>(batch_size_)) b.labels.reserve(batch_size_);
  if (b.indices.capacity() < static_cast<size_t>(batch_size_)) b.indices.reserve(batch_size_);
  b.n = n;
  b.global_n = gn;
  b.images.resize(static_cast<size_t>(n * bytes));
  b.labels.resize(static_cast<size_t>(n));
  b.indices.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t idx = order_[start + i];
    b.indices[i] = idx;
    b.labels[i] = ds_.labels[idx];
    copy_record(idx, b.images.data() + i * bytes);
  }
  ++pos_;
  return true;
}

}  // namespace mpx
