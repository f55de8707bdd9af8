// SPDX-License-Identifier: MIT
// The few-input-channel weight gradient (conv_wgrad_small.h): the rule, the split of the
// output rows over the OpenMP threads, the threads' sums added in thread order, and the
// baseline build of the loop (conv_wgrad_small.inc).
#include "backend/cpu/conv/conv_wgrad_small.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <string>

#include "backend/cpu/conv/conv_winograd.h"
#include "backend/cpu/elem16.h"
#include "backend/cpu/native16.h"
#include "backend/cpu/switches.h"
#include "core/half.h"

namespace mpx::cpu {

namespace wsmall_base {
constexpr int kL = 4;
constexpr int kRegs = 16;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/conv/conv_small_rows.inc"
#include "backend/cpu/conv/conv_wgrad_small.inc"
}  // namespace wsmall_base

namespace {

// Per thread, in floats: acc, db, accd and dbd (doubles: two floats each), xrows, dyrow, and
// dyraw (a routed dy row as it comes, at most float32).
struct Layout {
  int64_t acc, db, accd, dbd, xrows, dyrow, dyraw, per;
};

Layout layout(const conv_detail::Geo& g) {
  Layout l{};
  l.acc = whole_lines((g.R * g.S * g.C + kWgradMaxTaps) * g.K);
  l.db = whole_lines(g.K);
  l.accd = whole_lines(2 * g.R * g.S * g.C * g.K);
  l.dbd = whole_lines(2 * g.K);
  l.xrows = whole_lines(g.R * wgrad_small_columns(g) * g.C);
  l.dyrow = whole_lines(g.Q * g.K);
  l.dyraw = whole_lines(g.Q * g.K);
  l.per = l.acc + l.db + l.accd + l.dbd + l.xrows + l.dyrow + l.dyraw;
  return l;
}

}  // namespace

bool conv_wgrad_small_applies(const conv_detail::Geo& g) { return conv_detail::few_channel_shape(g); }

size_t conv_wgrad_small_scratch(const conv_detail::Geo& g, int threads) {
  return static_cast<size_t>(layout(g).per) * static_cast<size_t>(threads);
}

const char* conv_wgrad_small_isa() { return winograd_isa(); }

bool conv_wgrad_small_dots(DType io) { return io == DType::BF16 && own_bf16_math(); }

namespace {

void run_all(const conv_detail::Geo& g, const void* x, const void* dy, const WgradDyRows* dy_rows, DType io,
             float* dw, float* db, float* scratch, bool dot, bool buffered) {
  const Layout l = layout(g);
  static auto* const widened = by_isa(wsmall_base::run, wsmall_avx2::run, wsmall_avx512::run);
  auto* const run = dot && conv_wgrad_small_dots(io) ? wsmall_avx512bf16::run : widened;
  const int64_t rows = g.N * g.P, J = g.R * g.S * g.C;
  const int threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float* base = scratch + l.per * t;
    auto* accd = reinterpret_cast<double*>(base + l.acc + l.db);
    auto* dbd = reinterpret_cast<double*>(base + l.acc + l.db + l.accd);
    float* xrows = base + l.acc + l.db + l.accd + l.dbd;
    WgradSmallArgs a{&g, x, dy, io, base, base + l.acc, xrows, xrows + l.xrows, accd, dbd, buffered, dy_rows,
                     xrows + l.xrows + l.dyrow};
    std::fill(base, base + l.acc + l.db, 0.0f);
    std::fill(accd, accd + J * g.K, 0.0);
    std::fill(dbd, dbd + g.K, 0.0);
    run(a, rows * t / nt, rows * (t + 1) / nt);
#pragma omp barrier
    // dw[k][j] (KRSC: j = (r*S + s)*C + c) = the threads' accd[j][k] added in thread order, each
    // thread a slice of dw; db by thread 0.
    auto sums = [&](int u) { return reinterpret_cast<const double*>(scratch + l.per * u + l.acc + l.db); };
    auto db_sums = [&](int u) {
      return reinterpret_cast<const double*>(scratch + l.per * u + l.acc + l.db + l.accd);
    };
    conv_detail::add_thread_sums(J, g.K, nt, sums, db_sums, J * g.K * t / nt, J * g.K * (t + 1) / nt, dw,
                                 t == 0 ? db : nullptr);
  }
}

}  // namespace

void conv_wgrad_small(const conv_detail::Geo& g, const void* x, const void* dy, DType io, float* dw, float* db,
                      float* scratch) {
  run_all(g, x, dy, nullptr, io, dw, db, scratch, true, false);
}

void conv_wgrad_small(const conv_detail::Geo& g, const void* x, const void* dy, DType io, float* dw, float* db,
                      float* scratch, bool dot, bool buffered) {
  run_all(g, x, dy, nullptr, io, dw, db, scratch, dot, buffered);
}

void conv_wgrad_small(const conv_detail::Geo& g, const void* x, const WgradDyRows& rows, DType io, float* dw,
                      float* db, float* scratch) {
  run_all(g, x, nullptr, &rows, io, dw, db, scratch, true, false);
}

}  // namespace mpx::cpu
