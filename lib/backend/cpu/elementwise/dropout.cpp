// SPDX-License-Identifier: MIT
// Inverted dropout with the counter-based mask of core/rng.h, so that the CPU
// and CUDA backends drop the same elements for the same (seed, offset).
#include "backend/cpu/ops.h"
#include "core/rng.h"

namespace mpx::cpu {

void dropout_forward(Context& /*ctx*/, const Tensor& x, float rate, uint64_t seed, uint64_t offset, const Tensor& mask,
                     const Tensor& y) {
  const float scale = 1.0f / (1.0f - rate);
  uint8_t* mk = mask.as<uint8_t>();
  for_blocks(x.numel(), [&](int64_t off, int64_t n) {
    float bx[kBlock], by[kBlock];
    const float* xi = load_block(x, off, n, bx);
    float* yo = out_block(y, off, by);
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = !(hash_uniform(seed, offset + static_cast<uint64_t>(off + i)) < rate);
      mk[off + i] = keep ? 1 : 0;
      yo[i] = keep ? xi[i] * scale : 0.0f;
    }
    store_block(yo, y, off, n);
  });
}

void dropout_backward(Context& /*ctx*/, const Tensor& dy, const Tensor& mask, float rate, const Tensor& dx) {
  const float scale = 1.0f / (1.0f - rate);
  const uint8_t* mk = mask.as<const uint8_t>();
  for_blocks(dy.numel(), [&](int64_t off, int64_t n) {
    float bdy[kBlock], bdx[kBlock];
    const float* gi = load_block(dy, off, n, bdy);
    float* d = out_block(dx, off, bdx);
    for (int64_t i = 0; i < n; ++i) d[i] = mk[off + i] ? gi[i] * scale : 0.0f;
    store_block(d, dx, off, n);
  });
}

}  // namespace mpx::cpu
