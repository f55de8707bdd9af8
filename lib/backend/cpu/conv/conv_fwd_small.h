// SPDX-License-Identifier: MIT
// The forward pass of stride-1 convolutions with few input channels (a network's first layer:
// 1 to 4 channels, 16, 32 or 64 filters) on mpx's own loop, with the bias and relu fused and
// 16-bit outputs rounded once: bfloat16 in registers, float16 as each output row is done
// (docs/cpu-performance.md, "The first layer's forward pass"). Each thread takes whole output
// rows: their input rows widened into a buffer with the padding as zeros, and the sums for a
// run of pixels and a block of filters held in vector registers over all taps.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/conv/conv_loops.h"
#include "core/dtype.h"

namespace mpx::cpu {

// MPX_CONV_FORWARD: conv_fwd_small_enabled() (switches.h); where it runs: conv_choose.h.

/// Whether conv_fwd_small computes this convolution: stride 1, C <= 4, K in {16, 32, 64},
/// R * S * C <= 64.
bool conv_fwd_small_applies(const conv_detail::Geo& g);

/// Floats of scratch conv_fwd_small needs with `threads` OpenMP threads.
size_t conv_fwd_small_scratch(const conv_detail::Geo& g, int threads);

/// y = relu?(conv(x, w) + b): x and y hold `io` elements (F32, BF16 or F16), w (KRSC) and b
/// (K values) float32.
void conv_fwd_small(const conv_detail::Geo& g, const void* x, const float* w, const float* b, bool relu, void* y,
                    DType io, float* scratch);

/// The build that runs: "avx512", "avx2" or "baseline" (winograd_isa()'s rule).
const char* conv_fwd_small_isa();

// The per-ISA builds (conv_fwd_small.inc): output rows [row0, row1) of y; wt is w as [R*S*C][K],
// xrows (R widened input rows) and yrow (one float32 output row) the thread's buffers.
struct FwdSmallArgs {
  const conv_detail::Geo* g;
  const void* x;
  const float *wt, *b;
  bool relu;
  void* y;
  DType io;
  float *xrows, *yrow;
};
namespace fsmall_base { void run(const FwdSmallArgs& a, int64_t row0, int64_t row1); }
namespace fsmall_avx2 { void run(const FwdSmallArgs& a, int64_t row0, int64_t row1); }
namespace fsmall_avx512 { void run(const FwdSmallArgs& a, int64_t row0, int64_t row1); }
/// The AVX-512 build compiled for AVX512-BF16: bfloat16 rounded by VCVTNEPS2BF16 (a float32
/// subnormal becomes a zero of its sign).
namespace fsmall_avx512bf16 { void run(const FwdSmallArgs& a, int64_t row0, int64_t row1); }

/// Columns of one widened input row in the thread's buffer: those the output row reads.
inline int64_t fwd_small_columns(const conv_detail::Geo& g) { return g.Q + g.S - 1; }

}  // namespace mpx::cpu
