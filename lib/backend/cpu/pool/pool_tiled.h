// SPDX-License-Identifier: MIT
// The max-pooling kernels for non-overlapping windows (pool_tiled.inc): their geometry,
// and the AVX2 and AVX-512 builds of them (pool_avx2.cpp, pool_avx512.cpp; call each only
// when cpuid reports its ISA). pool.cpp holds the baseline build and picks one at run time.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/half.h"

namespace mpx::cpu {

struct TiledGeo {
  int64_t N, H, W, C, P, Q, R, S;
};

/// Global average pooling's 16-bit forward sums each image's rows in blocks of this many,
/// then the blocks in order (global_pool.cpp): float32 sums of at most kGapRows terms, the
/// same whatever the thread count or the build.
constexpr int64_t kGapRows = 32;

// Every tensor of a call holds elements of dtype t: F32, BF16 or F16; argmax (y's shape) the
// window position r * S + s of each output's first maximum.
#define MPX_TILED_MAX_DECL(ns)                                                                             \
  namespace ns {                                                                                           \
  /** argmax: written when not null. */                                                                  \
  void tiled_max_forward(const TiledGeo& g, const void* x, void* y, DType t, uint8_t* argmax);             \
  /** relu: also the backward of the relu whose output x is (dx = 0 where x <= 0). */                    \
  void tiled_max_backward(const TiledGeo& g, const void* x, const void* dy, void* dx, bool relu, DType t);  \
  /** The backward from the forward's argmax and y (relu: dy passes only where y > 0). */                \
  void tiled_max_backward_argmax(const TiledGeo& g, const void* y, const uint8_t* argmax, const void* dy,  \
                                 void* dx, bool relu, DType t);                                            \
  /** One output row of tiled_max_forward: its R input rows at x (W x C elements each), its Q */        \
  /** outputs at y and, when not null, argmax (the same values and positions as the whole forward's). */ \
  void tiled_max_forward_row(const TiledGeo& g, const void* x, void* y, uint8_t* argmax, DType t);         \
  /** Row h of image n of tiled_max_backward_argmax's dx (W x C elements at dx). */                      \
  void tiled_max_backward_argmax_row(const TiledGeo& g, const void* y, const uint8_t* argmax, const void* dy, \
                                     void* dx, int64_t n, int64_t h, bool relu, DType t);                 \
  /** Global average pooling of bfloat16 x [N, HW, C] into float32 y [N, C]. */                           \
  void gap_forward_bf16(int64_t N, int64_t HW, int64_t C, const uint16_t* x, float* y);                    \
  }
MPX_TILED_MAX_DECL(avx2)
MPX_TILED_MAX_DECL(avx512)
#undef MPX_TILED_MAX_DECL

/// gap_forward_bf16 in the build pool.cpp picks for the CPU (as it picks max pooling's).
void gap_forward_bf16_dispatch(int64_t N, int64_t HW, int64_t C, const uint16_t* x, float* y);

}  // namespace mpx::cpu
