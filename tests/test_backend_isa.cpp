// SPDX-License-Identifier: MIT
// The CPU kernels built for the baseline x86-64 ISA, AVX2 and AVX-512 (chosen at run time
// by cpuid; MPX_CPU_BASELINE=1 forces the baseline build, MPX_CPU_POOL_ISA=avx2 caps max
// pooling at AVX2, as CTest's test_backend_isa_pool_avx2 does): the chosen build and the
// baseline give the same bits, and both match the float64 reference, including the "first
// maximum, NaN wins" rule. The activation loops (elementwise/activation.cpp) likewise give
// the same bits in every build, under ONEDNN_MAX_CPU_ISA=AVX2 too (test_backend_isa_onednn_avx2).
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/activation.h"
#include "core/half.h"
#include "support/backend_check.h"

using namespace mpx;

namespace {

struct Baseline {
  explicit Baseline(bool on) { on ? setenv("MPX_CPU_BASELINE", "1", 1) : unsetenv("MPX_CPU_BASELINE"); }
  ~Baseline() { unsetenv("MPX_CPU_BASELINE"); }
};

}  // namespace

TEST_CASE("tiled max pooling: the chosen and the baseline builds give the same bits", "[backend][pool][isa]") {
  support::CpuDev d;
  Rng rng(31);
  const DType t = DType::F32;
  for (const auto& dims : std::vector<std::array<int64_t, 5>>{
           {4, 26, 26, 32, 2}, {2, 9, 7, 64, 2}, {3, 9, 9, 300, 3}, {2, 8, 8, 5, 2}, {1, 7, 6, 17, 2}}) {
    const int64_t N = dims[0], H = dims[1], W = dims[2], C = dims[3], k = dims[4];
    INFO("x [" << N << "," << H << "," << W << "," << C << "], window " << k);
    PoolParams p;
    p.kind = PoolKind::Max;
    p.R = p.S = static_cast<int>(k);
    p.stride_h = p.stride_w = static_cast<int>(k);
    const int64_t P = p.out_h(static_cast<int>(H)), Q = p.out_w(static_cast<int>(W));
    std::vector<float> xv, dyv;
    const Tensor x = d.rand(rng, t, Shape{N, H, W, C}, &xv);
    // Ties and NaN in a few windows: the first maximum takes dy, a NaN wins.
    xv[1] = xv[0];
    xv[static_cast<size_t>(C + 3)] = support::kNaN;
    d.put(x, xv);
    const Tensor dy = d.rand(rng, t, Shape{N, P, Q, C}, &dyv);
    std::vector<float> y[2], dx[2];
    for (int base = 0; base < 2; ++base) {
      Baseline b(base == 1);
      const Tensor yt = d.make(t, Shape{N, P, Q, C});
      const Tensor dxt = d.make(t, Shape{N, H, W, C});
      d.be->pool_forward(p, x, yt);
      d.be->pool_backward(p, x, yt, dy, dxt);
      y[base] = d.get(yt);
      dx[base] = d.get(dxt);
    }
    support::check_exact("pool forward, AVX2 vs baseline", y[0], y[1]);
    support::check_exact("pool backward, AVX2 vs baseline", dx[0], dx[1]);
    // And the maxima against the reference, except the one window holding the NaN (x at
    // h 0, w 1, channel 3: output 3), where the backend's rule makes the output NaN.
    const ref::Vec want = ref::pool_forward(p, N, H, W, C, support::widen(xv));
    REQUIRE(want.size() == y[0].size());
    CHECK(std::isnan(y[0][3]));
    int mismatches = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (i != 3 && y[0][i] != static_cast<float>(want[i])) ++mismatches;
    CHECK(mismatches == 0);
  }
}

TEST_CASE("activation loops: the chosen and the baseline builds give the same bits", "[backend][activation][isa]") {
  // Every kind of core/activation.h's table but the identity, in every dtype, over more than
  // two blocks of a length no vector width divides, with the values where the formulas
  // change branch or saturate: NaN, the infinities, signed zeros, subnormals, the tails.
  std::vector<Activation> acts;
  for (const ActivationEntry& n : kActivationNames) {
    bool seen = n.kind == ActKind::None;
    for (Activation a : acts) seen = seen || a.kind == n.kind;
    if (!seen) acts.push_back(Activation{n.kind, n.kind == ActKind::LeakyRelu ? 0.2f : 0.0f});
  }
  acts.push_back(Activation{ActKind::Scale, 1.0f / 9.0f});
  const float specials[] = {support::kNaN, support::kInf, -support::kInf, 0.0f, -0.0f, 1e-40f, -1e-40f,
                            1e-30f, -1e-30f, 9.0f, -9.0f, 40.0f, -40.0f, 88.0f, -88.0f, 110.0f, -110.0f,
                            3e38f, -3e38f};
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    for (Activation a : acts) {
      INFO(activation_name(a.kind) << " (alpha " << a.alpha << "), " << dtype_name(t));
      support::CpuDev d;
      Rng rng(43);
      const int64_t n = 10007;
      std::vector<float> xv, dyv;
      const Tensor x = d.rand_plain(rng, t, Shape{n}, &xv, -8, 8);
      for (size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i) xv[i * 131] = specials[i];
      d.put(x, xv);
      const Tensor dy = d.rand(rng, t, Shape{n}, &dyv);
      std::vector<float> y[2], dx[2];
      for (int base = 0; base < 2; ++base) {
        Baseline b(base == 1);
        const Tensor yt = d.make(t, Shape{n});
        const Tensor dxt = d.make(t, Shape{n});
        d.be->activation_forward(a, x, yt);
        d.be->activation_backward(a, x, dy, dxt);
        y[base] = d.get(yt);
        dx[base] = d.get(dxt);
      }
      support::check_exact("activation forward, chosen build vs baseline", y[0], y[1]);
      support::check_exact("activation backward, chosen build vs baseline", dx[0], dx[1]);
    }
  }
}

TEST_CASE("the activation epilogue of a dense layer: the chosen and the baseline builds give the same bits",
          "[backend][activation][isa]") {
  support::CpuDev d;
  Rng rng(44);
  for (DType t : {DType::F32, DType::BF16}) {
    INFO(dtype_name(t));
    std::vector<float> xv, wv, bv;
    const Tensor x = d.rand(rng, t, Shape{67, 45}, &xv, -3, 3);
    const Tensor w = d.rand(rng, t, Shape{37, 45}, &wv);
    const Tensor bias = d.rand(rng, t, Shape{37}, &bv);
    std::vector<float> y[2], pre[2];
    for (int base = 0; base < 2; ++base) {
      Baseline b(base == 1);
      const Tensor yt = d.make(t, Shape{67, 37});
      const Tensor pt = d.make(t, Shape{67, 37});
      d.be->dense_forward(x, w, bias, yt, Activation{ActKind::Gelu}, pt);
      y[base] = d.get(yt);
      pre[base] = d.get(pt);
    }
    support::check_exact("dense forward with gelu, chosen build vs baseline", y[0], y[1]);
    support::check_exact("its pre-activation", pre[0], pre[1]);
  }
}

TEST_CASE("activation loops: the build that runs is the widest that the CPU and oneDNN's ISA limit allow",
          "[backend][activation][isa]") {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  const bool avx2_cap = cap && (std::string(cap) == "AVX2" || std::string(cap) == "avx2");
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string want = __builtin_cpu_supports("avx512f") && !avx2_cap ? "avx512"
                           : avx2_fma                                     ? "avx2"
                                                                          : "baseline";
  CHECK(std::string(cpu::activation_build()) == want);
  Baseline b(true);
  CHECK(std::string(cpu::activation_build()) == "baseline");
}

TEST_CASE("relu backward on bfloat16 bits: every bit pattern of y and of dy gives the widening formula's bits",
          "[backend][activation][isa]") {
  // The bfloat16 relu backward runs on the bits (elementwise/activation.cpp); its reference
  // is the float32 formula on the widened values, rounded as every 16-bit store is:
  // f32_to_bf16(activation_grad(relu, y, dy)). Every y against a set of dy that holds the
  // NaNs (signalling, quiet, negative), the infinities, signed zeros and subnormals, and every
  // dy against such a set of y; in the chosen build and the baseline.
  const uint16_t dys[] = {0x3F80, 0xBF80, 0x7F81, 0x7FC0, 0xFFC1, 0xFF81, 0x7F80, 0xFF80,
                          0x8000, 0x0000, 0x0001, 0x8001, 0x7F7F, 0x007F, 0x4049};
  const uint16_t ys[] = {0x3F80, 0xBF80, 0x0000, 0x8000, 0x0001, 0x8001, 0x7F80, 0xFF80, 0x7F81, 0xFFC0, 0x7F7F};
  const int64_t nd = sizeof dys / sizeof dys[0], ny = sizeof ys / sizeof ys[0];
  std::vector<uint16_t> yv, dyv;
  for (int64_t b = 0; b < 65536; ++b)
    for (int64_t k = 0; k < nd; ++k) yv.push_back(static_cast<uint16_t>(b)), dyv.push_back(dys[k]);
  for (int64_t b = 0; b < 65536; ++b)
    for (int64_t k = 0; k < ny; ++k) yv.push_back(ys[k]), dyv.push_back(static_cast<uint16_t>(b));
  const int64_t n = static_cast<int64_t>(yv.size());
  std::vector<uint16_t> want(yv.size());
  for (size_t i = 0; i < yv.size(); ++i)
    want[i] = f32_to_bf16(activation_grad(Activation::Relu, bf16_to_f32(yv[i]), bf16_to_f32(dyv[i])));
  for (int base = 0; base < 2; ++base) {
    Baseline b(base == 1);
    INFO((base ? "baseline build" : "chosen build"));
    support::CpuDev d;
    const Tensor y = d.make(DType::BF16, Shape{n}), dy = d.make(DType::BF16, Shape{n});
    const Tensor dx = d.make(DType::BF16, Shape{n});
    d.be->upload(y, yv.data());
    d.be->upload(dy, dyv.data());
    d.be->activation_backward(Activation::Relu, y, dy, dx);
    std::vector<uint16_t> got(yv.size());
    d.be->download(got.data(), dx);
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i] && bad++ < 5)
        FAIL_CHECK("y 0x" << std::hex << yv[i] << ", dy 0x" << dyv[i] << ": got 0x" << got[i] << ", want 0x"
                          << want[i]);
    CHECK(bad == 0);
  }
}
