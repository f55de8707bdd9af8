// SPDX-License-Identifier: MIT
// The forward pass of stride-1 convolutions with few input channels (a network's first layer:
// 1 to 4 channels, 16, 24, 32 or 64 filters) on mpx's own loop, with the bias and relu fused and
// 16-bit outputs rounded once: bfloat16 in registers, float16 as each output row is done
// (docs/cpu-performance.md, "The first layer's forward pass"); any other activation and a kept
// pre-activation applied to each output row in cache ("The first layer's epilogue"). Each
// thread takes whole output rows: their input rows widened into a buffer with the padding as
// zeros, and the sums for a run of pixels and a block of filters held in vector registers over
// all taps. With bfloat16 x, y and weights and the CPU's bfloat16 dot products the taps are
// multiplied two at a time (VDPBF16PS), the same sums in the same order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/conv/conv_loops.h"
#include "backend/cpu/ops.h"
#include "core/activation.h"
#include "core/dtype.h"

namespace mpx::cpu {

// MPX_CONV_FORWARD: conv_fwd_small_enabled() (switches.h); where it runs: conv_choose.h.

/// Whether conv_fwd_small computes this convolution: stride 1, C <= 4, K in {16, 24, 32, 64}
/// (24 computed as 32 with zero filters), R * S * C <= 64.
bool conv_fwd_small_applies(const conv_detail::Geo& g);

/// Whether a forward pass leaves work after the convolution that a fused relu does not cover:
/// another activation, or a kept pre-activation (conv_fwd_small's per-row epilogue).
inline bool fwd_small_epilogue(Activation act, bool keep_pre) {
  return keep_pre || !(act.is_none() || act.kind == ActKind::Relu);
}

/// The filters the loop computes: K, or 32 for K = 24.
inline int64_t fwd_small_filters(const conv_detail::Geo& g) { return g.K == 24 ? 32 : g.K; }

/// Floats of scratch conv_fwd_small needs with `threads` OpenMP threads.
size_t conv_fwd_small_scratch(const conv_detail::Geo& g, int threads);

/// y = act(conv(x, w) + b): x and y hold `io` elements (F32, BF16 or F16), w (KRSC) and b
/// (K values) float32. Relu (or none) without pre is applied in registers; any other
/// activation, or a kept pre-activation (pre, not null: `io` elements, z rounded once), goes
/// through activation_epilogue_span on each output row while it is in cache. `w16`: the layer's
/// weights as bfloat16 (KRSC), the very values of w, or null; with them and bfloat16 x and y on
/// a CPU with bfloat16 dot products (fwd_small_dots) the taps are multiplied in pairs
/// (bf16_pair, elem16.h) by vdpbf16ps, the same sums in the same order as the float32 FMAs.
void conv_fwd_small(const conv_detail::Geo& g, const void* x, const float* w, const float* b, Activation act,
                    void* pre, void* y, DType io, float* scratch, const uint16_t* w16 = nullptr);

/// The max pooling that takes conv_fwd_small's output as each of its windows' rows is computed
/// (Backend::conv_max_pool_forward; docs/cpu-performance.md, "The first convolution's forward
/// with max pooling"): windows of `window` output rows that do not overlap, `rows` of them per
/// image from the image's first output row (rows past rows * window are not computed).
struct FwdPoolRows {
  /// Pools window `row` (image row / rows, its window row % rows) from `src`, its `window`
  /// output rows one after the other (Q x K elements each, the output's dtype).
  void (*take)(const void* ctx, int64_t row, const void* src);
  const void* ctx;
  int64_t rows, window;
};

/// Floats of scratch conv_fwd_small_pooled needs with `threads` OpenMP threads.
size_t conv_fwd_small_pooled_scratch(const conv_detail::Geo& g, int64_t window, int threads);

/// conv_fwd_small with relu (no kept pre-activation) whose output rows go, a pooling window's
/// rows at a time, to pool.take from a buffer in the thread's cache instead of to y: the same
/// values pool.take would read from conv_fwd_small's y. Each thread takes whole windows.
void conv_fwd_small_pooled(const conv_detail::Geo& g, const void* x, const float* w, const float* b, DType io,
                           float* scratch, const uint16_t* w16, const FwdPoolRows& pool);

/// Whether conv_fwd_small multiplies in bfloat16 pairs: bfloat16 x, y and w, and the CPU's
/// bfloat16 dot products allowed (own_bf16_math()).
bool fwd_small_dots(DType io, bool w_bf16);

/// The build that runs: "avx512", "avx2" or "baseline" (winograd_isa()'s rule).
const char* conv_fwd_small_isa();

// The per-ISA builds (conv_fwd_small.inc): output rows [row0, row1) of y; wt is w as [R*S*C][Kp]
// (Kp = fwd_small_filters), xrows (R widened input rows) and yrow (one float32 output row of Kp
// filters per pixel) the thread's buffers. relu: applied in registers; epilogue: act and pre
// applied per row by activation_epilogue_span.
struct FwdSmallArgs {
  const conv_detail::Geo* g;
  const void* x;
  const float *wt, *b;
  bool relu;
  void* y;
  DType io;
  float *xrows, *yrow;
  bool epilogue = false;
  Activation act;
  void* pre = nullptr;
  // The bfloat16 dot-product loop (fsmall_avx512bf16::run_dots): wp[i][k] holds filter k's taps
  // 2i and 2i+1 as one bfloat16 pair, xpairs the thread's [pair][column] buffer of the row's
  // inputs, paired the same way.
  const uint32_t* wp = nullptr;
  uint32_t* xpairs = nullptr;
  /// Output row `row` is stored at y + (row - y_row0) * Q * K (y: the whole output, or the
  /// pooled forward's buffer of one window's rows); pre at pre + row * Q * K.
  int64_t y_row0 = 0;
};
namespace fsmall_base { void run(const FwdSmallArgs& a, int64_t row0, int64_t row1); }
namespace fsmall_avx2 { void run(const FwdSmallArgs& a, int64_t row0, int64_t row1); }
namespace fsmall_avx512 { void run(const FwdSmallArgs& a, int64_t row0, int64_t row1); }
/// The AVX-512 build compiled for AVX512-BF16: bfloat16 rounded by VCVTNEPS2BF16 (a float32
/// subnormal becomes a zero of its sign).
namespace fsmall_avx512bf16 {
void run(const FwdSmallArgs& a, int64_t row0, int64_t row1);
/// bfloat16 x, y and w: the taps multiplied two at a time by vdpbf16ps.
void run_dots(const FwdSmallArgs& a, int64_t row0, int64_t row1);
}  // namespace fsmall_avx512bf16

/// Pairs of taps: (J + 1) / 2 for J = R * S * C taps.
inline int64_t fwd_small_pairs(const conv_detail::Geo& g) { return (g.R * g.S * g.C + 1) / 2; }

/// Columns of one widened input row in the thread's buffer: those the output row reads.
inline int64_t fwd_small_columns(const conv_detail::Geo& g) { return g.Q + g.S - 1; }

}  // namespace mpx::cpu
