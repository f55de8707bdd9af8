// SPDX-License-Identifier: MIT
// The `synthetic` data set: 28x28x1 images in 10 classes, a pure function of the
// seed, learnable without files (tests, smoke runs). Each class is a fixed
// pattern (an oriented grating plus a bright blob, drawn from the seed), each
// record that pattern with a random brightness and per-pixel noise. Classes
// differ both in layout (dense models) and in local texture (conv + pooling).
#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "data/readers.h"

namespace mpx::data {

namespace {
constexpr int kSide = 28, kClasses = 10;
constexpr double kPi = 3.14159265358979323846;
}  // namespace

Dataset make_synthetic(int64_t records, Split split, uint64_t seed) {
  Dataset ds;
  ds.name = "synthetic";
  ds.H = kSide;
  ds.W = kSide;
  ds.C = 1;
  ds.num_classes = kClasses;

  // Class prototypes: the same for both splits (a function of the seed only).
  std::vector<float> proto(static_cast<size_t>(kClasses) * kSide * kSide);
  Rng prng(mix64(seed ^ 0x53594e5448455449ULL));  // "SYNTHETI"
  for (int k = 0; k < kClasses; ++k) {
    // Orientation spread over [0, pi) by class, jittered; frequency from the seed.
    const double theta = (k + 0.8 * prng.uniform()) * kPi / kClasses;
    const double freq = 2.0 * kPi / prng.uniform(4.0, 9.0);
    const double phase = prng.uniform(0.0, 2.0 * kPi);
    const double by = prng.uniform(6.0, 22.0), bx = prng.uniform(6.0, 22.0);
    const double c = std::cos(theta), s = std::sin(theta);
    for (int y = 0; y < kSide; ++y) {
      for (int x = 0; x < kSide; ++x) {
        const double grating = std::sin(freq * (c * x + s * y) + phase);
        const double d2 = (y - by) * (y - by) + (x - bx) * (x - bx);
        const double blob = std::exp(-d2 / 18.0);
        proto[(static_cast<size_t>(k) * kSide + y) * kSide + x] = static_cast<float>(110.0 + 70.0 * grating + 75.0 * blob);
      }
    }
  }

  Rng rng(mix64(seed ^ (split == Split::Train ? 0x747261696eULL : 0x74657374ULL)));  // "train" / "test"
  ds.labels.resize(static_cast<size_t>(records));
  ds.images.resize(static_cast<size_t>(records) * kSide * kSide);
  for (int64_t i = 0; i < records; ++i) {
    const int k = static_cast<int>(rng.uniform_int(kClasses));
    ds.labels[i] = k;
    const double gain = rng.uniform(0.8, 1.2);
    const float* p = proto.data() + static_cast<size_t>(k) * kSide * kSide;
    uint8_t* dst = ds.images.data() + i * kSide * kSide;
    for (int j = 0; j < kSide * kSide; ++j) {
      const double v = gain * p[j] + 28.0 * rng.normal();
      dst[j] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
    }
  }
  return ds;
}

}  // namespace mpx::data
