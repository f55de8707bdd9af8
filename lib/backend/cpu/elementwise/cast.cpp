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
  // Per-channel affine a*x + b with a = 1/(255 std), b = -mean/std, in float32.
  float* ab = ctx.scratch(kSlotTmp0, static_cast<size_t>(2 * C));
  for (int64_t c = 0; c < C; ++c) {
    ab[c] = 1.0f / (255.0f * std.as<const float>()[c]);
    ab[C + c] = -mean.as<const float>()[c] / std.as<const float>()[c];
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
      for (int64_t r = 0; r < nr; ++r) {
        const uint8_t* xi = px + (r0 + r) * C;
        float* yo = out + r * C;
        for (int64_t c = 0; c < C; ++c) yo[c] = static_cast<float>(xi[c]) * ab[c] + ab[C + c];
      }
      store_block(out, y, r0 * C, nr * C);
    }
  }
}

}  // namespace mpx::cpu
