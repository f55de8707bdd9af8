// SPDX-License-Identifier: MIT
// Dense layers with few outputs (a classifier's last layer, e.g. 5408 -> 10) whose big
// operand, x or dx [N, Cin], is 16-bit and the CPU has no native 16-bit math: mpx's own loops
// read and write that operand as it is (widened in registers, dx rounded once as it is
// stored) instead of oneDNN's float32 inner product between a widening pass and a rounding
// pass; and a float32 one with a long input, whose forward and backward-data they do in one
// pass over it (docs/cpu-performance.md, "Dense layers with few outputs"). The small
// operands (w, b, y, dy, dw, db) are float32; a bfloat16 layer's w and dy come as bfloat16 too
// (DenseFewBf16), for the loops' bfloat16 dot products where the CPU has them. Each row's
// forward and backward-data result depends only on that row, and the weight gradient's
// columns are each summed over the rows in order by one thread, so no result depends on the
// batch's size or the thread count.
#pragma once

#include <cstdint>

#include "backend/cpu/conv/conv_loops.h"
#include "core/dtype.h"

namespace mpx::cpu {

/// The most outputs the loops take.
constexpr int64_t kDenseFewMaxOut = 16;

// MPX_DENSE_FEW: dense_few_enabled() (switches.h); where they run: dense_choose.h.

/// The layer's bfloat16 operands for the loops' bfloat16 dot products (VDPBF16PS): w16 the
/// weights [Co, Ci] (and for the backward-data pass dy16, dy [N, Co]) as bfloat16, the very
/// values of the float32 w (and dy) the call gets; `pairs` room for dense_few_pair_words(Co, Ci)
/// 32-bit words. The taps are paired so that the instruction adds them in the FMA loops' order:
/// the same bits (docs/cpu-performance.md, "Dense layers with few outputs").
struct DenseFewBf16 {
  const uint16_t* w16 = nullptr;
  const uint16_t* dy16 = nullptr;
  uint32_t* pairs = nullptr;
};
/// 32-bit words of DenseFewBf16::pairs for a layer of Co outputs and Ci inputs.
inline int64_t dense_few_pair_words(int64_t Co, int64_t Ci) { return (Co + 1) / 2 * Ci; }
/// Whether the forward pass (x of dtype xt, w of dtype wt) multiplies on bfloat16 dot products:
/// both bfloat16, 32 inputs or more, and the CPU's allowed (own_bf16_math()).
bool dense_few_dots_forward(DType xt, DType wt, int64_t Ci);
/// Whether the backward-data pass (dy, w and dx of dtypes dyt, wt, dxt) does: all bfloat16.
bool dense_few_dots_backward_data(DType dyt, DType wt, DType dxt);
/// Whether the weight gradient (x and dy of dtypes xt, dyt) does: both bfloat16.
bool dense_few_dots_backward_weights(DType xt, DType dyt);
/// 32-bit words of DenseFewBf16::pairs for the weight gradient's pairs of dy's rows.
inline int64_t dense_few_dy_pair_words(int64_t N, int64_t Co) { return (N + 1) / 2 * Co; }

/// y [N, Co] = x [N, Ci] (dtype xt) w^T + b (b may be null); on bfloat16 dot products where
/// dense_few_dots_forward(xt, BF16, Ci) and bf16 gives the weights.
void dense_few_forward(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* w, const float* b,
                       float* y, const DenseFewBf16& bf16 = {});
/// dx [N, Ci] (dtype dxt, rounded once) = dy [N, Co] w; with relu_out (a relu's output, dx's
/// shape and dtype) 0 wherever relu_out is not > 0, the relu's backward done in registers. On
/// bfloat16 dot products where dense_few_dots_backward_data(BF16, BF16, dxt) and bf16 gives w
/// and dy.
void dense_few_backward_data(int64_t N, int64_t Ci, int64_t Co, const float* dy, const float* w, void* dx, DType dxt,
                             const void* relu_out = nullptr, const DenseFewBf16& bf16 = {});
/// dw [Co, Ci] = dy^T x (x of dtype xt); db [Co] = dy's column sums (when not null). On
/// bfloat16 dot products where dense_few_dots_backward_weights(xt, BF16) and bf16 gives dy (dy16)
/// and room for dense_few_dy_pair_words(N, Co) words.
void dense_few_backward_weights(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* dy,
                                float* dw, float* db, const DenseFewBf16& bf16 = {});

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
  // bfloat16 dot products (the AVX512-BF16 build; null elsewhere). Forward: wq[o][i / 2 + l]
  // for each whole 32 columns from i holds w[o][i + l] (upper half) and w[o][i + 16 + l], rows
  // of Ci / 32 * 16 words. Backward-data: wd[o / 2][i] holds w[o][i] (upper) and w[o + 1][i]
  // (+0 past the last output), and dy16 is dy as bfloat16.
  const uint32_t* wq = nullptr;
  const uint32_t* wd = nullptr;
  const uint16_t* dy16 = nullptr;
  // Weight gradient: dyp[m][o] holds dy[2m][o] (upper half) and dy[2m + 1][o] (-0 past the
  // last row).
  const uint32_t* dyp = nullptr;
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
