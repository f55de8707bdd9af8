// SPDX-License-Identifier: MIT
// mpx's GEMM weight gradient of stride-1 convolutions (lib/backend/cpu/conv/conv_wgrad.cpp,
// docs/cpu-performance.md) against the float64 reference: padded and unpadded filters of
// several sizes, asymmetric padding, tiles of one image row and partial last tiles, more
// tiles than threads and fewer, with and without the bias gradient. Through the backend
// (its 16-bit paths too) CTest runs the conv tests of test_backend again with
// MPX_CONV_WGRAD=gemm (test_backend_conv_wgrad_gemm).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <omp.h>

#include "backend/cpu/conv/conv_wgrad.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/conv_case.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;

using support::ConvCase;

TEST_CASE("GEMM weight gradient matches the float64 reference", "[backend][cpu][conv]") {
  const ConvCase cases[] = {
      {"3x3 same, blocked-size channels", 2, 8, 8, 16, 32, 3, 3, 1, 1, 1, 1},
      {"3x3 valid, 3 channels", 3, 7, 9, 3, 5, 3, 3, 0, 0, 0, 0},
      {"5x5 same", 1, 6, 6, 4, 8, 5, 5, 2, 2, 2, 2},
      {"1x1", 2, 5, 5, 8, 4, 1, 1, 0, 0, 0, 0},
      {"2x2 same (Keras: padding after)", 2, 5, 7, 3, 6, 2, 2, 0, 0, 1, 1},
      {"3x3 same, rows wider than a tile", 1, 3, 400, 2, 3, 3, 3, 1, 1, 1, 1},
      {"3x3 same, partial last tile", 2, 30, 30, 5, 7, 3, 3, 1, 1, 1, 1},
      {"3x1, 1 image, 1 channel, 1 filter", 1, 4, 3, 1, 1, 3, 1, 1, 0, 1, 0},
      {"3x3 same, 5 images (odd tile count)", 5, 4, 4, 8, 8, 3, 3, 1, 1, 1, 1},
  };
  for (const ConvCase& c : cases) {
    for (bool bias : {true, false}) {
      DYNAMIC_SECTION(c.name << (bias ? " with bias" : "")) {
        const Conv2dParams p = c.params();
        const ref::ConvDims d = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
        const cpu::WgradGeo g{c.N, c.H, c.W, c.C, c.K, c.R, c.S, d.P, d.Q, c.pt, c.pl};
        REQUIRE(cpu::wgrad_gemm_applies(g, 1, 1));
        Rng rng(static_cast<uint64_t>(c.N * 1000 + c.H * 31 + c.C));
        const std::vector<float> x = support::uniform_values(rng, c.N * c.H * c.W * c.C);
        const std::vector<float> dy = support::uniform_values(rng, c.N * d.P * d.Q * c.K);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> dw(static_cast<size_t>(c.K * c.R * c.S * c.C), nan), db(static_cast<size_t>(c.K), nan);
        std::vector<float> scratch(cpu::wgrad_gemm_scratch(g, omp_get_max_threads()), nan);
        cpu::conv_wgrad_gemm(g, x.data(), dy.data(), dw.data(), bias ? db.data() : nullptr, scratch.data());
        Vec rdb;
        const Vec rdw = ref::conv2d_backward_filter(p, d, support::widen(x), support::widen(dy), &rdb);
        support::check_close("dw", dw, rdw, DType::F32);
        if (bias) support::check_close("db", db, rdb, DType::F32);
        if (!bias) CHECK(std::isnan(db[0]));  // not written
      }
    }
  }
}

TEST_CASE("GEMM weight gradient applies to stride 1 only", "[backend][cpu][conv]") {
  const cpu::WgradGeo g{1, 8, 8, 4, 4, 3, 3, 8, 8, 1, 1};
  CHECK(cpu::wgrad_gemm_applies(g, 1, 1));
  CHECK_FALSE(cpu::wgrad_gemm_applies(g, 2, 1));
  CHECK_FALSE(cpu::wgrad_gemm_applies(g, 1, 2));
}

TEST_CASE("the bias gradient's row sum matches a float64 sum, on any thread count", "[backend][cpu][conv]") {
  Rng rng(11);
  const int saved = omp_get_max_threads();
  // One row, a partial block, many blocks with offset values (float32 summing one by one
  // would lose about M * 2^-24 of the magnitude), odd K.
  for (const auto& [M, K] : std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {63, 8}, {65, 3}, {86528, 32}, {20001, 37}}) {
    std::vector<float> dy = support::uniform_values(rng, M * K);
    for (float& v : dy) v += 3.0f;
    std::vector<double> want(static_cast<size_t>(K), 0.0), mag(static_cast<size_t>(K), 0.0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        want[k] += dy[m * K + k];
        mag[k] += std::fabs(dy[m * K + k]);
      }
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> db(static_cast<size_t>(K), std::numeric_limits<float>::quiet_NaN());
      mpx::cpu::bias_gradient_rows(dy.data(), M, K, db.data());
      INFO("M " << M << " K " << K << " threads " << threads);
      // Blocks of 64 rows in float32 (error <= 64 * 2^-24 of their magnitude), then
      // double, then one rounding to float32.
      for (int64_t k = 0; k < K; ++k)
        CHECK(std::fabs(db[k] - want[k]) <= 64.0 * 0x1p-24 * mag[k] + 0x1p-24 * std::fabs(want[k]));
    }
  }
  omp_set_num_threads(saved);
}
