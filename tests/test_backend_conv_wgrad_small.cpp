// SPDX-License-Identifier: MIT
// mpx's weight gradient of stride-1 convolutions with few input channels
// (lib/backend/cpu/conv/conv_wgrad_small.cpp, docs/cpu-performance.md "The first layer's weight
// gradient") against the float64 reference, within the bound of its float32 sums (at most
// kWgradFlushRows output rows each, then float64): 1 to 4 channels, 16/32/64 filters, filters
// from 1x1 to 5x5, every padding, partial tap blocks, 1 to 3 threads; in 16 bits with the rows
// widened the bits of the float32 kernel on the widened values; bfloat16 on dot products
// (where the CPU has them) within the same bound, plus the products and sums it flushes as
// subnormal, and an infinity beside an odd row's last pixel kept out of the other taps;
// through the backend, the kernel it names.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <limits>
#include <vector>

#include <omp.h>

#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/conv/conv_wgrad_small.h"
#include "backend/cpu/native16.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/conv_case.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;

namespace {

using support::ConvCase;

/// dw and db of the kernel at `threads` threads; x and dy given as float32 values of dtype t;
/// `dot`: bfloat16 dot products allowed (where the CPU has them); `buffered`: their pixel pairs
/// through the interleave buffer even where one block of taps interleaves them in registers.
std::pair<std::vector<float>, std::vector<float>> run(const cpu::conv_detail::Geo& g, const std::vector<float>& x,
                                                      const std::vector<float>& dy, DType t, int threads,
                                                      bool dot = true, bool buffered = false) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dw(static_cast<size_t>(g.K * g.R * g.S * g.C), nan), db(static_cast<size_t>(g.K), nan);
  const support::OmpThreads th(threads);
  std::vector<float> scratch(cpu::conv_wgrad_small_scratch(g, threads), nan);
  if (t == DType::F32) {
    cpu::conv_wgrad_small(g, x.data(), dy.data(), t, dw.data(), db.data(), scratch.data(), dot, buffered);
  } else {
    const std::vector<uint16_t> x16 = support::to16(x, t), dy16 = support::to16(dy, t);
    cpu::conv_wgrad_small(g, x16.data(), dy16.data(), t, dw.data(), db.data(), scratch.data(), dot, buffered);
  }
  return {dw, db};
}

/// The float64 reference dw and db, and the same sums over |x| and |dy| (the bound's S).
struct Sums {
  Vec dw, db, mdw, mdb;
};
Sums reference(const Conv2dParams& p, const ref::ConvDims& d, const std::vector<float>& x,
               const std::vector<float>& dy) {
  Sums r;
  r.dw = ref::conv2d_backward_filter(p, d, support::widen(x), support::widen(dy), &r.db);
  std::vector<float> ax(x.size()), ady(dy.size());
  for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
  for (size_t i = 0; i < dy.size(); ++i) ady[i] = std::fabs(dy[i]);
  r.mdw = ref::conv2d_backward_filter(p, d, support::widen(ax), support::widen(ady), &r.mdb);
  return r;
}

/// g(n) of the kernel's float32 sums: at most kWgradFlushRows rows of Q products (then float64,
/// one rounding).
double summation_gamma(const ref::ConvDims& d) {
  const double n = static_cast<double>(cpu::kWgradFlushRows * d.Q + 1), u = std::ldexp(1.0, -24);
  return n * u / (1 - n * u);
}

}  // namespace

TEST_CASE("few-channel weight gradient: within its float32 summation bound of the float64 reference",
          "[backend][cpu][conv]") {
  for (const ConvCase& c : support::few_channel_cases())
    for (DType t : {DType::F32, DType::BF16, DType::F16}) DYNAMIC_SECTION(c.name << " " << dtype_name(t)) {
      const Conv2dParams p = c.params();
      const ref::ConvDims d = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
      const cpu::conv_detail::Geo g = support::stride1_geo(c, d);
      REQUIRE(cpu::conv_wgrad_small_applies(g));
      Rng rng(static_cast<uint64_t>(c.N * 977 + c.H * 31 + c.C * 7 + c.K));
      const std::vector<float> x = support::uniform_values(rng, c.N * c.H * c.W * c.C, t), dy = support::uniform_values(rng, c.N * d.P * d.Q * c.K, t);
      const Sums r = reference(p, d, x, dy);
      const Vec &rdw = r.dw, &rdb = r.db, &mdw = r.mdw, &mdb = r.mdb;
      const double u = std::ldexp(1.0, -24), gamma = summation_gamma(d);
      for (int threads : {1, 2, 3}) {
        const auto [dw, db] = run(g, x, dy, t, threads);
        INFO(threads << " threads"
                     << (t == DType::BF16 && cpu::own_bf16_math() ? ", bfloat16 dot products" : ""));
        for (size_t i = 0; i < dw.size(); ++i) {
          const double tol = gamma * mdw[i] + u * std::fabs(rdw[i]) + 1e-30;
          if (!(std::fabs(dw[i] - rdw[i]) <= tol)) FAIL("dw[" << i << "] " << dw[i] << ", reference " << rdw[i]);
        }
        for (size_t k = 0; k < db.size(); ++k) {
          const double tol = gamma * mdb[k] + u * std::fabs(rdb[k]) + 1e-30;
          if (!(std::fabs(db[k] - rdb[k]) <= tol)) FAIL("db[" << k << "] " << db[k] << ", reference " << rdb[k]);
        }
        if (t == DType::BF16) {  // dy's pairs in registers or through the buffer: the same sums, bit for bit
          const auto [dwb, dbb] = run(g, x, dy, t, threads, true, true);
          support::check_exact("dw against the buffered pairs", dw, dwb);
          support::check_exact("db against the buffered pairs", db, dbb);
        }
        if (t != DType::F32) {  // 16-bit rows widened: the bits of the float32 kernel on their values
          const auto [dw16, db16] = run(g, x, dy, t, threads, false);
          const auto [dw32, db32] = run(g, x, dy, DType::F32, threads);
          support::check_exact("dw against the float32 kernel", dw16, dw32);
          support::check_exact("db against the float32 kernel", db16, db32);
        }
      }
    }
}

TEST_CASE("few-channel weight gradient on bfloat16 dot products: subnormals, and an infinity at an odd row's end",
          "[backend][cpu][conv]") {
  if (!cpu::own_bf16_math()) {
    WARN("no bfloat16 dot products here (CPU, ONEDNN_MAX_CPU_ISA or MPX_CPU_16BIT=widen): nothing to check");
    return;
  }
  const ConvCase c = support::few_channel_cases()[0];  // 3x3 valid, one channel, 32 filters
  const Conv2dParams p = c.params();
  const ref::ConvDims d = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
  REQUIRE(d.Q % 2 == 1);  // the last pixel of each row pairs with zero
  REQUIRE(c.N == 3);
  const cpu::conv_detail::Geo g = support::stride1_geo(c, d);
  Rng rng(71);
  std::vector<float> x = support::uniform_values(rng, c.N * c.H * c.W, DType::BF16),
                     dy = support::uniform_values(rng, c.N * d.P * d.Q * c.K, DType::BF16);
  const int64_t img = c.H * c.W, dimg = d.P * d.Q * c.K;
  // Image 0: x subnormal (bfloat16 keeps 2^-127 times a value in [-1, 1) as a subnormal).
  for (int64_t i = 0; i < img; ++i) x[i] = round_to(DType::BF16, std::ldexp(x[i], -127));
  // Image 1: normal operands whose products fall below 2^-126.
  for (int64_t i = img; i < 2 * img; ++i) x[i] = round_to(DType::BF16, std::ldexp(x[i], -60));
  for (int64_t i = dimg; i < 2 * dimg; ++i) dy[i] = round_to(DType::BF16, std::ldexp(dy[i], -70));
  // Image 2: an infinity in the last column of row 3, which only the last pixel's third
  // column tap reads; the pair beside the odd last pixel holds it too.
  x[2 * img + 3 * c.W + (c.W - 1)] = std::numeric_limits<float>::infinity();

  const Sums r = reference(p, d, x, dy);
  const Vec &rdw = r.dw, &rdb = r.db, &mdw = r.mdw, &mdb = r.mdb;
  // The products the instruction may lose: images 0 and 1 entirely (their sums over |x| |dy|).
  std::vector<float> x01 = x;
  std::fill(x01.begin() + 2 * img, x01.end(), 0.0f);
  const Vec fdw = reference(p, d, x01, dy).mdw;
  const double u = std::ldexp(1.0, -24), gamma = summation_gamma(d);
  const double adds = std::ldexp(static_cast<double>(c.N * d.P * d.Q + 1), -126);  // sums flushed to zero
  int nonfinite = 0;
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    const auto [dw, db] = run(g, x, dy, DType::BF16, threads);
    for (size_t i = 0; i < dw.size(); ++i) {
      INFO("dw[" << i << "] " << dw[i] << ", reference " << rdw[i]);
      REQUIRE(std::isfinite(dw[i]) == std::isfinite(rdw[i]));
      if (!std::isfinite(rdw[i])) {
        ++nonfinite;
        continue;
      }
      REQUIRE(std::fabs(dw[i] - rdw[i]) <= gamma * mdw[i] + u * std::fabs(rdw[i]) + fdw[i] + adds);
    }
    for (size_t k = 0; k < db.size(); ++k)
      REQUIRE(std::fabs(db[k] - rdb[k]) <= gamma * mdb[k] + u * std::fabs(rdb[k]) + adds);
    // Subnormal operands count as zero: image 0's x as zeros gives the same bits.
    std::vector<float> x0 = x;
    std::fill(x0.begin(), x0.begin() + img, 0.0f);
    const auto [dw0, db0] = run(g, x0, dy, DType::BF16, threads);
    support::check_exact("dw with image 0's subnormal x as zeros", dw, dw0);
  }
  // Non-finite in both runs: every filter's taps (r, 2), r = 0..2 (output rows 3, 2, 1 read
  // input row 3 through them), and no other tap.
  CHECK(nonfinite == 2 * 3 * c.K);
}

TEST_CASE("few-channel kernels (weight gradient and forward): the shapes they take", "[backend][cpu][conv]") {
  auto* const applies = GENERATE(&cpu::conv_wgrad_small_applies, &cpu::conv_fwd_small_applies);
  cpu::conv_detail::Geo g{};
  g.N = 2, g.H = 8, g.W = 8, g.C = 3, g.K = 32, g.R = 3, g.S = 3, g.P = 8, g.Q = 8, g.sh = 1, g.sw = 1, g.pt = 1,
  g.pl = 1;
  CHECK(applies(g));
  auto with = [&](auto f) {
    cpu::conv_detail::Geo h = g;
    f(h);
    return applies(h);
  };
  CHECK_FALSE(with([](auto& h) { h.sh = 2; }));
  CHECK_FALSE(with([](auto& h) { h.sw = 2; }));
  CHECK_FALSE(with([](auto& h) { h.C = 5; }));
  CHECK_FALSE(with([](auto& h) { h.K = 48; }));
  CHECK_FALSE(with([](auto& h) { h.R = h.S = 5; }));  // 75 taps
  CHECK(with([](auto& h) { h.K = 16; }));
  CHECK(with([](auto& h) { h.K = 64; }));
}

TEST_CASE("few-channel weight gradient: taps per block, the fewest padded", "[backend][cpu][conv]") {
  // The AVX-512 build's sizes for 32 filters (14 at most) and for 64 (6 at most).
  CHECK(cpu::wgrad_small_taps_per_block(9, {14, 9, 6, 4, 3}) == 9);    // 3x3, one channel: no padding
  CHECK(cpu::wgrad_small_taps_per_block(27, {14, 9, 6, 4, 3}) == 9);   // 3x3x3: 27, not 28
  CHECK(cpu::wgrad_small_taps_per_block(28, {14, 9, 6, 4, 3}) == 14);  // 28 both ways: the larger block
  CHECK(cpu::wgrad_small_taps_per_block(14, {14, 9, 6, 4, 3}) == 14);
  CHECK(cpu::wgrad_small_taps_per_block(9, {6, 6, 6, 4, 3}) == 3);
  CHECK(cpu::wgrad_small_taps_per_block(1, {14, 9, 6, 4, 3}) == 3);  // the smallest size built
}

TEST_CASE("the backend's first-layer weight gradient runs the few-channel kernel and matches float64",
          "[backend][cpu][conv]") {
  support::CpuDev d;
  Rng rng(19);
  Conv2dParams p;  // 3x3 valid, as the MNIST smoke net's first layer
  p.R = p.S = 3;
  const int64_t N = 4, H = 10, W = 9, C = 1, K = 32, P = 8, Q = 7;
  std::vector<float> xv, dyv;
  Tensor x = d.rand(rng, DType::F32, Shape{N, H, W, C}, &xv), dy = d.rand(rng, DType::F32, Shape{N, P, Q, K}, &dyv);
  Tensor dw = d.make(DType::F32, Shape{K, 3, 3, C}), db = d.make(DType::F32, Shape{K});
  d.be->conv2d_backward_filter(p, x, dy, dw, db);
  const ref::ConvDims rd = ref::conv_dims(p, N, H, W, C, K);
  Vec rdb;
  const Vec rdw = ref::conv2d_backward_filter(p, rd, support::widen(xv), support::widen(dyv), &rdb);
  support::check_close("dw", d.get(dw), rdw, DType::F32);
  support::check_close("db", d.get(db), rdb, DType::F32);
  bool named = false;
  for (const KernelChoice& k : d.be->kernels())
    named = named || (k.op.rfind("convolution backward weights", 0) == 0 && k.impl.rfind("mpx:few-channels", 0) == 0);
  const char* mode = std::getenv("MPX_CONV_WGRAD");
  const bool other = mode && (std::string(mode) == "onednn" || std::string(mode) == "gemm");
  if (!std::getenv("MPX_CPU_REFERENCE")) CHECK(named != other);
}
