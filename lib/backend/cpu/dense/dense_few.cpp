// SPDX-License-Identifier: MIT
// Dense layers with few outputs on 16-bit operands (dense_few.h): the switch, the split of
// the rows or columns over the OpenMP threads, and the baseline build of the loops
// (dense_few.inc).
#include "backend/cpu/dense/dense_few.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cpu/conv/conv_winograd.h"
#include "backend/cpu/elem16.h"
#include "backend/cpu/native16.h"
#include "core/error.h"
#include "core/half.h"

namespace mpx::cpu {

namespace dfew_base {
constexpr int kL = 4;
constexpr int kRegs = 16;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/dense/dense_few.inc"
}  // namespace dfew_base

namespace {

struct Build {
  void (*forward)(const DenseFewArgs&, int64_t, int64_t);
  void (*backward_data)(const DenseFewArgs&, int64_t, int64_t);
  void (*backward_weights)(const DenseFewArgs&, int64_t, int64_t);
  void (*backward)(const DenseFewArgs&, int64_t, int64_t);
};

/// The build for operands of dtype t: by_isa's, or for bfloat16 where the CPU rounds it
/// (own_bf16_math) the AVX-512 build compiled for AVX512-BF16.
const Build& build(DType t) {
  static const Build b = by_isa(
      Build{dfew_base::forward, dfew_base::backward_data, dfew_base::backward_weights, dfew_base::backward},
      Build{dfew_avx2::forward, dfew_avx2::backward_data, dfew_avx2::backward_weights, dfew_avx2::backward},
      Build{dfew_avx512::forward, dfew_avx512::backward_data, dfew_avx512::backward_weights, dfew_avx512::backward});
  static const Build bf16{dfew_avx512bf16::forward, dfew_avx512bf16::backward_data,
                          dfew_avx512bf16::backward_weights, dfew_avx512bf16::backward};
  return t == DType::BF16 && own_bf16_math() ? bf16 : b;
}

/// Runs f(lo, hi, thread) on each thread's share of [0, n) in units of `unit` (the last share takes the rest).
template <class F>
void split(int64_t n, int64_t unit, F&& f) {
  const int64_t units = (n + unit - 1) / unit;
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = std::min(n, units * t / nt * unit), hi = std::min(n, units * (t + 1) / nt * unit);
    if (lo < hi) f(lo, hi, static_cast<int>(t));
  }
}

}  // namespace

const char* dense_few_isa() { return winograd_isa(); }

bool dense_few_dots_forward(DType xt, DType wt, int64_t Ci) {
  return xt == DType::BF16 && wt == DType::BF16 && Ci >= 32 && own_bf16_math();
}

bool dense_few_dots_backward_weights(DType xt, DType dyt) {
  return xt == DType::BF16 && dyt == DType::BF16 && own_bf16_math();
}

bool dense_few_dots_backward_data(DType dyt, DType wt, DType dxt) {
  return dyt == DType::BF16 && wt == DType::BF16 && dxt == DType::BF16 && own_bf16_math();
}

void dense_few_forward(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* w, const float* b,
                       float* y, const DenseFewBf16& bf16) {
  DenseFewArgs a{N, Ci, Co, x, xt, w, b, nullptr, y, nullptr, nullptr, nullptr};
  if (bf16.w16 && bf16.pairs && dense_few_dots_forward(xt, DType::BF16, Ci)) {
    // wq[o][b * 16 + l] = (w[o][32 b + l], w[o][32 b + 16 + l]), the first in the upper half
    const int64_t blocks = Ci / 32;
    for (int64_t o = 0; o < Co; ++o)
      for (int64_t k = 0; k < blocks; ++k)
        for (int64_t l = 0; l < 16; ++l) {
          const uint16_t* wr = bf16.w16 + o * Ci + 32 * k;
          bf16.pairs[(o * blocks + k) * 16 + l] = bf16_pair(wr[l], wr[16 + l]);
        }
    a.wq = bf16.pairs;
  }
  split(N, 1, [&](int64_t n0, int64_t n1, int) { build(xt).forward(a, n0, n1); });
}

void dense_few_backward_data(int64_t N, int64_t Ci, int64_t Co, const float* dy, const float* w, void* dx,
                             DType dxt, const void* relu_out, const DenseFewBf16& bf16) {
  DenseFewArgs a{N, Ci, Co, nullptr, dxt, w, nullptr, dy, nullptr, nullptr, dx, relu_out};
  if (bf16.w16 && bf16.dy16 && bf16.pairs && dense_few_dots_backward_data(DType::BF16, DType::BF16, dxt)) {
    // wd[o / 2][i] = (w[o][i], w[o + 1][i]), the first in the upper half, +0 past the last output
    for (int64_t o = 0; o < Co; o += 2)
      for (int64_t i = 0; i < Ci; ++i)
        bf16.pairs[o / 2 * Ci + i] =
            bf16_pair(bf16.w16[o * Ci + i], o + 1 < Co ? bf16.w16[(o + 1) * Ci + i] : uint16_t{0});
    a.wd = bf16.pairs;
    a.dy16 = bf16.dy16;
  }
  split(Ci, 64, [&](int64_t i0, int64_t i1, int) { build(dxt).backward_data(a, i0, i1); });  // whole column blocks
}

namespace {

/// db [Co] = dy's column sums, each in row order.
void bias_gradient(int64_t N, int64_t Co, const float* dy, float* db) {
  for (int64_t o = 0; o < Co; ++o) {
    float s = 0.0f;
    for (int64_t n = 0; n < N; ++n) s += dy[n * Co + o];
    db[o] = s;
  }
}

}  // namespace

void dense_few_backward_weights(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* dy,
                                float* dw, float* db, const DenseFewBf16& bf16) {
  DenseFewArgs a{N, Ci, Co, x, xt, nullptr, nullptr, dy, nullptr, dw, nullptr, nullptr};
  if (bf16.dy16 && bf16.pairs && dense_few_dots_backward_weights(xt, DType::BF16)) {
    // dyp[m][o] = (dy[2m][o], dy[2m + 1][o]), the first in the upper half, -0 past the last row
    for (int64_t n = 0; n < N; n += 2)
      for (int64_t o = 0; o < Co; ++o)
        bf16.pairs[n / 2 * Co + o] =
            bf16_pair(bf16.dy16[n * Co + o], n + 1 < N ? bf16.dy16[(n + 1) * Co + o] : uint16_t{0x8000});
    a.dyp = bf16.pairs;
  }
  split(Ci, 64, [&](int64_t i0, int64_t i1, int) { build(xt).backward_weights(a, i0, i1); });  // whole column blocks
  if (db) bias_gradient(N, Co, dy, db);
}

void dense_few_backward(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* dy, const float* w,
                        float* dw, float* db, void* dx, bool relu) {
  MPX_CHECK(Co >= 1 && Co <= kDenseFewFuseMaxOut);
  DenseFewArgs a{N, Ci, Co, x, xt, w, nullptr, dy, nullptr, dw, dx, relu ? x : nullptr};
  split(Ci, 64, [&](int64_t i0, int64_t i1, int) { build(xt).backward(a, i0, i1); });  // whole column blocks
  if (db) bias_gradient(N, Co, dy, db);
}

size_t dense_few_conv_scratch(const conv_detail::Geo& g, int threads) {
  return static_cast<size_t>((g.R * g.S * g.C + 1) * g.K) * static_cast<size_t>(threads);
}

void dense_few_backward_conv(int64_t N, int64_t Ci, int64_t Co, const void* x, DType xt, const float* dy,
                             const float* w, float* dw, float* db, const conv_detail::Geo& g, const void* conv_x,
                             float* conv_dw, float* conv_db, double* scratch) {
  MPX_CHECK(Co >= 1 && Co <= kDenseFewFuseMaxOut && conv_detail::few_channel_shape(g) && g.N == N &&
            Ci == g.P * g.Q * g.K && 64 % g.K == 0);  // split's shares and the panels hold whole pixels
  const int64_t J = g.R * g.S * g.C, per = (J + 1) * g.K;
  const int threads = omp_get_max_threads();
  std::fill(scratch, scratch + per * threads, 0.0);  // a thread may get no columns
  DenseFewArgs a{N, Ci, Co, x, xt, w, nullptr, dy, nullptr, dw, nullptr, x};
  split(Ci, 64, [&](int64_t i0, int64_t i1, int t) {
    const DenseConvArgs c{&g, conv_x, scratch + per * t, scratch + per * t + J * g.K};
    DenseFewArgs b = a;
    b.conv = &c;
    build(xt).backward(b, i0, i1);
  });
  // conv_dw[k][j] (KRSC) and conv_db[k]: the threads' float64 sums added in thread order.
  conv_detail::add_thread_sums(
      J, g.K, threads, [&](int u) { return scratch + per * u; }, [&](int u) { return scratch + per * u + J * g.K; },
      0, J * g.K, conv_dw, conv_db);
  if (db) bias_gradient(N, Co, dy, db);
}

}  // namespace mpx::cpu
