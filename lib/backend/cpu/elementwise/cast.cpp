// SPDX-License-Identifier: MIT
// Casts between float dtypes (one rounding to nearest-even) and the input
// normalization uint8 HWC -> (x/255 - mean) / std in the first layer's dtype.
#include <omp.h>

#include "backend/cpu/ops.h"

namespace mpx::cpu {

void cast(Context& ctx, const Tensor& src, const Tensor& dst) {
  if (src.dtype == dst.dtype) {
    copy(ctx, dst, src);
    return;
  }
  parallel_convert(src.data, src.dtype, dst.data, dst.dtype, src.numel());
}

void normalize_input(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& std, const Tensor& y) {
  const int64_t C = x.shape[x.shape.rank - 1];
  const int64_t rows = x.numel() / C;
  // Per-channel affine a*x + b with a = 1/(255 std), b = -mean/std, in float32, repeated over
  // L = 16 C elements (a[e % C], b[e % C]) so that the loop below runs over a block's elements
  // without a per-row inner loop of C (one channel: a loop of one per pixel, not vectorized).
  const int64_t L = 16 * C;
  float* ab = ctx.scratch(kSlotTmp0, static_cast<size_t>(2 * L));
  for (int64_t e = 0; e < L; ++e) {
    const int64_t c = e % C;
    ab[e] = 1.0f / (255.0f * std.as<const float>()[c]);
    ab[L + e] = -mean.as<const float>()[c] / std.as<const float>()[c];
  }
  const uint8_t* px = x.as<const uint8_t>();
  // Rows are grouped into blocks of about kBlock elements.
  const int64_t rows_per_block = std::max<int64_t>(1, kBlock / C);
  const int64_t nb = (rows + rows_per_block - 1) / rows_per_block;
  float* bufs = y.dtype == DType::F32
                    ? nullptr
                    : ctx.scratch(kSlotTmp1, static_cast<size_t>(omp_get_max_threads() * rows_per_block * C));
#pragma omp parallel
  {
    float* buf = bufs ? bufs + omp_get_thread_num() * rows_per_block * C : nullptr;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t r0 = b * rows_per_block, nr = std::min(rows_per_block, rows - r0);
      float* out = out_block(y, r0 * C, buf);
      const uint8_t* xi = px + r0 * C;  // a block starts at a row, so element e has channel e % C
      for (int64_t e0 = 0; e0 < nr * C; e0 += L) {
        const int64_t m = std::min(L, nr * C - e0);
        for (int64_t j = 0; j < m; ++j) out[e0 + j] = static_cast<float>(xi[e0 + j]) * ab[j] + ab[L + j];
      }
      store_block(out, y, r0 * C, nr * C);
    }
  }
}

}  // namespace mpx::cpu
