// SPDX-License-Identifier: MIT
// Average pooling in float64 with the bound of a float32 implementation: what the tests
// of the CPU backend and of the CUDA backend against it compare an average pooling with,
// since two correct implementations may sum a window in different orders (docs/gpu.md,
// "What the CUDA tests compare").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace support {

using mpx::DType;
using mpx::PoolParams;
using mpx::Shape;

/// The unit roundoff of a float dtype (half the distance from 1 to the next value).
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::F16: return std::ldexp(1.0, -11);
    case DType::BF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

/// gamma_k = k u / (1 - k u) with float32's u: the bound on the relative error of a float32
/// sum of k terms, in any order, against the sum of their absolute values (Higham, ch. 4).
inline double gamma32(int64_t k) {
  const double u = std::ldexp(1.0, -24);
  return static_cast<double>(k) * u / (1.0 - static_cast<double>(k) * u);
}

/// The bound of an output that was accumulated in float32 (error at most `f32_bound`
/// against the exact `ref`) and then rounded once to t: the float32 error, plus half an
/// ulp of t at the value, plus half float16's smallest subnormal.
inline double rounded_bound(DType t, double ref, double f32_bound) {
  if (t == DType::F32) return f32_bound;
  return f32_bound + unit_roundoff(t) * (std::fabs(ref) + f32_bound) + (t == DType::F16 ? std::ldexp(1.0, -25) : 0.0);
}

/// Window rows [h0, h1) and columns [w0, w1) of output (p, q), clipped to the image.
inline void pool_window(const PoolParams& pp, int64_t H, int64_t W, int64_t p, int64_t q, int64_t& h0, int64_t& h1,
                 int64_t& w0, int64_t& w1) {
  h0 = p * pp.stride_h - pp.pad_top;
  w0 = q * pp.stride_w - pp.pad_left;
  h1 = std::min<int64_t>(h0 + pp.R, H);
  w1 = std::min<int64_t>(w0 + pp.S, W);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
}

/// Average pooling (padding not in the divisor) in float64, forward (y) and backward (dx),
/// with each output's bound: a float32 sum of n terms in any order, then one division (and,
/// backward, one division per term), then the rounding to t (cuda_compare.h).
struct AvgPoolRef {
  std::vector<double> y, y_bound, dx, dx_bound;
};

inline AvgPoolRef avg_pool_reference(const PoolParams& pp, DType t, const Shape& xs, const std::vector<float>& x, int P, int Q,
                          const std::vector<float>& dy) {
  const int64_t N = xs[0], H = xs[1], W = xs[2], C = xs[3];
  AvgPoolRef r;
  r.y.assign(static_cast<size_t>(N * P * Q * C), 0.0);
  r.y_bound = r.y;
  r.dx.assign(x.size(), 0.0);
  std::vector<double> dx_abs(x.size(), 0.0);
  std::vector<int64_t> dx_terms(x.size(), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q) {
        int64_t h0, h1, w0, w1;
        pool_window(pp, H, W, p, q, h0, h1, w0, w1);
        const int64_t cnt = (h1 - h0) * (w1 - w0);
        for (int64_t c = 0; c < C; ++c) {
          const size_t o = static_cast<size_t>(((n * P + p) * Q + q) * C + c);
          double sum = 0, abs_sum = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
              const size_t i = static_cast<size_t>(((n * H + h) * W + w) * C + c);
              sum += x[i];
              abs_sum += std::fabs(x[i]);
              r.dx[i] += dy[o] / static_cast<double>(cnt);
              dx_abs[i] += std::fabs(dy[o]) / static_cast<double>(cnt);
              ++dx_terms[i];
            }
          r.y[o] = sum / static_cast<double>(cnt);
          r.y_bound[o] = rounded_bound(t, r.y[o], gamma32(cnt + 1) * abs_sum / static_cast<double>(cnt));
        }
      }
  r.dx_bound.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) r.dx_bound[i] = rounded_bound(t, r.dx[i], gamma32(dx_terms[i] + 1) * dx_abs[i]);
  return r;
}

}  // namespace support
