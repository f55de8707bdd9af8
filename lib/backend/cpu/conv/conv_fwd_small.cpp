// SPDX-License-Identifier: MIT
// The few-input-channel forward convolution (conv_fwd_small.h): the rule, the filters as
// [tap][K], the split of the output rows over the OpenMP threads, and the baseline build of the
// loop (conv_fwd_small.inc).
#include "backend/cpu/conv/conv_fwd_small.h"

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

namespace fsmall_base {
constexpr int kL = 4;
constexpr int kRegs = 16;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/conv/conv_small_rows.inc"
#include "backend/cpu/conv/conv_fwd_small.inc"
}  // namespace fsmall_base

namespace {

// In floats: the filters [tap][K] (or, for bfloat16 dot products, [pair][K] in the same room)
// and the bias once; per thread xrows, yrow and the inputs' pairs.
struct Layout {
  int64_t wt, b, xrows, yrow, xpairs, per;
};

Layout layout(const conv_detail::Geo& g) {
  Layout l{};
  const int64_t Kp = fwd_small_filters(g);
  l.wt = whole_lines(g.R * g.S * g.C * Kp);
  l.b = whole_lines(Kp);
  l.xrows = whole_lines(g.R * fwd_small_columns(g) * g.C);
  l.yrow = whole_lines(g.Q * Kp);
  l.xpairs = whole_lines(fwd_small_pairs(g) * g.Q);
  l.per = l.xrows + l.yrow + l.xpairs;
  return l;
}

}  // namespace

bool conv_fwd_small_applies(const conv_detail::Geo& g) {
  if (g.K != 24) return conv_detail::few_channel_shape(g);
  conv_detail::Geo as32 = g;
  as32.K = 32;
  return conv_detail::few_channel_shape(as32);
}

size_t conv_fwd_small_scratch(const conv_detail::Geo& g, int threads) {
  const Layout l = layout(g);
  return static_cast<size_t>(l.wt + l.b + l.per * threads);
}

const char* conv_fwd_small_isa() { return winograd_isa(); }

bool fwd_small_dots(DType io, bool w_bf16) { return io == DType::BF16 && w_bf16 && own_bf16_math(); }

namespace {

using RunFn = void (*)(const FwdSmallArgs&, int64_t, int64_t);

/// The filters as [tap][Kp] (or, with dot products, as pairs), the bias padded to Kp, at the
/// start of scratch; returns the build that runs.
RunFn prepare(const conv_detail::Geo& g, const float* w, const float* b, DType io, const uint16_t* w16,
              float* scratch) {
  const Layout l = layout(g);
  static auto* const by_cpu = by_isa(fsmall_base::run, fsmall_avx2::run, fsmall_avx512::run);
  const bool dots = fwd_small_dots(io, w16 != nullptr);
  const int64_t J = g.R * g.S * g.C, Kp = fwd_small_filters(g);
  float* wt = scratch;  // wt[j][k] = w[k][j], zeros for the filters past K
  auto* wp = reinterpret_cast<uint32_t*>(scratch);  // or wp[i][k]: w[k][2i], w[k][2i + 1] paired
  if (dots) {
    for (int64_t i = 0; i < (J + 1) / 2; ++i)
      for (int64_t k = 0; k < Kp; ++k) {
        const bool real = k < g.K, second = 2 * i + 1 < J;
        wp[i * Kp + k] =
            bf16_pair(real ? w16[k * J + 2 * i] : uint16_t{0}, real && second ? w16[k * J + 2 * i + 1] : uint16_t{0});
      }
  } else {
    for (int64_t k = 0; k < Kp; ++k)
      for (int64_t j = 0; j < J; ++j) wt[j * Kp + k] = k < g.K ? w[k * J + j] : 0.0f;
  }
  float* bias = scratch + l.wt;
  for (int64_t k = 0; k < Kp; ++k) bias[k] = b && k < g.K ? b[k] : 0.0f;
  return dots                                     ? fsmall_avx512bf16::run_dots
         : io == DType::BF16 && own_bf16_math() ? fsmall_avx512bf16::run
                                                  : by_cpu;
}

/// Thread t's arguments: its buffers after the filters and the bias.
FwdSmallArgs thread_args(const conv_detail::Geo& g, float* scratch, int t, bool relu, void* y, DType io) {
  const Layout l = layout(g);
  float* base = scratch + l.wt + l.b + l.per * t;
  FwdSmallArgs a{};
  a.g = &g, a.wt = scratch, a.b = scratch + l.wt, a.relu = relu, a.y = y, a.io = io;
  a.xrows = base, a.yrow = base + l.xrows;
  a.wp = reinterpret_cast<const uint32_t*>(scratch);
  a.xpairs = reinterpret_cast<uint32_t*>(base + l.xrows + l.yrow);
  return a;
}

}  // namespace

void conv_fwd_small(const conv_detail::Geo& g, const void* x, const float* w, const float* b, Activation act,
                    void* pre, void* y, DType io, float* scratch, const uint16_t* w16) {
  const RunFn run = prepare(g, w, b, io, w16, scratch);
  const int64_t rows = g.N * g.P;
  const bool relu = act.kind == ActKind::Relu && !pre;
  const bool epilogue = fwd_small_epilogue(act, pre != nullptr);
  const int threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    FwdSmallArgs a = thread_args(g, scratch, t, relu, y, io);
    a.x = x, a.epilogue = epilogue, a.act = act, a.pre = pre;
    run(a, rows * t / nt, rows * (t + 1) / nt);
  }
}

size_t conv_fwd_small_pooled_scratch(const conv_detail::Geo& g, int64_t window, int threads) {
  // Each thread's window of output rows after the others' buffers, in floats (16-bit outputs
  // take half of it).
  return conv_fwd_small_scratch(g, threads) + static_cast<size_t>(whole_lines(window * g.Q * g.K) * threads);
}

void conv_fwd_small_pooled(const conv_detail::Geo& g, const void* x, const float* w, const float* b, DType io,
                           float* scratch, const uint16_t* w16, const FwdPoolRows& pool) {
  const RunFn run = prepare(g, w, b, io, w16, scratch);
  const int threads = omp_get_max_threads();
  const int64_t windows = g.N * pool.rows, room = whole_lines(pool.window * g.Q * g.K);
  float* const rooms = scratch + conv_fwd_small_scratch(g, threads);
  MPX_CHECK(pool.rows * pool.window <= g.P);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float* const buf = rooms + room * t;
    FwdSmallArgs a = thread_args(g, scratch, t, true, buf, io);
    a.x = x;
    for (int64_t wi = windows * t / nt; wi < windows * (t + 1) / nt; ++wi) {
      const int64_t row0 = wi / pool.rows * g.P + wi % pool.rows * pool.window;  // image row * P + its first row
      a.y_row0 = row0;
      run(a, row0, row0 + pool.window);
      pool.take(pool.ctx, wi, buf);
    }
  }
}

}  // namespace mpx::cpu
