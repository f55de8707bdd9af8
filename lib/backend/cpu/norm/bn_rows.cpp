// SPDX-License-Identifier: MIT
// The batch-norm row passes (bn_rows.h): the baseline build of the loops (bn_rows.inc), the
// choice of build, and the split of the rows over the OpenMP threads.
#include "backend/cpu/norm/bn_rows.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "backend/cpu/conv/conv_winograd.h"
#include "backend/cpu/elem16.h"
#include "core/half.h"

namespace mpx::cpu {

namespace bnr_detail::base {
#include "backend/cpu/elem16.inc"
#include "backend/cpu/norm/bn_rows.inc"
}  // namespace bnr_detail::base

namespace {

namespace bd = bnr_detail;

/// fn(t, r0, r1) over each thread's contiguous range of the M rows.
template <typename F>
void over_rows(int64_t M, F&& fn) {
#pragma omp parallel num_threads(omp_get_max_threads())
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    fn(t, M * t / nt, M * (t + 1) / nt);
  }
}

/// The threads' partial sums (part[t * stride + c], t < threads) added in thread order.
void add_parts(const double* part, int threads, int64_t stride, int64_t C, double* out) {
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int t = 0; t < threads; ++t) s += part[t * stride + c];
    out[c] = s;
  }
}

}  // namespace

const char* bn_rows_isa() { return winograd_isa(); }

void bn_rows_sum(const BnRows& a, const float* center, double* part, double* out) {
  auto* run = by_isa(bd::base::sum_block, bd::avx2::sum_block, bd::avx512::sum_block);
  const int threads = omp_get_max_threads();
  std::fill(part, part + threads * a.C, 0.0);
  over_rows(a.M, [&](int t, int64_t r0, int64_t r1) { run(a, r0, r1, center, part + t * a.C); });
  add_parts(part, threads, a.C, a.C, out);
}

void bn_rows_apply(const BnRows& a) {
  auto* run = by_isa(bd::base::apply_block, bd::avx2::apply_block, bd::avx512::apply_block);
  over_rows(a.M, [&](int, int64_t r0, int64_t r1) { run(a, r0, r1); });
}

void bn_rows_grad_sums(const BnRows& a, double* part, double* s1, double* s2) {
  auto* run = by_isa(bd::base::grad_sums_block, bd::avx2::grad_sums_block, bd::avx512::grad_sums_block);
  const int threads = omp_get_max_threads();
  std::fill(part, part + threads * 2 * a.C, 0.0);
  over_rows(a.M, [&](int t, int64_t r0, int64_t r1) {
    double* p = part + t * 2 * a.C;
    run(a, r0, r1, p, p + a.C);
  });
  add_parts(part, threads, 2 * a.C, a.C, s1);
  add_parts(part + a.C, threads, 2 * a.C, a.C, s2);
}

void bn_rows_grad_apply(const BnRows& a) {
  auto* run = by_isa(bd::base::grad_apply_block, bd::avx2::grad_apply_block, bd::avx512::grad_apply_block);
  over_rows(a.M, [&](int, int64_t r0, int64_t r1) { run(a, r0, r1); });
}

}  // namespace mpx::cpu
