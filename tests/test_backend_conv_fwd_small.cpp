// SPDX-License-Identifier: MIT
// mpx's forward pass of stride-1 convolutions with few input channels
// (lib/backend/cpu/conv/conv_fwd_small.cpp, docs/cpu-performance.md "The first layer's forward
// pass") against the float64 reference: the float32 sums of R*S*C products and the bias,
// relu, then for 16-bit outputs one rounding; 1 to 4 channels, 16/32/64 filters, filters from
// 1x1 to 5x5, every padding, runs of pixels that do not fill a register block, 1 to 3 threads.
// In 16 bits the output is the float32 kernel's result rounded once, bit for bit; NaN stays
// NaN through relu. Through the backend: the kernel it names, for 16-bit outputs and, with
// AVX-512, for float32 ones but several channels with 32 filters. With another activation or a
// kept pre-activation (and 24 filters), the kernel's per-row epilogue against the backend's
// separate pass over the same float32 sums, bit for bit. On bfloat16 dot products (bfloat16
// weights, a CPU with AVX512-BF16): the FMA loop's bits, subnormal sums flushed to zero.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <omp.h>

#include "backend/cpu/conv/conv_fwd_small.h"
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

/// y (and the kept pre-activation, where `pre` is given) of the kernel at `threads` threads, as
/// float32 values; x given as float32 values of dtype t.
std::vector<float> run(const cpu::conv_detail::Geo& g, const std::vector<float>& x, const std::vector<float>& w,
                       const std::vector<float>& b, Activation act, DType t, int threads,
                       std::vector<float>* pre = nullptr, bool w_bf16 = false) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const size_t ny = static_cast<size_t>(g.N * g.P * g.Q * g.K);
  const support::OmpThreads th(threads);
  std::vector<float> scratch(cpu::conv_fwd_small_scratch(g, threads), nan);
  std::vector<float> y(ny, nan);
  if (pre) pre->assign(ny, nan);
  if (t == DType::F32) {
    cpu::conv_fwd_small(g, x.data(), w.data(), b.data(), act, pre ? pre->data() : nullptr, y.data(), t,
                        scratch.data());
  } else {
    const std::vector<uint16_t> x16 = support::to16(x, t);
    std::vector<uint16_t> y16(ny, 0xFFFF), pre16(ny, 0xFFFF);  // 0xFFFF: a NaN in both formats
    const std::vector<uint16_t> w16 = w_bf16 ? support::to16(w, DType::BF16) : std::vector<uint16_t>();
    cpu::conv_fwd_small(g, x16.data(), w.data(), b.data(), act, pre ? pre16.data() : nullptr, y16.data(), t,
                        scratch.data(), w_bf16 ? w16.data() : nullptr);
    convert(y16.data(), t, y.data(), DType::F32, ny);
    if (pre) convert(pre16.data(), t, pre->data(), DType::F32, ny);
  }
  return y;
}

std::vector<float> run(const cpu::conv_detail::Geo& g, const std::vector<float>& x, const std::vector<float>& w,
                       const std::vector<float>& b, bool relu, DType t, int threads, bool w_bf16 = false) {
  return run(g, x, w, b, relu ? Activation{ActKind::Relu, 0.0f} : Activation::None, t, threads, nullptr, w_bf16);
}

/// v rounded to bfloat16, each value.
std::vector<float> to_bf16_values(std::vector<float> v) {
  for (float& f : v) f = round_to(DType::BF16, f);
  return v;
}

/// f rounded to t as the kernel rounds its output: where the CPU's VCVTNEPS2BF16 rounds
/// bfloat16 (cpu::own_bf16_math()), a float32 subnormal is first a zero of its sign.
float round_as_kernel(DType t, float f) {
  if (t == DType::BF16 && cpu::own_bf16_math() && std::fpclassify(f) == FP_SUBNORMAL)
    f = std::copysign(0.0f, f);
  return round_to(t, f);
}

double unit_roundoff(DType t) {
  return t == DType::BF16 ? std::ldexp(1.0, -8) : t == DType::F16 ? std::ldexp(1.0, -11) : 0.0;
}

/// A case's geometry and its x (values of dtype t), w and b (float32), from a seeded Rng.
struct CaseData {
  Conv2dParams p;
  ref::ConvDims d;
  cpu::conv_detail::Geo g;
  std::vector<float> x, w, b;
};
CaseData case_data(const ConvCase& c, DType t, uint64_t seed) {
  CaseData k;
  k.p = c.params();
  k.d = ref::conv_dims(k.p, c.N, c.H, c.W, c.C, c.K);
  k.g = support::stride1_geo(c, k.d);
  Rng rng(seed);
  k.x = support::uniform_values(rng, c.N * c.H * c.W * c.C, t);
  k.w = support::uniform_values(rng, c.K * c.R * c.S * c.C, DType::F32);
  k.b = support::uniform_values(rng, c.K, DType::F32);
  return k;
}

}  // namespace

TEST_CASE("few-channel forward convolution: within its float32 summation bound of the float64 reference",
          "[backend][cpu][conv]") {
  for (const ConvCase& c : support::few_channel_cases())
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      for (bool relu : {false, true}) DYNAMIC_SECTION(c.name << " " << dtype_name(t) << (relu ? " relu" : "")) {
          const auto& [p, d, g, x, w, b] = case_data(c, t, static_cast<uint64_t>(c.N * 977 + c.H * 31 + c.C * 7 + c.K));
          REQUIRE(cpu::conv_fwd_small_applies(g));
          const Vec bv = support::widen(b);
          const Vec ry = ref::conv2d_forward(p, d, support::widen(x), support::widen(w), &bv, Activation::None);
          std::vector<float> ax(x.size()), aw(w.size()), ab(b.size());
          for (size_t i = 0; i < x.size(); ++i) ax[i] = std::fabs(x[i]);
          for (size_t i = 0; i < w.size(); ++i) aw[i] = std::fabs(w[i]);
          for (size_t i = 0; i < b.size(); ++i) ab[i] = std::fabs(b[i]);
          const Vec abv = support::widen(ab);
          const Vec my = ref::conv2d_forward(p, d, support::widen(ax), support::widen(aw), &abv, Activation::None);
          // float32 sums of R*S*C products and the bias; then relu (exact) and, in 16 bits,
          // one rounding to nearest: |round(v) - r| <= u16 |v| + |v - r|, |v| <= |r| + |v - r|.
          const double n = static_cast<double>(c.R * c.S * c.C + 1), u = std::ldexp(1.0, -24);
          const double gamma = n * u / (1 - n * u), u16 = unit_roundoff(t);
          const double tiny = t == DType::F16 ? std::ldexp(1.0, -25) : 1e-30;  // half a float16 subnormal step
          for (int threads : {1, 2, 3}) {
            const std::vector<float> y = run(g, x, w, b, relu, t, threads);
            INFO(threads << " threads");
            for (size_t i = 0; i < y.size(); ++i) {
              const double r = relu && ry[i] < 0 ? 0.0 : ry[i];
              const double sum_err = gamma * my[i];
              const double tol = sum_err * (1 + 2 * u16) + u16 * std::fabs(r) + tiny;
              if (!(std::fabs(y[i] - r) <= tol)) FAIL("y[" << i << "] " << y[i] << ", reference " << r);
              if (relu && std::signbit(y[i])) FAIL("y[" << i << "] " << y[i] << " is negative after relu");
            }
            if (t != DType::F32) {  // 16-bit: the float32 kernel's result on the same values, rounded once
              std::vector<float> y32 = run(g, x, w, b, relu, DType::F32, threads);
              for (float& v : y32) v = round_as_kernel(t, v);
              support::check_exact("y against the float32 kernel rounded once", y, y32);
            }
          }
        }
}

TEST_CASE("few-channel forward convolution on bfloat16 dot products: with bfloat16 weights, the float32 FMA loop's "
          "sums in its order, rounded once, bit for bit",
          "[backend][cpu][conv]") {
  // vdpbf16ps adds a pair's odd element first, and the pairs hold the earlier tap there; each
  // product is exact, so the sums are the FMA loop's (checked against float64 above). Every
  // shape of the shared cases (an odd tap count leaves a lone tap), relu or none, an epilogue
  // with a kept pre-activation and 24 filters, 1 to 3 threads.
  const bool dots = cpu::fwd_small_dots(DType::BF16, true);
  if (!dots)
    WARN("no bfloat16 dot products here (kernel ISA " << cpu::conv_fwd_small_isa() << "): both runs take the FMA loop");
  std::vector<ConvCase> cases = support::few_channel_cases();
  cases.push_back({"2x2 valid, C=3, K=24 (the whitening layer's shape)", 3, 9, 8, 3, 24, 2, 2, 0, 0, 0, 0});
  const Activation relu{ActKind::Relu, 0.0f}, gelu{ActKind::Gelu, 0.0f};
  for (const ConvCase& c : cases)
    for (Activation act : {Activation::None, relu, gelu})
      DYNAMIC_SECTION(c.name << " " << (act.is_none() ? "none" : activation_name(act.kind))) {
        auto k = case_data(c, DType::BF16, static_cast<uint64_t>(c.N * 389 + c.H * 13 + c.C * 3 + c.K));
        const std::vector<float> wb = to_bf16_values(k.w), bb = to_bf16_values(k.b);
        const bool keep_pre = act.kind == ActKind::Gelu;
        for (int threads : {1, 2, 3}) {
          INFO(threads << " threads");
          std::vector<float> pre_fma, pre_dots;
          const std::vector<float> fma =
              run(k.g, k.x, wb, bb, act, DType::BF16, threads, keep_pre ? &pre_fma : nullptr);
          const std::vector<float> y =
              run(k.g, k.x, wb, bb, act, DType::BF16, threads, keep_pre ? &pre_dots : nullptr, true);
          support::check_exact("y on dot products against the FMA loop", y, fma);
          if (keep_pre) support::check_exact("pre on dot products against the FMA loop", pre_dots, pre_fma);
        }
      }
  SECTION("a NaN input reaches only the outputs that read it, and relu keeps it") {
    const ConvCase c{"3x3 valid, C=1, K=32", 1, 6, 7, 1, 32, 3, 3, 0, 0, 0, 0};
    const ref::ConvDims d = ref::conv_dims(c.params(), c.N, c.H, c.W, c.C, c.K);
    const cpu::conv_detail::Geo g = support::stride1_geo(c, d);
    Rng rng(29);
    std::vector<float> x = support::uniform_values(rng, c.N * c.H * c.W, DType::BF16);
    x[static_cast<size_t>(c.W - 1)] = std::numeric_limits<float>::quiet_NaN();  // row 0, last column
    const std::vector<float> w = to_bf16_values(support::uniform_values(rng, c.K * 9, DType::F32));
    const std::vector<float> b(static_cast<size_t>(c.K), -10.0f);
    const std::vector<float> y = run(g, x, w, b, true, DType::BF16, 2, true);
    for (int64_t px = 0; px < d.P * d.Q; ++px)
      for (int64_t kk = 0; kk < c.K; ++kk) {
        const float v = y[static_cast<size_t>(px * c.K + kk)];
        INFO("pixel " << px << ", filter " << kk << ": " << v);
        if (px == d.Q - 1)  // the one output whose taps cover row 0's last column
          CHECK(std::isnan(v));
        else
          CHECK(v == 0.0f);
      }
  }
}

TEST_CASE("few-channel forward convolution: relu keeps NaN, and a NaN input reaches only the outputs that read it",
          "[backend][cpu][conv]") {
  const DType t = GENERATE(DType::F32, DType::BF16);
  const ConvCase c{"3x3 valid, C=1, K=16", 1, 6, 6, 1, 16, 3, 3, 0, 0, 0, 0};
  const Conv2dParams p = c.params();
  const ref::ConvDims d = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
  const cpu::conv_detail::Geo g = support::stride1_geo(c, d);
  Rng rng(23);
  std::vector<float> x = support::uniform_values(rng, c.N * c.H * c.W * c.C, t);
  x[0] = std::numeric_limits<float>::quiet_NaN();  // read only by output pixel (0, 0)
  const std::vector<float> w = support::uniform_values(rng, c.K * 9, DType::F32), b(static_cast<size_t>(c.K), -10.0f);
  const std::vector<float> y = run(g, x, w, b, true, t, 2);
  for (int64_t px = 0; px < d.P * d.Q; ++px)
    for (int64_t k = 0; k < c.K; ++k) {
      const float v = y[static_cast<size_t>(px * c.K + k)];
      INFO("pixel " << px << ", filter " << k << ": " << v);
      if (px == 0)
        CHECK(std::isnan(v));
      else
        CHECK(v == 0.0f);  // |conv| <= 9 < 10: relu of a negative sum is +0
    }
}

TEST_CASE("few-channel forward convolution: a float32 subnormal output is a zero of its sign where the CPU rounds "
          "bfloat16, else a bfloat16 subnormal",
          "[backend][cpu][conv]") {
  // Every output is x * w of tap 0 alone: 2^-65 * +-2^-65 = +-2^-130, by filter.
  const ConvCase c{"3x3 valid, C=1, K=16", 2, 7, 9, 1, 16, 3, 3, 0, 0, 0, 0};
  const Conv2dParams p = c.params();
  const ref::ConvDims d = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
  const cpu::conv_detail::Geo g = support::stride1_geo(c, d);
  const std::vector<float> x(static_cast<size_t>(c.N * c.H * c.W), std::ldexp(1.0f, -65));
  std::vector<float> w(static_cast<size_t>(c.K * 9), 0.0f);
  for (int64_t k = 0; k < c.K; ++k) w[static_cast<size_t>(k * 9)] = std::ldexp(k % 3 == 0 ? -1.0f : 1.0f, -65);
  const std::vector<float> b(static_cast<size_t>(c.K), 0.0f);
  const bool native = cpu::own_bf16_math();
  INFO((native ? "VCVTNEPS2BF16" : "elem16's formula") << ", kernel ISA " << cpu::conv_fwd_small_isa());
  const std::vector<float> y = run(g, x, w, b, false, DType::BF16, 2);
  for (size_t i = 0; i < y.size(); ++i) {
    const float exact = std::ldexp(i % static_cast<size_t>(c.K) % 3 == 0 ? -1.0f : 1.0f, -130);
    const float want = native ? std::copysign(0.0f, exact) : round_to(DType::BF16, exact);
    INFO("y[" << i << "] " << y[i]);
    REQUIRE(std::memcmp(&y[i], &want, sizeof want) == 0);  // the sign of a zero too
  }
  if (!native) CHECK(round_to(DType::BF16, std::ldexp(1.0f, -130)) != 0.0f);
  // On bfloat16 dot products (bfloat16 weights; these are) vdpbf16ps flushes the subnormal sum
  // itself: a zero, whose sign the next pair's +0 product may turn positive.
  const std::vector<float> yd = run(g, x, w, b, false, DType::BF16, 2, true);
  for (size_t i = 0; i < yd.size(); ++i) {
    INFO("dot products: y[" << i << "] " << yd[i]);
    if (cpu::fwd_small_dots(DType::BF16, true))
      REQUIRE(yd[i] == 0.0f);
    else
      REQUIRE(std::memcmp(&yd[i], &y[i], sizeof(float)) == 0);
  }
}

TEST_CASE("the backend's first-layer forward runs the few-channel kernel where its rule says",
          "[backend][cpu][conv]") {
  const DType t = GENERATE(DType::F32, DType::BF16, DType::F16);
  // (channels, filters): the MNIST nets' first layer, then a 3-channel layer with 32 filters
  // (float32 stays on oneDNN) and with 64 (float32 on the kernel with AVX-512).
  const auto ck = GENERATE(std::make_pair(int64_t{1}, int64_t{32}), std::make_pair(int64_t{3}, int64_t{32}),
                           std::make_pair(int64_t{3}, int64_t{64}));
  support::CpuDev d;
  Rng rng(19);
  Conv2dParams p;  // 3x3 valid, as the MNIST smoke net's first layer
  p.R = p.S = 3;
  const int64_t N = 4, H = 10, W = 9, C = ck.first, K = ck.second;
  const ref::ConvDims rd = ref::conv_dims(p, N, H, W, C, K);
  std::vector<float> xv, wv, bv;
  Tensor x = d.rand(rng, t, Shape{N, H, W, C}, &xv), w = d.rand(rng, t, Shape{K, 3, 3, C}, &wv);
  Tensor b = d.rand(rng, DType::F32, Shape{K}, &bv);
  Tensor y = d.make(t, Shape{N, rd.P, rd.Q, K});
  d.be->conv2d_forward(p, x, w, b, y, Activation::Relu);
  const Vec rb = support::widen(bv);
  const Vec ry = ref::conv2d_forward(p, rd, support::widen(xv), support::widen(wv), &rb, Activation::Relu);
  support::check_close("y", d.get(y), ry, t);
  bool named = false;
  for (const KernelChoice& k : d.be->kernels())
    named = named || (k.op.rfind("convolution forward", 0) == 0 && k.impl.rfind("mpx:few-channels", 0) == 0);
  const bool native = support::onednn_native16_ran(d.be->kernels());  // the path that runs them here
  const char* mode = std::getenv("MPX_CONV_FORWARD");
  const bool off = (mode && std::string(mode) == "onednn") || std::getenv("MPX_CPU_REFERENCE");
  INFO(dtype_name(t) << ", " << C << " channels, " << K << " filters, kernel ISA " << cpu::conv_fwd_small_isa());
  if (off)
    CHECK_FALSE(named);
  else if (t == DType::F32)
    CHECK(named == (cpu::kernel_isa() == cpu::KernelIsa::Avx512 && (C == 1 || K != 32)));
  else if (!native)  // where oneDNN's native 16-bit kernels run (AMX) they take the layer first
    CHECK(named);
}

TEST_CASE("few-channel forward convolution with an epilogue: GELU, SiLU or none and the kept pre-activation, per "
          "row in cache, equal the float32 kernel's sums through the backend's separate activation pass",
          "[backend][cpu][conv]") {
  // 24 filters (computed as 32 with zero filters) as in the fast CIFAR recipe's whitening layer,
  // and the shared cases' 16/32/64.
  std::vector<ConvCase> cases = {
      {"2x2 valid, C=3, K=24 (the whitening layer's shape)", 3, 9, 8, 3, 24, 2, 2, 0, 0, 0, 0},
      {"3x3 same, C=1, K=24", 2, 7, 5, 1, 24, 3, 3, 1, 1, 1, 1},
  };
  for (const ConvCase& c : support::few_channel_cases()) cases.push_back(c);
  const Activation gelu{ActKind::Gelu, 0.0f}, silu{ActKind::Silu, 0.0f};
  for (const ConvCase& c : cases)
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      for (Activation act : {gelu, silu, Activation::None})
        for (bool keep_pre : {true, false}) {
          if (act.is_none() && !keep_pre) continue;  // no epilogue
          DYNAMIC_SECTION(c.name << " " << dtype_name(t) << " " << (act.is_none() ? "none" : activation_name(act.kind))
                                 << (keep_pre ? ", pre kept" : "")) {
            const auto& [p, d, g, x, w, b] = case_data(c, t, static_cast<uint64_t>(c.N * 131 + c.H * 17 + c.C * 5 + c.K));
            REQUIRE(cpu::conv_fwd_small_applies(g));
            // The float32 sums without an activation (checked against float64 above), through
            // the backend's separate epilogue pass over a whole tensor.
            const std::vector<float> z = run(g, x, w, b, Activation::None, DType::F32, 1);
            const size_t ny = z.size();
            std::vector<float> zw = z, want_y(ny), want_pre(ny);
            std::vector<uint16_t> y16(ny), pre16(ny);
            const Shape s{static_cast<int64_t>(ny)};
            const bool wide = t == DType::F32;
            const Tensor ty(wide ? static_cast<void*>(want_y.data()) : y16.data(), t, s);
            const Tensor tp(wide ? static_cast<void*>(want_pre.data()) : pre16.data(), t, s);
            // (A float32 output is z's own buffer, as the backend's f32_out gives it.)
            cpu::activation_epilogue(act, zw.data(), wide ? Tensor(zw.data(), t, s) : ty, keep_pre ? tp : Tensor());
            if (wide) {
              want_y = zw;
            } else {
              convert(y16.data(), t, want_y.data(), DType::F32, ny);
              convert(pre16.data(), t, want_pre.data(), DType::F32, ny);
            }
            // The float64 reference of the activation, loosely: the epilogue's own accuracy is
            // activation tests' business; this catches a wrong filter, pixel or row.
            const Vec bv = support::widen(b);
            const Vec ry = ref::conv2d_forward(p, d, support::widen(x), support::widen(w), &bv, act);
            for (int threads : {1, 2, 3}) {
              INFO(threads << " threads");
              std::vector<float> pre;
              const std::vector<float> y = run(g, x, w, b, act, t, threads, keep_pre ? &pre : nullptr);
              support::check_exact("y against the separate epilogue", y, want_y);
              if (keep_pre) support::check_exact("pre against the separate epilogue", pre, want_pre);
              for (size_t i = 0; i < ny; ++i)
                if (!(std::fabs(y[i] - ry[i]) <= 1e-2 * (1 + std::fabs(ry[i]))))
                  FAIL("y[" << i << "] " << y[i] << ", float64 reference " << ry[i]);
            }
          }
        }
}
