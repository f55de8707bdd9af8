// SPDX-License-Identifier: MIT
// The weight gradient of a stride-1 convolution as GEMMs (docs/cpu-performance.md, "The GEMM
// weight gradient"). With x zero-padded to rows of Wp = Q + S - 1 pixels and dy laid out on
// the same rows (zeros in the S - 1 columns past Q), the pixel that filter tap (r, s) pairs
// with dy's pixel m is x's pixel m + r*Wp + s, for every m of a tile; the zero columns of dy
// cancel the pixels that wrap into the next row. So dw = dy_tile^T * [x_tile shifted by each
// tap], one GEMM per tile. Each thread builds its tiles (a few image rows) in its own
// scratch, runs oneDNN's sgemm on them and sums into its own copy of dw; the copies are
// added at the end.
#include "backend/cpu/conv/conv_wgrad.h"

#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace mpx::cpu {

namespace {

int64_t row_width(const WgradGeo& g) { return g.Q + g.S - 1; }

/// Image rows per tile: about 384 pixels of dy (the GEMMs' reduction length).
int64_t rows_per_tile(const WgradGeo& g) { return std::clamp<int64_t>(384 / row_width(g), 1, g.P); }

struct ThreadScratch {
  float *dy, *x, *dw, *db, *cols;
};

size_t per_thread(const WgradGeo& g) {
  const int64_t wp = row_width(g), rb = rows_per_tile(g);
  const int64_t dy_n = rb * wp * g.K, x_n = ((rb + g.R - 1) * wp + g.S - 1) * g.C;
  auto up16 = [](int64_t n) { return static_cast<size_t>((n + 15) / 16 * 16); };
  return up16(dy_n) + up16(x_n) + up16(g.K * g.R * g.S * g.C) + up16(g.K) + up16(rb * wp * g.R * g.S * g.C);
}

ThreadScratch thread_scratch(const WgradGeo& g, float* base, int t) {
  const int64_t wp = row_width(g), rb = rows_per_tile(g);
  auto up16 = [](int64_t n) { return static_cast<size_t>((n + 15) / 16 * 16); };
  ThreadScratch s{};
  s.dy = base + per_thread(g) * static_cast<size_t>(t);
  s.x = s.dy + up16(rb * wp * g.K);
  s.dw = s.x + up16(((rb + g.R - 1) * wp + g.S - 1) * g.C);
  s.db = s.dw + up16(g.K * g.R * g.S * g.C);
  s.cols = s.db + up16(g.K);
  return s;
}

/// dy rows [p0, p0 + nb) of image n on rows of wp pixels (zeros past Q); adds them into db.
void load_dy_tile(const WgradGeo& g, const float* dy, int64_t n, int64_t p0, int64_t nb, float* tile, float* db) {
  const int64_t wp = row_width(g);
  for (int64_t i = 0; i < nb; ++i) {
    const float* src = dy + ((n * g.P + p0 + i) * g.Q) * g.K;
    float* dst = tile + i * wp * g.K;
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(g.Q * g.K));
    std::memset(dst + g.Q * g.K, 0, sizeof(float) * static_cast<size_t>((wp - g.Q) * g.K));
    for (int64_t q = 0; q < g.Q; ++q)
#pragma omp simd
      for (int64_t k = 0; k < g.K; ++k) db[k] += src[q * g.K + k];
  }
}

/// x's padded rows [p0, p0 + nb + R - 1) of image n (padded row h is x row h - pt, padded
/// column w is x column w - pl; zero outside x), then S - 1 zero pixels.
void load_x_tile(const WgradGeo& g, const float* x, int64_t n, int64_t p0, int64_t nb, float* tile) {
  const int64_t wp = row_width(g), rows = nb + g.R - 1;
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(wp * g.C);
  for (int64_t i = 0; i < rows; ++i) {
    float* dst = tile + i * wp * g.C;
    const int64_t h = p0 + i - g.pt;
    if (h < 0 || h >= g.H) {
      std::memset(dst, 0, row_bytes);
      continue;
    }
    const int64_t w0 = std::max<int64_t>(0, g.pl), w1 = std::min<int64_t>(wp, g.pl + g.W);  // padded columns of x
    std::memset(dst, 0, sizeof(float) * static_cast<size_t>(w0 * g.C));
    std::memcpy(dst + w0 * g.C, x + ((n * g.H + h) * g.W + (w0 - g.pl)) * g.C,
                sizeof(float) * static_cast<size_t>((w1 - w0) * g.C));
    std::memset(dst + w1 * g.C, 0, sizeof(float) * static_cast<size_t>((wp - w1) * g.C));
  }
  std::memset(tile + rows * wp * g.C, 0, sizeof(float) * static_cast<size_t>((g.S - 1) * g.C));
}

/// The tile's R*S shifted copies of x side by side ([m, R*S*C], the columns in dw's r, s, c
/// order), then one GEMM for every tap: dw [K, R*S*C] += dy_tile^T * that.
void gemm_tile(const WgradGeo& g, const float* dy_tile, const float* x_tile, int64_t nb, float* cols, float* dw) {
  const int64_t wp = row_width(g), m = nb * wp, taps = g.R * g.S, ld = taps * g.C;
  const size_t tap_bytes = sizeof(float) * static_cast<size_t>(g.C);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < g.R; ++r)
      for (int64_t s = 0; s < g.S; ++s)
        std::memcpy(cols + i * ld + (r * g.S + s) * g.C, x_tile + (i + r * wp + s) * g.C, tap_bytes);
  const dnnl_status_t st = dnnl_sgemm('T', 'N', g.K, ld, m, 1.0f, dy_tile, g.K, cols, ld, 1.0f, dw, ld);
  MPX_CHECK(st == dnnl_success);
}

}  // namespace

bool wgrad_gemm_applies(const WgradGeo& g, int stride_h, int stride_w) {
  return stride_h == 1 && stride_w == 1 && g.P > 0 && g.Q > 0 && g.pt >= 0 && g.pl >= 0;
}

// Measured against oneDNN 3.2's kernels with one thread (process CPU time), AVX-512 and AVX2,
// at nine 3x3 shapes from 8 to 256 channels: the GEMM kernel tied at best (the CIFAR net's
// 64 -> 128 layer) and was 1.2-3.3x slower elsewhere, so no shape takes it yet.
bool wgrad_gemm_rule(const WgradGeo&) { return false; }

size_t wgrad_gemm_scratch(const WgradGeo& g, int threads) { return per_thread(g) * static_cast<size_t>(threads); }

void conv_wgrad_gemm(const WgradGeo& g, const float* x, const float* dy, float* dw, float* db, float* scratch) {
  const int64_t rb = rows_per_tile(g), tiles_per_image = (g.P + rb - 1) / rb, tiles = g.N * tiles_per_image;
  const int64_t dw_n = g.K * g.R * g.S * g.C;
  const int threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const ThreadScratch s = thread_scratch(g, scratch, t);
    std::memset(s.dw, 0, sizeof(float) * static_cast<size_t>(dw_n));
    std::memset(s.db, 0, sizeof(float) * static_cast<size_t>(g.K));
    const int64_t begin = tiles * t / nt, end = tiles * (t + 1) / nt;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = i / tiles_per_image, p0 = (i % tiles_per_image) * rb, nb = std::min(rb, g.P - p0);
      load_dy_tile(g, dy, n, p0, nb, s.dy, s.db);
      load_x_tile(g, x, n, p0, nb, s.x);
      gemm_tile(g, s.dy, s.x, nb, s.cols, s.dw);
    }
#pragma omp barrier
    // Sum the threads' copies, each thread a slice of dw (and of db).
    const int64_t d0 = dw_n * t / nt, d1 = dw_n * (t + 1) / nt;
    for (int64_t j = d0; j < d1; ++j) {
      float acc = 0.0f;
      for (int u = 0; u < nt; ++u) acc += thread_scratch(g, scratch, u).dw[j];
      dw[j] = acc;
    }
    if (db) {
      const int64_t b0 = g.K * t / nt, b1 = g.K * (t + 1) / nt;
      for (int64_t k = b0; k < b1; ++k) {
        float acc = 0.0f;
        for (int u = 0; u < nt; ++u) acc += thread_scratch(g, scratch, u).db[k];
        db[k] = acc;
      }
    }
  }
}

void bias_gradient_rows(const float* dy, int64_t M, int64_t K, float* db) {
  constexpr int64_t kRows = 64;
  const int nt = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>((M + kRows - 1) / kRows)));
  std::vector<double> part(static_cast<size_t>(nt) * static_cast<size_t>(K), 0.0);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int64_t lo = M * t / nt, hi = M * (t + 1) / nt;
    double* sum = part.data() + static_cast<int64_t>(t) * K;
    std::vector<float> acc(static_cast<size_t>(K));
    for (int64_t m0 = lo; m0 < hi; m0 += kRows) {
      const int64_t m1 = std::min(hi, m0 + kRows);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t m = m0; m < m1; ++m) {
        const float* row = dy + m * K;
        for (int64_t k = 0; k < K; ++k) acc[k] += row[k];
      }
      for (int64_t k = 0; k < K; ++k) sum[k] += acc[k];
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    double s = 0.0;
    for (int t = 0; t < nt; ++t) s += part[static_cast<size_t>(t) * K + k];
    db[k] = static_cast<float>(s);
  }
}

}  // namespace mpx::cpu
