// SPDX-License-Identifier: MIT
// The geometry of a pooling op (NHWC, asymmetric padding), one copy for the CPU loops
// (cpu/pool.cpp) and the CUDA kernels (cuda/pool.cu): the sizes, and the window of an
// output position clipped to the image.
#pragma once

#include <cstdint>

#include "backend/backend.h"

#if defined(__CUDACC__)
#define MPX_POOL_HD __host__ __device__ __forceinline__
#else
#define MPX_POOL_HD inline
#endif

namespace mpx {

struct PoolGeometry {
  int64_t N, H, W, C;  // x [N, H, W, C]
  int64_t P, Q;        // y [N, P, Q, C]
  int64_t R, S;        // window
  int64_t sh, sw;      // strides
  int64_t pt, pl;      // padding at the top and the left
  /// Window rows [h0, h1) and columns [w0, w1) of output (p, q), clipped to the image.
  MPX_POOL_HD void window(int64_t p, int64_t q, int64_t& h0, int64_t& h1, int64_t& w0, int64_t& w1) const {
    h0 = p * sh - pt;
    w0 = q * sw - pl;
    h1 = h0 + R < H ? h0 + R : H;
    w1 = w0 + S < W ? w0 + S : W;
    h0 = h0 > 0 ? h0 : 0;
    w0 = w0 > 0 ? w0 : 0;
  }
};

/// The geometry of pooling `p` over x of shape [N, H, W, C].
inline PoolGeometry pool_geometry(const PoolParams& p, const Shape& x) {
  PoolGeometry g{};
  g.N = x[0], g.H = x[1], g.W = x[2], g.C = x[3];
  g.P = p.out_h(static_cast<int>(g.H));
  g.Q = p.out_w(static_cast<int>(g.W));
  g.R = p.R, g.S = p.S, g.sh = p.stride_h, g.sw = p.stride_w, g.pt = p.pad_top, g.pl = p.pad_left;
  return g;
}

}  // namespace mpx

#undef MPX_POOL_HD
