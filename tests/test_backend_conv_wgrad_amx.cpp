// SPDX-License-Identifier: MIT
// mpx's bfloat16 weight gradient on AMX tiles (lib/backend/cpu/conv/conv_wgrad_amx.cpp,
// docs/cpu-performance.md "The AMX weight gradient") against the float64 reference, within
// the bound of its float32 sums over the grid: 3x3 same and valid, asymmetric padding, 1x1,
// 2x2 with padding after, 5x5 and 7x7, 16-filter and 16-channel tails, grids of two and of
// eleven passes (eight slabs); with the threads sharing every pass and sharing slabs of
// passes, the same bits at 1, 2 and 3 threads; a non-finite input never lost; the shape rule
// and the split's rule.
// Where the CPU (or the build, or oneDNN's ISA limit) has no AMX-BF16 the kernel is not run
// and the tests say so; the rule is checked everywhere.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/conv/conv_wgrad_amx.h"
#include "backend/cpu/native16.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/conv_case.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;
using support::ConvCase;

namespace {

std::vector<ConvCase> amx_cases() {
  return {
      {"3x3 same, 7x7 images, C=32, K=32", 3, 7, 7, 32, 32, 3, 3, 1, 1, 1, 1},
      {"3x3 same, 8x8 images, 40 of them (two passes of the grid), C=32, K=64", 40, 8, 8, 32, 64, 3, 3, 1, 1, 1, 1},
      {"3x3 same, 8x8 images, 256 of them (eleven passes, eight slabs), C=16, K=32", 256, 8, 8, 16, 32, 3, 3, 1, 1, 1,
       1},
      {"3x3 same, a 16-filter tail: C=32, K=48", 2, 6, 5, 32, 48, 3, 3, 1, 1, 1, 1},
      {"3x3 same, a 16-channel tail: C=48, K=16", 2, 5, 6, 48, 16, 3, 3, 1, 1, 1, 1},
      {"3x3 valid, C=16, K=32", 2, 8, 9, 16, 32, 3, 3, 0, 0, 0, 0},
      {"3x3, asymmetric padding, C=16, K=16", 2, 6, 9, 16, 16, 3, 3, 2, 0, 1, 2},
      {"1x1, C=32, K=16", 3, 5, 4, 32, 16, 1, 1, 0, 0, 0, 0},
      {"2x2 same (padding after), C=16, K=32", 2, 5, 7, 16, 32, 2, 2, 0, 0, 1, 1},
      {"5x5 same, C=16, K=16", 2, 9, 8, 16, 16, 5, 5, 2, 2, 2, 2},
      {"7x7 same, C=16, K=32", 1, 8, 8, 16, 32, 7, 7, 3, 3, 3, 3},
  };
}

struct Result {
  std::vector<float> dw, db;
};

Result run(const cpu::conv_detail::Geo& g, const std::vector<float>& x, const std::vector<float>& dy, int threads,
           cpu::AmxSplit split) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Result r{std::vector<float>(static_cast<size_t>(g.K * g.R * g.S * g.C), nan),
           std::vector<float>(static_cast<size_t>(g.K), nan)};
  const std::vector<uint16_t> x16 = support::to16(x, DType::BF16), dy16 = support::to16(dy, DType::BF16);
  const size_t bytes = (cpu::conv_wgrad_amx_scratch_bytes(g, threads, split) + 63) / 64 * 64;
  std::unique_ptr<void, decltype(&std::free)> scratch(std::aligned_alloc(64, bytes), &std::free);
  std::memset(scratch.get(), 0xff, bytes);  // NaN bit patterns: the kernel writes what it reads
  const support::OmpThreads th(threads);
  cpu::conv_wgrad_amx(g, x16.data(), dy16.data(), r.dw.data(), r.db.data(), scratch.get(), threads, split);
  return r;
}

bool amx_here() {
  if (cpu::own_amx_bf16()) return true;
  WARN("no AMX-BF16 here (CPU, build, ONEDNN_MAX_CPU_ISA or MPX_CPU_16BIT=widen): the kernel is not run");
  return false;
}

}  // namespace

TEST_CASE("AMX weight gradient: within its float32 summation bound of the float64 reference, the same bits at any "
          "thread count",
          "[backend][cpu][conv][amx]") {
  if (!amx_here()) return;
  for (const ConvCase& c : amx_cases()) DYNAMIC_SECTION(c.name) {
      const Conv2dParams p = c.params();
      const ref::ConvDims d = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
      const cpu::conv_detail::Geo g = support::stride1_geo(c, d);
      REQUIRE(cpu::conv_wgrad_amx_applies(g));
      Rng rng(static_cast<uint64_t>(c.N * 389 + c.H * 17 + c.C * 5 + c.K + c.R));
      const std::vector<float> x = support::uniform_values(rng, c.N * c.H * c.W * c.C, DType::BF16),
                               dy = support::uniform_values(rng, c.N * d.P * d.Q * c.K, DType::BF16);
      Vec rdb, mdb;
      const Vec rdw = ref::conv2d_backward_filter(p, d, support::widen(x), support::widen(dy), &rdb);
      Vec ax(x.size()), ady(dy.size());
      for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
      for (size_t i = 0; i < dy.size(); ++i) ady[i] = std::fabs(dy[i]);
      const Vec mdw = ref::conv2d_backward_filter(p, d, ax, ady, &mdb);
      // bfloat16 products are exact in float32; each dw element is one float32 sum over the
      // grid's pixels (Gm of them, zeros included); each db element the float64 sum of each
      // 32-pixel block's float32 sum (two sums of 16, added), rounded once to float32.
      const cpu::AmxGrid a = cpu::conv_wgrad_amx_grid(g);
      const double u = std::ldexp(1.0, -24);
      const auto gamma = [u](double n) { return n * u / (1 - n * u); };
      const double gw = gamma(static_cast<double>(a.Gm) + 1), gb = gamma(17);
      // With slabs, each dw element is the float64 sum of the slabs' float32 sums, rounded
      // once: within the same bound, as every slab has fewer pixels than the grid.
      for (const cpu::AmxSplit split : {cpu::AmxSplit::Passes, cpu::AmxSplit::Slabs}) {
        INFO((split == cpu::AmxSplit::Slabs ? "slabs" : "passes"));
        const Result one = run(g, x, dy, 1, split);
        for (size_t i = 0; i < one.dw.size(); ++i) {
          const double tol = gw * mdw[i] + 1e-30;
          if (!(std::fabs(one.dw[i] - rdw[i]) <= tol))
            FAIL("dw[" << i << "] " << one.dw[i] << ", reference " << rdw[i] << ", bound " << tol);
        }
        for (size_t k = 0; k < one.db.size(); ++k) {
          const double tol = gb * mdb[k] + u * std::fabs(rdb[k]) + 1e-30;
          if (!(std::fabs(one.db[k] - rdb[k]) <= tol))
            FAIL("db[" << k << "] " << one.db[k] << ", reference " << rdb[k] << ", bound " << tol);
        }
        for (int threads : {2, 3}) {
          INFO(threads << " threads");
          const Result more = run(g, x, dy, threads, split);
          support::check_exact("dw against 1 thread", more.dw, one.dw);
          support::check_exact("db against 1 thread", more.db, one.db);
        }
      }
    }
}

TEST_CASE("AMX weight gradient: an infinity in x or dy is never lost", "[backend][cpu][conv][amx]") {
  if (!amx_here()) return;
  // The grid multiplies x's pixels by dy's zeros where no output reaches them (and dy by
  // x's padding), so an infinity may turn an element the direct sum keeps infinite into NaN,
  // or a finite one into NaN (docs/cpu-performance.md): every non-finite element of the
  // reference is non-finite here.
  const ConvCase c = amx_cases()[0];
  const Conv2dParams p = c.params();
  const ref::ConvDims d = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
  const cpu::conv_detail::Geo g = support::stride1_geo(c, d);
  for (bool in_x : {true, false}) DYNAMIC_SECTION((in_x ? "x" : "dy")) {
      Rng rng(83);
      std::vector<float> x = support::uniform_values(rng, c.N * c.H * c.W * c.C, DType::BF16),
                         dy = support::uniform_values(rng, c.N * d.P * d.Q * c.K, DType::BF16);
      const float inf = std::numeric_limits<float>::infinity();
      if (in_x)
        x[static_cast<size_t>(((1 * c.H + 3) * c.W + 6) * c.C + 5)] = inf;  // image 1, row 3, last column
      else
        dy[static_cast<size_t>(((2 * d.P + 0) * d.Q + 4) * c.K + 7)] = -inf;  // image 2, first row
      Vec rdb;
      const Vec rdw = ref::conv2d_backward_filter(p, d, support::widen(x), support::widen(dy), &rdb);
      const Result r = run(g, x, dy, 2, cpu::AmxSplit::Slabs);
      const Result rp = run(g, x, dy, 2, cpu::AmxSplit::Passes);
      int64_t nonfinite = 0;
      for (size_t i = 0; i < rdw.size(); ++i)
        if (!std::isfinite(rdw[i])) {
          ++nonfinite;
          if (std::isfinite(r.dw[i])) FAIL("dw[" << i << "] " << r.dw[i] << " (slabs), reference " << rdw[i]);
          if (std::isfinite(rp.dw[i])) FAIL("dw[" << i << "] " << rp.dw[i] << " (passes), reference " << rdw[i]);
        }
      CHECK(nonfinite > 0);
      for (size_t k = 0; k < rdb.size(); ++k)
        if (!std::isfinite(rdb[k])) CHECK((!std::isfinite(r.db[k]) && !std::isfinite(rp.db[k])));
    }
}

TEST_CASE("AMX weight gradient: the shape rule", "[backend][cpu][conv][amx]") {
  const auto geo = [](int64_t H, int64_t W, int64_t C, int64_t K, int R, int pt, int pl, int pb, int pr,
                      int stride = 1) {
    cpu::conv_detail::Geo g{};
    g.N = 2, g.H = H, g.W = W, g.C = C, g.K = K, g.R = g.S = R;
    g.P = (H + pt + pb - R) / stride + 1, g.Q = (W + pl + pr - R) / stride + 1;
    g.sh = g.sw = stride, g.pt = pt, g.pl = pl;
    return g;
  };
  CHECK(cpu::conv_wgrad_amx_applies(geo(15, 15, 64, 256, 3, 1, 1, 1, 1)));
  CHECK(cpu::conv_wgrad_amx_applies(geo(7, 7, 256, 256, 3, 1, 1, 1, 1)));
  CHECK(cpu::conv_wgrad_amx_applies(geo(32, 32, 64, 128, 3, 1, 1, 1, 1)));
  CHECK_FALSE(cpu::conv_wgrad_amx_applies(geo(15, 15, 24, 64, 3, 1, 1, 1, 1)));  // C not a multiple of 16
  CHECK_FALSE(cpu::conv_wgrad_amx_applies(geo(15, 15, 64, 40, 3, 1, 1, 1, 1)));  // K not a multiple of 16
  CHECK_FALSE(cpu::conv_wgrad_amx_applies(geo(16, 16, 64, 64, 3, 1, 1, 1, 1, 2)));  // stride 2
  CHECK(cpu::conv_wgrad_amx_applies(geo(3, 3, 64, 64, 3, 1, 1, 1, 1)));  // a 4x4 grid for 3x3 outputs
  CHECK_FALSE(cpu::conv_wgrad_amx_applies(geo(2, 2, 64, 64, 3, 1, 1, 1, 1)));  // a 3x3 grid for 2x2 outputs
  CHECK_FALSE(cpu::conv_wgrad_amx_applies(geo(8, 8, 16, 16, 3, 3, 3, 3, 3)));  // padding wider than the filter
  CHECK_FALSE(cpu::conv_wgrad_amx_applies(geo(12, 12, 16, 16, 9, 4, 4, 4, 4)));  // 9x9 filters
  // The grid: rows W + max(pad_left, pad_right) wide, images H + max(pad_top, pad_bottom) tall,
  // dy's pixels rounded up to 32, x's grid pad_top rows and pad_left pixels ahead of dy's.
  const cpu::AmxGrid a = cpu::conv_wgrad_amx_grid(geo(7, 7, 256, 256, 3, 1, 1, 1, 1));
  CHECK(a.Wg == 8);
  CHECK(a.Hg == 8);
  CHECK(a.Gm == 128);
  CHECK(a.lead == 9);
  CHECK(a.passes == 1);
  CHECK(a.slabs == 1);
  // 256 32x32 images: a 33x33 grid, 8,712 blocks of 32 pixels, 137 passes of 64, 8 slabs.
  const cpu::conv_detail::Geo seed = geo(32, 32, 64, 128, 3, 1, 1, 1, 1);
  cpu::conv_detail::Geo seed256 = seed;
  seed256.N = 256;
  const cpu::AmxGrid b = cpu::conv_wgrad_amx_grid(seed256);
  CHECK(b.Gm == 256 * 33 * 33);
  CHECK(b.passes == 137);
  CHECK(b.slabs == cpu::kAmxSlabs);
  // The split: slabs where dw in float32 takes at most 1 MiB (the 64 -> 128 and 64 -> 256 3x3
  // layers), passes above (256 -> 256), unless MPX_AMX_WGRAD_SPLIT says otherwise.
  const char* forced = std::getenv("MPX_AMX_WGRAD_SPLIT");
  if (forced && *forced && std::string(forced) != "auto") {
    WARN("MPX_AMX_WGRAD_SPLIT=" << forced << ": the split's rule is not checked");
  } else {
    CHECK(cpu::conv_wgrad_amx_split(seed) == cpu::AmxSplit::Slabs);
    CHECK(cpu::conv_wgrad_amx_split(geo(15, 15, 64, 256, 3, 1, 1, 1, 1)) == cpu::AmxSplit::Slabs);
    CHECK(cpu::conv_wgrad_amx_split(geo(7, 7, 256, 256, 3, 1, 1, 1, 1)) == cpu::AmxSplit::Passes);
    CHECK(cpu::conv_wgrad_amx_split(geo(7, 7, 112, 256, 3, 1, 1, 1, 1)) == cpu::AmxSplit::Slabs);   // 1,032,192 B
    CHECK(cpu::conv_wgrad_amx_split(geo(7, 7, 128, 256, 3, 1, 1, 1, 1)) == cpu::AmxSplit::Passes);  // 1,179,648 B
  }
}
