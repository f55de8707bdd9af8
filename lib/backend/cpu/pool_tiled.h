// SPDX-License-Identifier: MIT
// The max-pooling kernels for non-overlapping windows (pool_tiled.inc): their geometry,
// and the AVX2 and AVX-512 builds of them (pool_avx2.cpp, pool_avx512.cpp; call each only
// when cpuid reports its ISA). pool.cpp holds the baseline build and picks one at run time.
#pragma once

#include <cstdint>

namespace mpx::cpu {

struct TiledGeo {
  int64_t N, H, W, C, P, Q, R, S;
};

namespace avx2 {
void tiled_max_forward(const TiledGeo& g, const float* x, float* y);
/// relu: also the backward of the relu whose output x is (dx = 0 where x <= 0).
void tiled_max_backward(const TiledGeo& g, const float* x, const float* dy, float* dx, bool relu);
}  // namespace avx2

namespace avx512 {
void tiled_max_forward(const TiledGeo& g, const float* x, float* y);
void tiled_max_backward(const TiledGeo& g, const float* x, const float* dy, float* dx, bool relu);
}  // namespace avx512

}  // namespace mpx::cpu
