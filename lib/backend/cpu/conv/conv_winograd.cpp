// SPDX-License-Identifier: MIT
// Winograd convolution F(m x m, 3 x 3) (docs/cpu-performance.md, "Winograd convolution"):
// the filter transform, the scratch layout, the split of tile blocks over the OpenMP threads
// and the choice of the transforms' ISA build. The per-block work is conv_winograd.inc.
#include "backend/cpu/conv/conv_winograd.h"

#include <dnnl.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/native16.h"
#include "core/error.h"
#include "core/half.h"

namespace mpx::cpu {

namespace wino_base {
constexpr int kCB = 4;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/conv/conv_winograd.inc"
}  // namespace wino_base

namespace {

constexpr int64_t kLanes = 16;  // V and M rows are padded to a multiple of every build's kCB
constexpr int64_t kPlanePad = 16;  // floats between the planes of V (M): no 4 KiB aliasing of their rows

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
int alpha(const WinoGeo& g) { return g.m + 2; }
int64_t tiles(const WinoGeo& g) { return g.N * ((g.P + g.m - 1) / g.m) * ((g.Q + g.m - 1) / g.m); }

struct Layout {
  int64_t ldv, ldm, plane_v, plane_m, per_thread;
};

Layout layout(const WinoGeo& g) {
  Layout l{};
  const int64_t a2 = alpha(g) * alpha(g);
  l.ldv = round_up(g.Ci, kLanes);
  l.ldm = round_up(g.Co, kLanes);
  l.plane_v = g.tiles_per_block * l.ldv + kPlanePad;
  l.plane_m = g.tiles_per_block * l.ldm + kPlanePad;
  l.per_thread = a2 * (l.plane_v + l.plane_m);
  return l;
}

// G of F(4,3) and F(2,3): the filter transform, U = G f G^T.
constexpr double kG4[6][3] = {{1.0 / 4, 0, 0},
                              {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                              {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                              {1.0 / 24, 1.0 / 12, 1.0 / 6},
                              {1.0 / 24, -1.0 / 12, 1.0 / 6},
                              {0, 0, 1}};
constexpr double kG2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};

double g_coef(int m, int i, int k) { return m == 4 ? kG4[i][k] : kG2[i][k]; }

}  // namespace

const char* winograd_isa() { return kernel_isa_name(kernel_isa()); }

int64_t winograd_tiles_per_block(const WinoGeo& g) {
  // V and M of one block within about 1 MiB (a core's L2 on the machines measured), at
  // least 16 rows for the GEMMs, at most 128.
  const int64_t a2 = alpha(g) * alpha(g);
  const int64_t per_tile = a2 * (round_up(g.Ci, kLanes) + round_up(g.Co, kLanes)) * 4;
  return std::clamp<int64_t>((int64_t{1} << 20) / per_tile, 16, 128);
}

int64_t winograd_wgrad_tiles_per_block(const WinoGeo& g) {
  // Each block's 36 GEMMs read and write the whole accumulator (9.4 MB per thread at 256 -> 256
  // channels), so a block of at least 64 tiles, past L2 for V and M, still moves fewer bytes
  // (docs/cpu-performance.md, "The weight gradient's blocks").
  return std::max<int64_t>(winograd_tiles_per_block(g), 64);
}

size_t winograd_weight_floats(const WinoGeo& g) {
  return static_cast<size_t>(alpha(g) * alpha(g) * g.Ci * g.Co);
}

void winograd_weights(const WinoGeo& g, const float* w, bool rotated, float* u) {
  const int a = alpha(g);
  const int64_t pairs = g.Ci * g.Co;
#pragma omp parallel for schedule(static)
  for (int64_t pr = 0; pr < pairs; ++pr) {
    const int64_t i = pr / g.Co, o = pr % g.Co;
    double f[3][3], gf[6][3];
    for (int r = 0; r < 3; ++r)
      for (int s = 0; s < 3; ++s)
        f[r][s] = rotated ? w[((i * 3 + (2 - r)) * 3 + (2 - s)) * g.Co + o] : w[((o * 3 + r) * 3 + s) * g.Ci + i];
    for (int x = 0; x < a; ++x)
      for (int s = 0; s < 3; ++s)
        gf[x][s] = g_coef(g.m, x, 0) * f[0][s] + g_coef(g.m, x, 1) * f[1][s] + g_coef(g.m, x, 2) * f[2][s];
    for (int x = 0; x < a; ++x)
      for (int y = 0; y < a; ++y) {
        const double v = gf[x][0] * g_coef(g.m, y, 0) + gf[x][1] * g_coef(g.m, y, 1) + gf[x][2] * g_coef(g.m, y, 2);
        u[((x * a + y) * g.Ci + i) * g.Co + o] = static_cast<float>(v);
      }
  }
}

size_t winograd_scratch(const WinoGeo& g, int threads) {
  return static_cast<size_t>(layout(g).per_thread) * static_cast<size_t>(threads);
}

namespace {

// Per thread: V and M of a block, the accumulator [alpha^2][Co][Ci] and db [Co], each a
// multiple of 16 floats so that no two threads share a cache line.
int64_t wgrad_acc_floats(const WinoGeo& g) { return round_up(alpha(g) * alpha(g) * g.Co * g.Ci, kLanes); }
int64_t wgrad_per_thread(const WinoGeo& g) {
  return layout(g).per_thread + wgrad_acc_floats(g) + round_up(g.Co, kLanes);
}

}  // namespace

size_t winograd_wgrad_scratch(const WinoGeo& g, int threads) {
  return static_cast<size_t>(wgrad_per_thread(g)) * static_cast<size_t>(threads);
}

void conv_winograd_wgrad(const WinoGeo& g, const void* in, const void* dy, float* dw, float* db, float* scratch,
                         DType io) {
  MPX_CHECK(g.m == 2 || g.m == 4);
  MPX_CHECK(io == DType::F32 || is_16bit(io));
  const Layout l = layout(g);
  const WinoBlock b{&g, in, nullptr, nullptr, nullptr, false, io, l.ldv, l.ldm, l.plane_v, l.plane_m};
  const int a = alpha(g);
  const int64_t a2 = a * a, tb = g.tiles_per_block, t_all = tiles(g), blocks = (t_all + tb - 1) / tb;
  const int64_t acc_n = wgrad_acc_floats(g), per = wgrad_per_thread(g);
  const KernelIsa isa = kernel_isa();
  auto* run = isa == KernelIsa::Avx512 ? wino_avx512::wgrad_block
              : isa == KernelIsa::Avx2 ? wino_avx2::wgrad_block
                                       : wino_base::wgrad_block;
  const int threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float* v = scratch + static_cast<size_t>(per) * static_cast<size_t>(t);
    float* m = v + a2 * l.plane_v;
    float* acc = m + a2 * l.plane_m;
    float* dbt = acc + acc_n;
    std::fill(acc, acc + acc_n + g.Co, 0.0f);  // the accumulator and db
    for (int64_t k = blocks * t / nt; k < blocks * (t + 1) / nt; ++k)
      run(b, dy, k * tb, std::min(tb, t_all - k * tb), v, m, acc, dbt);
#pragma omp barrier
    // Each thread a slice of the (o, i) pairs: the threads' sums added in thread order, then
    // dw = G^T M G in float64.
    const int64_t pairs = g.Co * g.Ci;
    for (int64_t pr = pairs * t / nt; pr < pairs * (t + 1) / nt; ++pr) {
      double mm[36], gm[36];
      for (int64_t e = 0; e < a2; ++e) {
        double sum = 0;
        for (int u = 0; u < nt; ++u) sum += scratch[static_cast<size_t>(per) * static_cast<size_t>(u) + l.per_thread +
                                                    static_cast<size_t>(e * pairs + pr)];
        mm[e] = sum;
      }
      for (int r = 0; r < 3; ++r)  // gm = G^T M: [3][a]
        for (int y = 0; y < a; ++y) {
          double sum = 0;
          for (int x = 0; x < a; ++x) sum += g_coef(g.m, x, r) * mm[x * a + y];
          gm[r * a + y] = sum;
        }
      const int64_t o = pr / g.Ci, i = pr % g.Ci;
      for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s) {
          double sum = 0;
          for (int y = 0; y < a; ++y) sum += gm[r * a + y] * g_coef(g.m, y, s);
          dw[((o * 3 + r) * 3 + s) * g.Ci + i] = static_cast<float>(sum);
        }
    }
    if (db)
      for (int64_t o = g.Co * t / nt; o < g.Co * (t + 1) / nt; ++o) {
        double sum = 0;
        for (int u = 0; u < nt; ++u)
          sum += scratch[static_cast<size_t>(per) * static_cast<size_t>(u) + l.per_thread + acc_n + o];
        db[o] = static_cast<float>(sum);
      }
  }
}

void conv_winograd(const WinoGeo& g, const void* in, const float* u, const float* bias, bool relu, void* out,
                   float* scratch, DType io) {
  MPX_CHECK(g.m == 2 || g.m == 4);
  MPX_CHECK(io == DType::F32 || is_16bit(io));
  const Layout l = layout(g);
  const WinoBlock b{&g, in, u, bias, out, relu, io, l.ldv, l.ldm, l.plane_v, l.plane_m};
  const int64_t a2 = alpha(g) * alpha(g), tb = g.tiles_per_block, t_all = tiles(g);
  const int64_t blocks = (t_all + tb - 1) / tb;
  const KernelIsa isa = kernel_isa();
  auto* run = isa == KernelIsa::Avx512 ? wino_avx512::run_block
              : isa == KernelIsa::Avx2 ? wino_avx2::run_block
                                       : wino_base::run_block;
  const int threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float* v = scratch + static_cast<size_t>(l.per_thread) * static_cast<size_t>(t);
    float* m = v + a2 * l.plane_v;
    for (int64_t k = blocks * t / nt; k < blocks * (t + 1) / nt; ++k)
      run(b, k * tb, std::min(tb, t_all - k * tb), v, m);
  }
}

}  // namespace mpx::cpu
