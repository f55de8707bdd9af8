// SPDX-License-Identifier: MIT
// The max-pooling kernels for non-overlapping windows (pool_tiled.inc): their geometry,
// and the AVX2 and AVX-512 builds of them (pool_avx2.cpp, pool_avx512.cpp; call each only
// when cpuid reports its ISA). pool.cpp holds the baseline build and picks one at run time.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mpx::cpu {

struct TiledGeo {
  int64_t N, H, W, C, P, Q, R, S;
};

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
  }
MPX_TILED_MAX_DECL(avx2)
MPX_TILED_MAX_DECL(avx512)
#undef MPX_TILED_MAX_DECL

}  // namespace mpx::cpu
