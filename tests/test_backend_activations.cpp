// SPDX-License-Identifier: MIT
// The CPU backend's activations (core/activation.h) against float64 references (erf,
// tanh, exp from <cmath>, tests/support/reference.h): activation_forward/backward in
// float32 (close) and float16/bfloat16 (the correctly rounded reference, up to the float32
// math's own error), the tails and special values, aliasing; then each activation fused
// into conv2d_forward and dense_forward, with and without the pre-activation output: the
// oneDNN post-op path (leaky_relu) equals the unfused one bit for bit, the epilogue pass
// equals activation_forward on the pre-activation, NaN stays NaN; and the argument checks.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/activation.h"
#include "core/error.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;

namespace {

using support::check_close;
using support::check_exact;
using support::kInf;
using support::kNaN;
using support::widen;
using Dev = support::CpuDev;

/// The activations under test: every kind of core/activation.h's table but the identity
/// (leaky_relu with Keras 3's default slope and a small one).
std::vector<Activation> all_activations() {
  std::vector<Activation> v;
  for (const ActivationEntry& n : kActivationNames) {
    if (n.kind == ActKind::None) continue;
    bool seen = false;
    for (Activation a : v) seen = seen || a.kind == n.kind;
    if (seen) continue;
    if (n.kind == ActKind::LeakyRelu) {
      v.push_back(Activation{n.kind, kLeakyReluDefaultSlope});
      v.push_back(Activation{n.kind, 0.01f});
    } else {
      v.push_back(Activation{n.kind});
    }
  }
  return v;
}

std::string act_str(Activation a) {
  std::string s = activation_name(a.kind);
  if (a.kind == ActKind::LeakyRelu) s += "(" + std::to_string(a.alpha) + ")";
  return s;
}

/// 16-bit results: each element is the reference rounded to t, unless the reference lies so
/// close to a rounding midpoint that the float32 math's error (slack) can tip it; then it
/// must still be one of the two neighbours. Counts the tipped elements (few expected).
int check_rounded(const std::string& what, DType t, const std::vector<float>& got, const Vec& want,
                  double rel_slack, double abs_slack = 0.0) {
  REQUIRE(got.size() == want.size());
  int tipped = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float r = round_to(t, static_cast<float>(want[i]));
    if (got[i] == r || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
    const double err = std::fabs(got[i] - want[i]), best = std::fabs(static_cast<double>(r) - want[i]);
    if (!(err <= best + rel_slack * std::fabs(want[i]) + abs_slack))
      FAIL(what << " (" << dtype_name(t) << "): element " << i << " is " << got[i] << ", the reference " << want[i]
                << " rounds to " << r);
    ++tipped;
  }
  CHECK(tipped <= static_cast<int>(got.size() / 200 + 2));
  return tipped;
}

}  // namespace

// ---- activation_forward / activation_backward -------------------------------------------

TEST_CASE("activations: forward and backward match the float64 reference in every dtype",
          "[backend][cpu][activation]") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  for (Activation a : all_activations()) {
    DYNAMIC_SECTION(act_str(a) << " " << dtype_name(t)) {
      Dev d;
      Rng rng(7);
      const int64_t n = 10007;  // more than two blocks, not a multiple
      std::vector<float> xv, dyv;
      Tensor x = d.rand_plain(rng, t, Shape{n}, &xv, -6, 6);
      Tensor dy = d.rand(rng, t, Shape{n}, &dyv);
      Tensor y = d.make(t, Shape{n});
      d.be->activation_forward(a, x, y);
      Vec want(xv.size()), dwant(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {
        want[i] = ref::act_fn(a, xv[i]);
        dwant[i] = static_cast<double>(dyv[i]) * ref::act_grad(a, xv[i]);
      }
      const std::vector<float> yv = d.get(y);
      if (t == DType::F32)
        check_close("forward", yv, want, t);
      else
        check_rounded("forward", t, yv, want, 4e-6);

      Tensor dx = d.make(t, Shape{n});
      const Tensor& saved = a.backward_reads() == ActSaved::Input ? x : y;
      d.be->activation_backward(a, saved, dy, dx);
      if (t == DType::F32)
        check_close("backward", d.get(dx), dwant, t);
      else
        check_rounded("backward", t, d.get(dx), dwant, 1e-5, 1e-7);
    }
  }
}

TEST_CASE("activations: in place (y aliases x, dx aliases dy) gives the same bits", "[backend][cpu][activation]") {
  auto t = GENERATE(DType::F32, DType::BF16);
  for (Activation a : all_activations()) {
    DYNAMIC_SECTION(act_str(a) << " " << dtype_name(t)) {
      Dev d;
      Rng rng(8);
      const int64_t n = 9000;
      std::vector<float> xv, dyv;
      Tensor x = d.rand_plain(rng, t, Shape{n}, &xv, -4, 4);
      Tensor dy = d.rand(rng, t, Shape{n}, &dyv);
      Tensor y = d.make(t, Shape{n}), dx = d.make(t, Shape{n});
      d.be->activation_forward(a, x, y);
      const Tensor& saved = a.backward_reads() == ActSaved::Input ? x : y;
      d.be->activation_backward(a, saved, dy, dx);
      const std::vector<float> yv = d.get(y), dxv = d.get(dx);
      d.be->activation_backward(a, saved, dy, dy);  // dx aliases dy
      check_exact("backward in place", d.get(dy), dxv);
      d.be->activation_forward(a, x, x);  // y aliases x
      check_exact("forward in place", d.get(x), yv);
    }
  }
}

namespace {
// float64 references without the cancellations of the Keras forms in the far tails
// (1 + erf(v/sqrt2) = erfc(-v/sqrt2); 1 + tanh(u) = 2 sigmoid(2u)), value and derivative.
double tail_value(Activation a, double v) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  if (a.kind == ActKind::Gelu) return 0.5 * v * std::erfc(-v / std::sqrt(2.0));
  if (a.kind == ActKind::GeluTanh) return v / (1.0 + std::exp(-2.0 * c * (v + 0.044715 * v * v * v)));
  return ref::act_fn(a, v);
}
double tail_grad(Activation a, double v) {
  const double pi = 3.14159265358979323846, c = std::sqrt(2.0 / pi);
  if (a.kind == ActKind::Gelu)
    return 0.5 * std::erfc(-v / std::sqrt(2.0)) + v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * pi);
  if (a.kind == ActKind::GeluTanh) {
    const double u = c * (v + 0.044715 * v * v * v);
    const double s = 1.0 / (1.0 + std::exp(-2.0 * u)), sm = 1.0 / (1.0 + std::exp(2.0 * u));
    return s + 2.0 * v * s * sm * c * (1.0 + 3 * 0.044715 * v * v);
  }
  return ref::act_grad(a, v);
}
}  // namespace

TEST_CASE("activations: tails, zeros, huge values and NaN", "[backend][cpu][activation]") {
  Dev d;
  const std::vector<float> xv = {-80.0f, -30.0f, -12.0f, -9.0f, -5.5f, -1e-30f, -0.0f, 0.0f, 1e-30f,
                                 5.5f,   12.0f,  30.0f,  80.0f, 1e30f, -1e30f,  kNaN};
  const int64_t n = static_cast<int64_t>(xv.size());
  Tensor x = d.make(DType::F32, Shape{n});
  d.put(x, xv);
  Tensor y = d.make(DType::F32, Shape{n}), dx = d.make(DType::F32, Shape{n}), dy = d.make(DType::F32, Shape{n});
  d.be->fill(dy, 1.0f);
  for (Activation a : all_activations()) {
    d.be->activation_forward(a, x, y);
    const Tensor& saved = a.backward_reads() == ActSaved::Input ? x : y;
    d.be->activation_backward(a, saved, dy, dx);
    const std::vector<float> yv = d.get(y), gv = d.get(dx);
    for (size_t i = 0; i + 1 < xv.size(); ++i) {
      const double v = xv[i], want = tail_value(a, v), gw = tail_grad(a, v);
      INFO(act_str(a) << " at x = " << v << ": y " << yv[i] << " (want " << want << "), dy/dx " << gv[i]
                      << " (want " << gw << ")");
      CHECK(std::isfinite(yv[i]));
      CHECK(std::isfinite(gv[i]));
      // Relative 5e-5: far in the tails the float32 argument (x/sqrt2, 2u, x^2/2) is rounded and
      // e^-t moves by t times that; absolute 1e-37: what float32 cannot hold is 0.
      CHECK(std::fabs(yv[i] - want) <= 5e-5 * std::fabs(want) + 1e-37);
      if (std::fabs(v) < 1e15) CHECK(std::fabs(gv[i] - gw) <= 5e-5 * std::fabs(gw) + 1e-37);
    }
    // NaN stays NaN forward (check_numerics must see it); so does the backward of the
    // activations that read their input.
    INFO(act_str(a));
    CHECK(std::isnan(yv.back()));
    if (a.backward_reads() == ActSaved::Input) CHECK(std::isnan(gv.back()));
  }
  // leaky_relu at +-0 keeps the zero's sign.
  d.be->activation_forward(Activation{ActKind::LeakyRelu, 0.2f}, x, y);
  const std::vector<float> lv = d.get(y);
  CHECK(std::signbit(lv[6]));   // leaky_relu(-0) = -0
  CHECK(!std::signbit(lv[7]));  // leaky_relu(+0) = +0
  CHECK(lv[0] == -16.0f);       // 0.2 * -80
}

TEST_CASE("activations: leaky_relu's slope and its backward from the output", "[backend][cpu][activation]") {
  Dev d;
  Tensor x = d.make(DType::F16, Shape{6}), y = d.make(DType::F16, Shape{6}), dy = d.make(DType::F16, Shape{6}),
         dx = d.make(DType::F16, Shape{6});
  // 1e-7 is below float16's smallest subnormal once scaled by 0.2: y rounds to -0, still
  // "not > 0", so the backward from y gives the slope as it should.
  d.put(x, {-2.0f, -round_to(DType::F16, 1e-7f), 0.0f, 3.0f, -0.5f, 65504.0f});
  d.put(dy, {1.0f, 1.0f, 1.0f, 1.0f, -2.0f, 1.0f});
  const Activation a{ActKind::LeakyRelu, 0.25f};
  d.be->activation_forward(a, x, y);
  check_exact("leaky forward", d.get(y), {-0.5f, -0.0f, 0.0f, 3.0f, -0.125f, 65504.0f});
  d.be->activation_backward(a, y, dy, dx);
  check_exact("leaky backward", d.get(dx), {0.25f, 0.25f, 0.25f, 1.0f, -0.5f, 1.0f});
}

// ---- fused into conv2d / dense ----------------------------------------------------------------

TEST_CASE("activations fused in conv2d_forward: reference, pre-activation, and the unfused path",
          "[backend][cpu][activation][conv]") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  Conv2dParams p;
  p.R = p.S = 3;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = 1;
  const int64_t N = 2, H = 6, W = 5, C = 16, K = 16;  // C, K >= 16: oneDNN's blocked path
  for (Activation a : all_activations()) {
    DYNAMIC_SECTION(act_str(a) << " " << dtype_name(t)) {
      Dev d;
      Rng rng(21);
      std::vector<float> xv, wv, bv;
      Tensor x = d.rand(rng, t, Shape{N, H, W, C}, &xv);
      Tensor w = d.rand(rng, t, Shape{K, 3, 3, C}, &wv, -0.3, 0.3);
      Tensor b = d.rand(rng, DType::F32, Shape{K}, &bv);
      const Shape ys{N, H, W, K};
      Tensor y = d.make(t, ys), pre = d.make(t, ys), z = d.make(t, ys), y2 = d.make(t, ys), y3 = d.make(t, ys);
      const Vec bw = widen(bv);
      const auto dims = ref::conv_dims(p, N, H, W, C, K);
      d.be->conv2d_forward(p, x, w, b, y, a, pre);
      check_close("fused forward", d.get(y), ref::conv2d_forward(p, dims, widen(xv), widen(wv), &bw, a), t, 2.0);
      check_close("pre-activation", d.get(pre),
                  ref::conv2d_forward(p, dims, widen(xv), widen(wv), &bw, Activation::None), t, 2.0);
      // The pre-activation is the unfused convolution's output, bit for bit.
      d.be->conv2d_forward(p, x, w, b, z, Activation::None);
      check_exact("pre == conv without activation", d.get(pre), d.get(z));
      // Without pre (the post-op path for leaky_relu and relu): the same bits as with pre.
      d.be->conv2d_forward(p, x, w, b, y2, a);
      check_exact("fused without pre", d.get(y2), d.get(y));
      // Unfused: activation_forward on the stored pre-activation. In float32 that is the same
      // value; in 16 bits it rounds twice (z, then act(z)): the difference is the rounding of z
      // carried through act' (|act'| <= 1.13) plus one rounding of y.
      d.be->activation_forward(a, z, y3);
      if (t == DType::F32) {
        check_exact("fused == unfused (float32)", d.get(y), d.get(y3));
      } else {
        const std::vector<float> f = d.get(y), u = d.get(y3), zv = d.get(z);
        const int bits = t == DType::F16 ? -10 : -7;  // one unit in the last place, relative
        for (size_t i = 0; i < f.size(); ++i)
          if (f[i] != u[i]) {
            INFO("z " << zv[i] << " fused " << f[i] << " unfused " << u[i]);
            REQUIRE(std::fabs(f[i] - u[i]) <=
                    0.6 * std::ldexp(std::fabs(zv[i]), bits) + std::ldexp(std::fabs(f[i]), bits) + 1e-7);
          }
      }
    }
  }
}

TEST_CASE("activations fused in dense_forward: reference, pre-activation, partial batches",
          "[backend][cpu][activation][dense]") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  for (Activation a : all_activations()) {
    DYNAMIC_SECTION(act_str(a) << " " << dtype_name(t)) {
      Dev d;
      Rng rng(22);
      const int64_t N = 130, Ci = 37, Co = 24;  // more than one chunk of rows, a partial one
      std::vector<float> xv, wv, bv;
      Tensor x = d.rand(rng, t, Shape{N, Ci}, &xv);
      Tensor w = d.rand(rng, t, Shape{Co, Ci}, &wv, -0.5, 0.5);
      Tensor b = d.rand(rng, t, Shape{Co}, &bv);
      Tensor y = d.make(t, Shape{N, Co}), pre = d.make(t, Shape{N, Co}), z = d.make(t, Shape{N, Co}),
             y2 = d.make(t, Shape{N, Co}), y3 = d.make(t, Shape{N, Co});
      const Vec bw = widen(bv);
      d.be->dense_forward(x, w, b, y, a, pre);
      check_close("fused forward", d.get(y), ref::dense_forward(N, Ci, Co, widen(xv), widen(wv), &bw, a), t);
      d.be->dense_forward(x, w, b, z, Activation::None);
      check_exact("pre == dense without activation", d.get(pre), d.get(z));
      d.be->dense_forward(x, w, b, y2, a);  // leaky_relu: the oneDNN post-op
      check_exact("fused without pre", d.get(y2), d.get(y));
      d.be->activation_forward(a, z, y3);
      if (t == DType::F32) check_exact("fused == unfused (float32)", d.get(y), d.get(y3));
      // A partial batch is a row slice and gives the same rows.
      Tensor yp = d.make(t, Shape{5, Co});
      d.be->dense_forward(x.slice_rows(0, 5), w, b, yp, a);
      const std::vector<float> full = d.get(y), part = d.get(yp);
      check_exact("row slice", part, std::vector<float>(full.begin(), full.begin() + 5 * Co));
    }
  }
}

TEST_CASE("activations fused in dense keep NaN (a NaN input row gives a NaN output row)",
          "[backend][cpu][activation][dense]") {
  for (Activation a : all_activations()) {
    INFO(act_str(a));
    Dev d;
    Tensor x = d.make(DType::F32, Shape{3, 4}), w = d.make(DType::F32, Shape{2, 4});
    d.put(x, {1, 1, 1, 1, kNaN, 1, 1, 1, -1, -1, -1, -1});
    d.put(w, {1, 1, 1, 1, -1, -1, -1, -1});
    Tensor y = d.make(DType::F32, Shape{3, 2});
    d.be->dense_forward(x, w, Tensor(), y, a);
    const std::vector<float> v = d.get(y);
    CHECK(std::isnan(v[2]));
    CHECK(std::isnan(v[3]));
    CHECK(v[0] == activation_value(a, 4.0f));
    CHECK(v[5] == activation_value(a, 4.0f));
  }
}

// ---- argument checks -------------------------------------------------------------------------

TEST_CASE("activations: argument checks", "[backend][cpu][activation]") {
  Dev d;
  Tensor x = d.make(DType::F32, Shape{2, 3}), w = d.make(DType::F32, Shape{4, 3}), y = d.make(DType::F32, Shape{2, 4});
  d.be->fill(x, 1.0f);
  d.be->fill(w, 1.0f);
  REQUIRE_THROWS_WITH(d.be->activation_forward(Activation{ActKind::LeakyRelu, -0.1f}, x, x),
                      Catch::Contains("negative slope >= 0"));
  REQUIRE_THROWS_WITH(d.be->dense_forward(x, w, Tensor(), y, Activation{ActKind::LeakyRelu, NAN}),
                      Catch::Contains("negative slope"));
  REQUIRE_THROWS_WITH(d.be->dense_forward(x, w, Tensor(), y, Activation{ActKind::Gelu}, y),
                      Catch::Contains("pre must not alias y"));
  Tensor small = d.make(DType::F32, Shape{2, 3});
  REQUIRE_THROWS_AS(d.be->dense_forward(x, w, Tensor(), y, Activation{ActKind::Gelu}, small), Error);
  Tensor half = d.make(DType::F16, Shape{2, 4});
  REQUIRE_THROWS_AS(d.be->dense_forward(x, w, Tensor(), y, Activation{ActKind::Gelu}, half), Error);
  Tensor dy = d.make(DType::F16, Shape{2, 3});
  REQUIRE_THROWS_AS(d.be->activation_backward(Activation{ActKind::Silu}, x, dy, x), Error);
}

// ---- timing (hidden: run with `test_backend_activations [.bench]`) ------------------------------

namespace {
template <typename F>
double ms_per_call(F&& f, int reps) {
  f();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}
}  // namespace

TEST_CASE("activations: timing on the smoke net's conv output [128,26,26,32]", "[.bench]") {
  Dev d;
  Rng rng(9);
  for (DType t : {DType::F32, DType::BF16}) {
    const Shape s{128, 26, 26, 32};
    Tensor x = d.rand(rng, t, s, nullptr, -3, 3), y = d.make(t, s), dx = d.make(t, s);
    Tensor dy = d.rand(rng, t, s, nullptr);
    for (Activation a : all_activations()) {
      const Tensor& saved = a.backward_reads() == ActSaved::Input ? x : y;
      const double f = ms_per_call([&] { d.be->activation_forward(a, x, y); }, 10);
      const double b = ms_per_call([&] { d.be->activation_backward(a, saved, dy, dx); }, 10);
      std::printf("%-8s %-16s forward %7.2f ms  backward %7.2f ms\n", dtype_name(t), act_str(a).c_str(), f, b);
    }
    // The first conv of the smoke net: relu fused as a oneDNN post-op, against the same
    // convolution followed by a separate NaN-keeping relu pass, and with a stored pre-activation.
    Conv2dParams p;
    p.R = p.S = 3;
    Tensor xi = d.rand(rng, t, Shape{128, 28, 28, 1}, nullptr), w = d.rand(rng, t, Shape{32, 3, 3, 1}, nullptr);
    Tensor b = d.rand(rng, DType::F32, Shape{32}, nullptr), pre = d.make(t, s);
    const double fused = ms_per_call([&] { d.be->conv2d_forward(p, xi, w, b, y, Activation::Relu); }, 20);
    const double plain = ms_per_call([&] { d.be->conv2d_forward(p, xi, w, b, y, Activation::None); }, 20);
    const double pass = ms_per_call(
        [&] {
          d.be->conv2d_forward(p, xi, w, b, y, Activation::None);
          d.be->activation_forward(Activation::Relu, y, y);
        },
        20);
    const double with_pre =
        ms_per_call([&] { d.be->conv2d_forward(p, xi, w, b, y, Activation{ActKind::Gelu}, pre); }, 20);
    std::printf("%-8s smoke conv fwd: relu post-op %.2f ms, no activation %.2f ms, + separate relu pass %.2f ms, "
                "gelu with pre-activation %.2f ms\n",
                dtype_name(t), fused, plain, pass, with_pre);
  }
}
