// SPDX-License-Identifier: MIT
// mpx's batch-norm loops over the rows of an NHWC tensor (M rows of C channels), reading and
// writing its own dtype (float32, bfloat16, float16) in cache, with the activation that
// follows the normalization in the same pass (docs/cpu-performance.md, "Batch norm and the
// activation after it"). batch_norm.cpp runs them for 16-bit tensors and wherever an
// activation is fused; the four passes below are what it composes.
//
// Each pass splits the rows into one contiguous range per OpenMP thread; the sums are
// accumulated in double per thread and added in thread order, so a result depends on the
// thread count but on nothing else. Built for the baseline ISA, AVX2 and AVX-512
// (bn_rows.inc) with -ffp-contract=off and -fno-trapping-math, as the activation loops are:
// every build computes the same float32 operations and gives the same bits.
#pragma once

#include <cstdint>

#include "core/activation.h"
#include "core/dtype.h"

namespace mpx::cpu {

/// The loops take the rows in pieces of at most kBnSpan elements: at most kBnRows whole rows
/// where C is at most kBnSpan, else chunks of a row. A piece's channel sums are added in
/// float32 over its rows, then in double.
constexpr int64_t kBnSpan = 1024;
constexpr int64_t kBnRows = 16;

/// The length of the per-channel arrays the passes read: C repeated to the longest whole
/// number of rows in kBnSpan, or C itself when a row is longer (bn_rows_tile).
inline int64_t bn_rows_period(int64_t C) {
  return C <= kBnSpan ? (kBnSpan / C < kBnRows ? kBnSpan / C : kBnRows) * C : C;
}

/// v [C] repeated into out [bn_rows_period(C)].
template <typename V>
void bn_rows_tile(const V* v, int64_t C, V* out) {
  const int64_t P = bn_rows_period(C);
  for (int64_t i = 0; i < P; ++i) out[i] = v[i % C];
}

/// The operands of one batch-norm pass; which fields a pass reads is on the pass. The
/// per-channel arrays have bn_rows_period(C) elements (bn_rows_tile).
struct BnRows {
  int64_t M = 0, C = 0;
  DType t = DType::F32;  // the dtype of x, y, dy and dx
  Activation act;        // applied after the normalization (None: the plain batch norm)
  const void* x = nullptr;
  const void* dy = nullptr;
  void* out = nullptr;  // y (forward) or dx (backward)
  const float* mean = nullptr;
  const float* scale = nullptr;  // gamma * invstd
  const float* beta = nullptr;
  const float* invstd = nullptr;
  // dx = coef_k (g - coef_b - (x - mean) coef_g)
  const float *coef_k = nullptr, *coef_b = nullptr, *coef_g = nullptr;
};

/// out[c] = sum over rows of x (center null) or of (x - center)^2, the difference and its
/// square in float32 (center: a period array), the sums as above; part holds
/// omp_get_max_threads() * C doubles.
void bn_rows_sum(const BnRows& a, const float* center, double* part, double* out);

/// out = act(z) with z = (x - mean) * scale + beta in float32, rounded to t, then the
/// activation's value rounded once to t (act None: z rounded once).
void bn_rows_apply(const BnRows& a);

/// The backward's sums: g = dy (act None), else g = act'(z) dy rounded to t with z recomputed
/// as bn_rows_apply computes it, written into out (dx); s1[c] = sum g, s2[c] = sum g xhat with
/// xhat = (x - mean) * invstd, the product in float32. part holds omp_get_max_threads() * 2C
/// doubles.
void bn_rows_grad_sums(const BnRows& a, double* part, double* s1, double* s2);

/// dx = coef_k (g - coef_b - (x - mean) coef_g) rounded once to t, g being dy (act None) or
/// what bn_rows_grad_sums wrote into dx.
void bn_rows_grad_apply(const BnRows& a);

/// The build that runs: "avx512", "avx2" or "baseline".
const char* bn_rows_isa();

namespace bnr_detail {
// One build's loops over rows [r0, r1) (bn_rows.inc).
#define MPX_BN_ROWS_DECLS                                                                  \
  void sum_block(const BnRows& a, int64_t r0, int64_t r1, const float* center, double* s);  \
  void apply_block(const BnRows& a, int64_t r0, int64_t r1);                                \
  void grad_sums_block(const BnRows& a, int64_t r0, int64_t r1, double* s1, double* s2);    \
  void grad_apply_block(const BnRows& a, int64_t r0, int64_t r1);
namespace base {
MPX_BN_ROWS_DECLS
}
namespace avx2 {
MPX_BN_ROWS_DECLS
}
namespace avx512 {
MPX_BN_ROWS_DECLS
}
#undef MPX_BN_ROWS_DECLS
}  // namespace bnr_detail

}  // namespace mpx::cpu
