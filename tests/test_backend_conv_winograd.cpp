// SPDX-License-Identifier: MIT
// The Winograd convolution of the CPU backend (lib/backend/cpu/conv_winograd.*,
// docs/cpu-performance.md "Winograd convolution") against the float64 reference, with a
// tolerance derived from the transform (support/winograd_bound.h), for F(4x4,3x3) and
// F(2x2,3x3), forward (bias, relu), backward-data and weight gradient, on odd sizes, every
// padding the kernel takes and C = 1..128; the shape rule, the backend's hook, thread-count
// independence and the spread of non-finite values.
#include <catch2/catch.hpp>

#include <omp.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/conv/conv_winograd.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/reference.h"
#include "support/winograd_bound.h"

using namespace mpx;
using ref::Vec;
using namespace support::winograd;

namespace {

struct Case {
  const char* name;
  int64_t N, H, W, C, K;
  int pt, pl, pb, pr;
  bool bias, relu;
};

const Case kCases[] = {
    {"same, whole tiles, C=16 K=32", 2, 8, 8, 16, 32, 1, 1, 1, 1, false, false},
    {"valid, odd sizes, C=3 K=5", 3, 7, 9, 3, 5, 0, 0, 0, 0, true, false},
    {"same, odd sizes and channels, C=37 K=19", 1, 11, 13, 37, 19, 1, 1, 1, 1, true, true},
    {"same, C=64 K=128 + bias + relu", 2, 10, 6, 64, 128, 1, 1, 1, 1, true, true},
    {"padding 2 (full), C=128 K=16", 1, 9, 9, 128, 16, 2, 2, 2, 2, false, false},
    {"asymmetric padding 0/1/2/1, C=20 K=24", 1, 6, 7, 20, 24, 0, 1, 2, 1, true, false},
    {"one partial tile, C=16 K=16", 1, 3, 3, 16, 16, 1, 1, 1, 1, false, true},
    {"1 channel in, 1 out", 2, 5, 6, 1, 1, 1, 1, 1, 1, true, false},
};

cpu::WinoGeo geo(const Case& c, int m, int64_t tiles_per_block = 0) {
  const int64_t P = c.H + c.pt + c.pb - 2, Q = c.W + c.pl + c.pr - 2;
  cpu::WinoGeo g{c.N, c.H, c.W, c.C, P, Q, c.K, c.pt, c.pl, m, 0};
  g.tiles_per_block = tiles_per_block > 0 ? tiles_per_block : cpu::winograd_tiles_per_block(g);
  return g;
}

Conv2dParams params(const Case& c) {
  Conv2dParams p;
  p.R = p.S = 3;
  p.pad_top = c.pt, p.pad_left = c.pl, p.pad_bottom = c.pb, p.pad_right = c.pr;
  return p;
}

/// conv_winograd on the case's data: y = conv(x, w) (+ b, relu).
std::vector<float> run_forward(const cpu::WinoGeo& g, const std::vector<float>& x, const std::vector<float>& w,
                               const float* bias, bool relu) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> u(cpu::winograd_weight_floats(g), nan), y(static_cast<size_t>(g.N * g.P * g.Q * g.Co), nan);
  std::vector<float> scratch(cpu::winograd_scratch(g, omp_get_max_threads()), nan);
  cpu::winograd_weights(g, w.data(), false, u.data());
  cpu::conv_winograd(g, x.data(), u.data(), bias, relu, y.data(), scratch.data());
  return y;
}

bool winograd_env_default() {
  const char* v = ::getenv("MPX_CONV_WINOGRAD");
  return v == nullptr || *v == '\0' || std::string(v) == "auto";
}

}  // namespace

TEST_CASE("Winograd forward is within the transform's error bound of the float64 reference",
          "[backend][cpu][conv]") {
  for (int m : {4, 2})
    for (const Case& c : kCases) {
      DYNAMIC_SECTION("F(" << m << "x" << m << ",3x3) " << c.name) {
        const cpu::WinoGeo g = geo(c, m);
        Rng rng(static_cast<uint64_t>(c.N * 1000 + c.H * 31 + c.C));
        const std::vector<float> x = uniform(rng, c.N * c.H * c.W * c.C), w = uniform(rng, c.K * 9 * c.C),
                                 b = uniform(rng, c.K);
        const Vec bw = support::widen(b);
        const std::vector<float> y = run_forward(g, x, w, c.bias ? b.data() : nullptr, c.relu);
        const ref::ConvDims d = ref::conv_dims(params(c), c.N, c.H, c.W, c.C, c.K);
        const Vec want = ref::conv2d_forward(params(c), d, support::widen(x), support::widen(w), c.bias ? &bw : nullptr,
                                             c.relu ? Activation::Relu : Activation::None);
        const Vec yabs = abs_winograd(m, c.N, c.H, c.W, c.C, g.P, g.Q, c.K, c.pt, c.pl, support::widen(x),
                                      support::widen(w), c.bias ? &bw : nullptr);
        check_bound("forward", y, want, yabs, c.C);
      }
    }
}

TEST_CASE("Winograd backward-data (the rotated filter) is within the bound of the float64 reference",
          "[backend][cpu][conv]") {
  for (int m : {4, 2})
    for (const Case& c : kCases) {
      DYNAMIC_SECTION("F(" << m << "x" << m << ",3x3) " << c.name) {
        const cpu::WinoGeo f = geo(c, m);
        // dx = dy convolved with w turned by 180 degrees, K channels in, C out, padding 2 - pt.
        cpu::WinoGeo g{c.N, f.P, f.Q, c.K, c.H, c.W, c.C, 2 - c.pt, 2 - c.pl, m, 0};
        g.tiles_per_block = cpu::winograd_tiles_per_block(g);
        Rng rng(static_cast<uint64_t>(c.N * 1000 + c.H * 31 + c.C + 7));
        const std::vector<float> dy = uniform(rng, c.N * f.P * f.Q * c.K), w = uniform(rng, c.K * 9 * c.C);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> u(cpu::winograd_weight_floats(g), nan), dx(static_cast<size_t>(c.N * c.H * c.W * c.C), nan);
        std::vector<float> scratch(cpu::winograd_scratch(g, omp_get_max_threads()), nan);
        cpu::winograd_weights(g, w.data(), true, u.data());
        cpu::conv_winograd(g, dy.data(), u.data(), nullptr, false, dx.data(), scratch.data());
        const ref::ConvDims d = ref::conv_dims(params(c), c.N, c.H, c.W, c.C, c.K);
        const Vec want = ref::conv2d_backward_data(params(c), d, support::widen(dy), support::widen(w));
        Vec rot(static_cast<size_t>(c.C * 9 * c.K));  // [C][3][3][K]: w[k][2-r][2-s][c]
        for (int64_t ci = 0; ci < c.C; ++ci)
          for (int r = 0; r < 3; ++r)
            for (int s = 0; s < 3; ++s)
              for (int64_t k = 0; k < c.K; ++k)
                rot[static_cast<size_t>(((ci * 3 + r) * 3 + s) * c.K + k)] =
                    w[static_cast<size_t>(((k * 3 + (2 - r)) * 3 + (2 - s)) * c.C + ci)];
        const Vec yabs = abs_winograd(m, c.N, f.P, f.Q, c.K, c.H, c.W, c.C, 2 - c.pt, 2 - c.pl, support::widen(dy),
                                      rot, nullptr);
        check_bound("backward data", dx, want, yabs, c.K);
      }
    }
}

TEST_CASE("Winograd weight gradient is within the bound of the float64 reference", "[backend][cpu][conv]") {
  // The sum runs over the tiles (N * ceil(P/m) * ceil(Q/m) terms), so n = tiles + 20.
  for (int m : {4, 2})
    for (const Case& c : kCases) {
      DYNAMIC_SECTION("F(" << m << "x" << m << ",3x3) " << c.name) {
        const cpu::WinoGeo g = geo(c, m, 3);  // 3 tiles per block: several blocks per thread
        Rng rng(static_cast<uint64_t>(c.N * 1000 + c.H * 31 + c.C + 11));
        const std::vector<float> x = uniform(rng, c.N * c.H * c.W * c.C), dy = uniform(rng, c.N * g.P * g.Q * c.K);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> dw(static_cast<size_t>(c.K * 9 * c.C), nan), db(static_cast<size_t>(c.K), nan);
        std::vector<float> scratch(cpu::winograd_wgrad_scratch(g, omp_get_max_threads()), nan);
        cpu::conv_winograd_wgrad(g, x.data(), dy.data(), dw.data(), c.bias ? db.data() : nullptr, scratch.data());
        Vec rdb;
        const ref::ConvDims d = ref::conv_dims(params(c), c.N, c.H, c.W, c.C, c.K);
        const Vec want = ref::conv2d_backward_filter(params(c), d, support::widen(x), support::widen(dy), &rdb);
        const Vec yabs =
            abs_winograd_wgrad(m, c.N, c.H, c.W, c.C, g.P, g.Q, c.K, c.pt, c.pl, support::widen(x), support::widen(dy));
        const int64_t tiles = c.N * ((g.P + m - 1) / m) * ((g.Q + m - 1) / m);
        check_bound("weight gradient", dw, want, yabs, tiles);
        if (c.bias) support::check_close("db", db, rdb, DType::F32);
        if (!c.bias) CHECK(std::isnan(db[0]));  // not written
      }
    }
}

TEST_CASE("Winograd's result does not depend on the thread count or the block size's last partial block",
          "[backend][cpu][conv]") {
  const Case c{"many tiles", 3, 17, 15, 24, 40, 1, 1, 1, 1, true, true};
  Rng rng(3);
  const std::vector<float> x = uniform(rng, c.N * c.H * c.W * c.C), w = uniform(rng, c.K * 9 * c.C),
                           b = uniform(rng, c.K);
  const cpu::WinoGeo g = geo(c, 4, 7);  // 3 * 5 * 4 = 60 tiles: 9 blocks, the last one of 4 tiles
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = run_forward(g, x, w, b.data(), true);
  omp_set_num_threads(3);
  const std::vector<float> three = run_forward(g, x, w, b.data(), true);
  omp_set_num_threads(saved);
  support::check_exact("1 thread vs 3", three, one);
}

TEST_CASE("Winograd: a non-finite input makes every output non-finite that the direct convolution does",
          "[backend][cpu][conv]") {
  // check_numerics and the loss scaler's skip test only need "some output is not finite";
  // Winograd spreads a NaN or inf over its tile, a superset of the direct kernel's outputs.
  const Case c{"nan", 1, 9, 9, 16, 16, 1, 1, 1, 1, false, false};
  for (int m : {4, 2})
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      Rng rng(9);
      std::vector<float> x = uniform(rng, c.N * c.H * c.W * c.C);
      const std::vector<float> w = uniform(rng, c.K * 9 * c.C);
      x[static_cast<size_t>((4 * c.W + 5) * c.C + 3)] = bad;  // row 4, column 5, channel 3
      const std::vector<float> y = run_forward(geo(c, m), x, w, nullptr, false);
      int direct_bad = 0;
      for (int64_t p = 0; p < c.H; ++p)
        for (int64_t q = 0; q < c.W; ++q)
          for (int64_t k = 0; k < c.K; ++k) {
            const bool in_window = p >= 3 && p <= 5 && q >= 4 && q <= 6;
            const float v = y[static_cast<size_t>((p * c.W + q) * c.K + k)];
            if (in_window) {
              ++direct_bad;
              INFO("m " << m << " output " << p << "," << q << "," << k);
              CHECK_FALSE(std::isfinite(v));
            }
          }
      CHECK(direct_bad == 9 * c.K);
    }
}

TEST_CASE("Winograd's shape rule: 3x3 stride-1 layers with 16+ channels and 7x7+ pixels (4x4+ on AVX2, 3x3+ for dw)",
          "[backend][cpu][conv]") {
  if (!winograd_env_default()) {
    WARN("MPX_CONV_WINOGRAD is set: the default rule is not what runs");
    return;
  }
  Conv2dParams same;
  same.R = same.S = 3;
  same.pad_top = same.pad_left = same.pad_bottom = same.pad_right = 1;
  auto g_of = [](const Conv2dParams& p, int64_t N, int64_t H, int64_t W, int64_t C, int64_t K) {
    return cpu::conv_detail::geometry(p, Shape{N, H, W, C}, Shape{K, p.R, p.S, C});
  };
  if (std::string(cpu::winograd_isa()) == "baseline") {
    WARN("no AVX2: Winograd is off by default");
    CHECK(cpu::winograd_tile(same, g_of(same, 256, 32, 32, 64, 128)) == 0);
    return;
  }
  CHECK(cpu::winograd_tile(same, g_of(same, 256, 32, 32, 64, 128)) == 4);  // the CIFAR net's big layer
  CHECK(cpu::winograd_tile(same, g_of(same, 256, 32, 32, 3, 64)) == 0);    // its first layer: 3 channels
  CHECK(cpu::winograd_tile(same, g_of(same, 256, 32, 32, 8, 16)) == 0);    // 8 channels
  const std::string isa = cpu::winograd_isa();  // 4x4 and 6x6 pixels: AVX2 only
  CHECK(cpu::winograd_tile(same, g_of(same, 8, 4, 4, 64, 64)) == (isa == "avx2" ? 4 : 0));
  CHECK(cpu::winograd_tile(same, g_of(same, 8, 6, 6, 64, 64)) == (isa == "avx2" ? 4 : 0));
  CHECK(cpu::winograd_tile(same, g_of(same, 8, 7, 7, 256, 256)) == 4);  // the fast CIFAR recipe's 7x7 layers
  CHECK(cpu::winograd_tile(same, g_of(same, 8, 7, 6, 64, 64)) == (isa == "avx2" ? 4 : 0));  // both sides count
  CHECK(cpu::winograd_tile(same, g_of(same, 8, 8, 8, 64, 64)) == 4);
  CHECK(cpu::winograd_tile(same, g_of(same, 8, 4, 4, 64, 64), true) == 4);  // weight gradient: 3x3 on both
  CHECK(cpu::winograd_tile(same, g_of(same, 8, 3, 3, 256, 256), true) == 4);
  CHECK(cpu::winograd_tile(same, g_of(same, 8, 2, 2, 64, 64), true) == 0);
  CHECK(cpu::winograd_tile(same, g_of(same, 8, 3, 2, 64, 64), true) == 0);
  CHECK(cpu::winograd_tile(same, g_of(same, 256, 32, 32, 64, 128), true) == 4);
  Conv2dParams strided = same;
  strided.stride_h = strided.stride_w = 2;
  CHECK(cpu::winograd_tile(strided, g_of(strided, 8, 32, 32, 64, 64)) == 0);
  Conv2dParams five;
  five.R = five.S = 5;
  CHECK(cpu::winograd_tile(five, g_of(five, 8, 32, 32, 64, 64)) == 0);
}

TEST_CASE("the backend runs Winograd where the rule says, within the bound, and names it in its kernels",
          "[backend][cpu][conv]") {
  if (!winograd_env_default()) {
    WARN("MPX_CONV_WINOGRAD is set: the default rule is not what runs");
    return;
  }
  if (std::string(cpu::winograd_isa()) == "baseline") {
    WARN("no AVX2: Winograd is off by default");
    return;
  }
  const Case c{"backend", 2, 9, 11, 16, 24, 1, 1, 1, 1, true, true};
  support::CpuDev d;
  Rng rng(21);
  std::vector<float> xv, wv, bv, dyv;
  const Conv2dParams p = params(c);
  Tensor x = d.rand_plain(rng, DType::F32, Shape{c.N, c.H, c.W, c.C}, &xv);
  Tensor w = d.rand_plain(rng, DType::F32, Shape{c.K, 3, 3, c.C}, &wv);
  Tensor b = d.rand_plain(rng, DType::F32, Shape{c.K}, &bv);
  Tensor y = d.make(DType::F32, Shape{c.N, c.H, c.W, c.K});
  Tensor dy = d.rand_plain(rng, DType::F32, Shape{c.N, c.H, c.W, c.K}, &dyv);
  Tensor dx = d.make(DType::F32, Shape{c.N, c.H, c.W, c.C});
  d.be->conv2d_forward(p, x, w, b, y, Activation::Relu);
  d.be->conv2d_backward_data(p, dy, w, dx);
  const ref::ConvDims rd = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
  const Vec bw = support::widen(bv);
  const Vec yabs = abs_winograd(4, c.N, c.H, c.W, c.C, c.H, c.W, c.K, 1, 1, support::widen(xv), support::widen(wv), &bw);
  check_bound("backend forward", d.get(y),
              ref::conv2d_forward(p, rd, support::widen(xv), support::widen(wv), &bw, Activation::Relu), yabs, c.C);
  Vec rot(static_cast<size_t>(c.C * 9 * c.K));
  for (int64_t ci = 0; ci < c.C; ++ci)
    for (int r = 0; r < 3; ++r)
      for (int s = 0; s < 3; ++s)
        for (int64_t k = 0; k < c.K; ++k)
          rot[static_cast<size_t>(((ci * 3 + r) * 3 + s) * c.K + k)] =
              wv[static_cast<size_t>(((k * 3 + (2 - r)) * 3 + (2 - s)) * c.C + ci)];
  const Vec dxabs = abs_winograd(4, c.N, c.H, c.W, c.K, c.H, c.W, c.C, 1, 1, support::widen(dyv), rot, nullptr);
  check_bound("backend backward data", d.get(dx),
              ref::conv2d_backward_data(p, rd, support::widen(dyv), support::widen(wv)), dxabs, c.K);
  Tensor dw = d.make(DType::F32, Shape{c.K, 3, 3, c.C}), db = d.make(DType::F32, Shape{c.K});
  d.be->conv2d_backward_filter(p, x, dy, dw, db);
  Vec rdb;
  const Vec rdw = ref::conv2d_backward_filter(p, rd, support::widen(xv), support::widen(dyv), &rdb);
  const Vec dwabs = abs_winograd_wgrad(4, c.N, c.H, c.W, c.C, c.H, c.W, c.K, 1, 1, support::widen(xv), support::widen(dyv));
  check_bound("backend weight gradient", d.get(dw), rdw, dwabs, c.N * 3 * 3);
  support::check_close("backend db", d.get(db), rdb, DType::F32);
  int named = 0;
  for (const KernelChoice& k : d.be->kernels())
    if (k.op.find("x [2, 9, 11, 16], w [24, 3, 3, 16]") != std::string::npos &&
        k.op.rfind("convolution ", 0) == 0) {
      INFO(k.op << ": " << k.impl);
      CHECK(k.impl.rfind("winograd:F(4x4,3x3) ", 0) == 0);
      ++named;
    }
  CHECK(named == 3);  // forward, backward data, backward weights
}

TEST_CASE("Winograd error report: relative error of the backend's forward against float64", "[.error]") {
  // Not a check: prints the error of whatever MPX_CONV_WINOGRAD runs, for docs/cpu-performance.md.
  //   MPX_CONV_WINOGRAD=off|on|f2 test_backend_conv_winograd "[.error]" -s
  const Case c{"report", 4, 16, 16, 64, 128, 1, 1, 1, 1, false, false};
  support::CpuDev d;
  Rng rng(33);
  std::vector<float> xv, wv;
  const Conv2dParams p = params(c);
  Tensor x = d.rand_plain(rng, DType::F32, Shape{c.N, c.H, c.W, c.C}, &xv);
  Tensor w = d.rand_plain(rng, DType::F32, Shape{c.K, 3, 3, c.C}, &wv);
  Tensor y = d.make(DType::F32, Shape{c.N, c.H, c.W, c.K});
  d.be->conv2d_forward(p, x, w, Tensor(), y, Activation::None);
  const Vec want = ref::conv2d_forward(p, ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K), support::widen(xv),
                                       support::widen(wv), nullptr, Activation::None);
  const std::vector<float> got = d.get(y);
  double num = 0, den = 0, worst = 0, maxref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]);
    num += e * e, den += want[i] * want[i], worst = std::max(worst, e), maxref = std::max(maxref, std::fabs(want[i]));
  }
  std::string impl;
  for (const KernelChoice& k : d.be->kernels())
    if (k.op.rfind("convolution forward", 0) == 0) impl = k.impl;
  WARN(impl << ": relative L2 error " << std::sqrt(num / den) << ", largest error / largest |y| " << worst / maxref);
}
