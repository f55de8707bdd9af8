// SPDX-License-Identifier: MIT
// Dense layers with few outputs (a classifier's last layer, e.g. 5408 -> 10) whose big
// operand, x or dx [N, Cin], is 16-bit and the CPU has no native 16-bit math: mpx's own loops
// read and write that operand as it is (widened in registers, dx rounded once as it is
// stored) instead of oneDNN's float32 inner product between a widening pass and a rounding
// pass; and a float32 one with a long input, whose forward and backward-data they do in one
// pass over it (docs/cpu-performance.md, "Dense layers with few outputs"). The small
// operands (w, b, y, dy, dw, db) are float32. Each row's forward and backward-data result
// depends only on that row, and the weight gradient's columns are each summed over the rows
// in order by one thread, so no result depends on the batch's size or the thread count.
#pragma once

#include <cstdint>

#include "backend/cpu/conv/conv_loops.h"
#include "core/dtype.h"

namespace mpx::cpu {

/// The most outputs the loops take.
constexpr int64_t kDenseFewMaxOut = 16;

// MPX_DENSE_FEW: dense_few_enabled() (switches.h); where they run: dense_choose.h.

/// y [N, Co] = x [N, Ci] (dtype xt) w^T + b (b may be null).
void dense_few_forward(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* w, const float* b,
                       float* y);
/// dx [N, Ci] (dtype dxt, rounded once) = dy [N, Co] w; with relu_out (a relu's output, dx's
/// shape and dtype) 0 wherever relu_out is not > 0, the relu's backward done in registers.
void dense_few_backward_data(int64_t N, int64_t Ci, int64_t Co, const float* dy, const float* w, void* dx, DType dxt,
                             const void* relu_out = nullptr);
/// dw [Co, Ci] = dy^T x (x of dtype xt); db [Co] = dy's column sums (when not null).
void dense_few_backward_weights(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* dy,
                                float* dw, float* db);

/// The most outputs dense_few_backward takes (its dx sums hold every output's product per row).
constexpr int64_t kDenseFewFuseMaxOut = 10;

/// dense_few_backward_weights and dense_few_backward_data in one walk over x [N, Ci] (dtype
/// xt, which dx shares): dw, db (when not null) and dx, with relu's backward by x (x a relu's
/// output) when `relu`; the same bits as the two calls (relu_out x). Co <= kDenseFewFuseMaxOut.
void dense_few_backward(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* dy, const float* w,
                        float* dw, float* db, void* dx, bool relu);

/// dense_few_backward with relu (x a relu's output), whose dx is the output gradient of a
/// network's first convolution (geometry g, a few-channel shape: conv_detail::few_channel_shape;
/// x its output [N, P, Q, K] flattened, so Ci = P * Q * K) whose input gradient is not needed:
/// dw and db as dense_few_backward's, and that convolution's weight gradient conv_dw (KRSC) and
/// bias gradient conv_db (when not null) from its input conv_x (dtype xt) and dx, while each
/// block of dx is in cache; dx is never stored. The threads take columns in whole pixels (the
/// split's 64 columns are whole pixels of 16, 32 or 64 filters), and each sums the products of a
/// chunk of rows and a panel of pixels in float32, then adds them into its float64 sums; the
/// threads' sums are added in thread order. `scratch`: dense_few_conv_scratch(g, threads) doubles.
void dense_few_backward_conv(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* dy,
                             const float* w, float* dw, float* db, const conv_detail::Geo& g, const void* conv_x,
                             float* conv_dw, float* conv_db, double* scratch);
/// Doubles of scratch dense_few_backward_conv needs with `threads` OpenMP threads.
size_t dense_few_conv_scratch(const conv_detail::Geo& g, int threads);

/// The build that runs: "avx512", "avx2" or "baseline" (winograd_isa()'s rule).
const char* dense_few_isa();

// The per-ISA builds (dense_few.inc): rows [n0, n1) of the forward pass, columns [i0, i1) of
// the backward-data pass, the weight gradient and both backward passes.
/// dense_few_backward_conv's convolution: its geometry and input, and the thread's float64 sums
/// of the weight gradient [taps][K] (taps = R*S*C in KRSC order) and of the bias gradient [K].
struct DenseConvArgs {
  const conv_detail::Geo* g;
  const void* x;
  double *accd, *dbd;
};

struct DenseFewArgs {
  int64_t N, Ci, Co;
  const void* x;  // forward, weight gradient, both backward passes
  DType t;        // x's or dx's dtype
  const float *w, *b, *dy;
  float *y, *dw;
  void* dx;             // backward-data
  const void* relu_out;  // backward-data: a relu's output (dx's dtype), or null; both passes: x or null
  const DenseConvArgs* conv = nullptr;  // both passes: dense_few_backward_conv's convolution, or null
  // Where dx's element (n, i) is: dx + (n - dx_n0) * ldx + (i - dx_i0), ldx 0 meaning Ci (the
  // whole tensor); dense_few_backward_conv points them at the thread's block buffer.
  int64_t ldx = 0, dx_n0 = 0, dx_i0 = 0;
};
#define MPX_DENSE_FEW_DECL(ns)                                                 \
  namespace ns {                                                               \
  void forward(const DenseFewArgs& a, int64_t n0, int64_t n1);                 \
  void backward_data(const DenseFewArgs& a, int64_t i0, int64_t i1);           \
  void backward_weights(const DenseFewArgs& a, int64_t i0, int64_t i1);        \
  void backward(const DenseFewArgs& a, int64_t i0, int64_t i1);                \
  }
MPX_DENSE_FEW_DECL(dfew_base)
MPX_DENSE_FEW_DECL(dfew_avx2)
MPX_DENSE_FEW_DECL(dfew_avx512)
MPX_DENSE_FEW_DECL(dfew_avx512bf16)  // the AVX-512 build compiled for AVX512-BF16
#undef MPX_DENSE_FEW_DECL

}  // namespace mpx::cpu
