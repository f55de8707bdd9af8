// SPDX-License-Identifier: MIT
// Batch normalization on the CPU backend (oneDNN batch_normalization primitives, or
// the plain loops under MPX_CPU_REFERENCE=1) against the float64 reference of
// tests/support/reference.h, on the shapes tests/test_backend.cpp does not cover:
// [N, C] inputs, C not a multiple of 8 and C a multiple of 8 (oneDNN's JIT paths),
// many rows, a large common offset, epsilon much larger than the variance, a
// constant channel, momentum 0 / 1, several layers of one shape interleaved, one
// shape with two epsilons, and that repeated calls allocate nothing more.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/bn_layer.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;

namespace {

using support::check_close;
using support::check_exact;
using support::dtype_eps;
using support::kInf;
using support::kNaN;
using support::widen;
using Dev = support::CpuDev;
using support::BnLayer;
using support::make_layer;

/// y_loosen: where x - mean itself is only known to a few float32 ulps of |x| (a large
/// common offset), y is too; the statistics are still checked tightly.
void check_forward_training(Dev& d, const BnLayer& l, float momentum, float eps, double y_loosen = 1.0) {
  const ref::BnForward r = ref::batch_norm_forward_training(l.M, l.C, widen(l.xv), widen(l.gv), widen(l.bv), eps);
  check_close("bn y", d.get(l.y), r.y, l.t, (l.t == DType::F32 ? 1.0 : 2.0) * y_loosen);
  check_close("bn saved mean", d.get(l.sm), r.mean, DType::F32);
  check_close("bn saved invstd", d.get(l.si), r.invstd, DType::F32);
  // tf-keras 2: the moving variance takes the unbiased batch variance on [N,H,W,C] input (its
  // fused batch norm), the biased one on [N,C].
  const Vec& batch_var = l.s.rank == 4 ? r.var_unbiased : r.var;
  Vec want_rm(static_cast<size_t>(l.C)), want_rv(static_cast<size_t>(l.C));
  for (size_t c = 0; c < static_cast<size_t>(l.C); ++c) {
    want_rm[c] = momentum * l.rmv[c] + (1 - momentum) * r.mean[c];
    want_rv[c] = momentum * l.rvv[c] + (1 - momentum) * batch_var[c];
  }
  check_close("bn running mean", d.get(l.rm), want_rm, DType::F32);
  check_close("bn running var", d.get(l.rv), want_rv, DType::F32);
}

void check_backward(Dev& d, const BnLayer& l, double loosen = 1.0) {
  const ref::BnBackward rb = ref::batch_norm_backward(l.M, l.C, widen(l.xv), widen(l.dyv), widen(l.gv),
                                                      widen(d.get(l.sm)), widen(d.get(l.si)));
  check_close("bn dgamma", d.get(l.dg), rb.dgamma, DType::F32, 10.0 * loosen);
  check_close("bn dbeta", d.get(l.db), rb.dbeta, DType::F32);
  check_close("bn dx", d.get(l.dx), rb.dx, l.t, (l.t == DType::F32 ? 10.0 : 2.0) * loosen);
}

void run_all(Dev& d, BnLayer& l, float momentum, float eps) {
  d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, momentum, eps, l.rm, l.rv, l.sm, l.si, l.y);
  check_forward_training(d, l, momentum, eps);

  Tensor yi = d.make(l.t, l.s);
  const std::vector<float> rm_now = d.get(l.rm), rv_now = d.get(l.rv);
  d.be->batch_norm_forward_inference(l.x, l.gamma, l.beta, l.rm, l.rv, eps, yi);
  check_close("bn inference", d.get(yi),
              ref::batch_norm_forward_inference(l.M, l.C, widen(l.xv), widen(l.gv), widen(l.bv), widen(rm_now),
                                                widen(rv_now), eps),
              l.t, l.t == DType::F32 ? 1.0 : 2.0);

  d.be->batch_norm_backward(l.x, l.dy, l.gamma, l.sm, l.si, l.dx, l.dg, l.db);
  check_backward(d, l);
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (int i = 0; i < s.rank; ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

TEST_CASE("backend batch norm: [N,C] and NHWC shapes, C not a multiple of 8 and multiples of 8, many rows",
          "[backend][cpu][bn]") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  auto s = GENERATE(Shape{5, 3}, Shape{200, 10}, Shape{64, 256}, Shape{2, 3, 5, 13}, Shape{4, 8, 8, 16},
                    Shape{2, 4, 4, 64}, Shape{3, 7, 5, 24}, Shape{64, 16, 16, 8}, Shape{16384, 12});
  INFO("shape " << shape_str(s) << " " << dtype_name(t));
  Dev d;
  Rng rng(77);
  BnLayer l = make_layer(d, rng, t, s, 1.0, 4.0);  // offset mean: tests the centered computation
  run_all(d, l, 0.99f, 1e-3f);
}

TEST_CASE("backend batch norm: a common offset 1000x the spread", "[backend][cpu][bn]") {
  // float32 x near 1000 with a spread of 1: E[x^2] - E[x]^2 would lose ~6 digits.
  auto s = GENERATE(Shape{8, 6, 6, 16}, Shape{300, 5});
  INFO("shape " << shape_str(s));
  Dev d;
  Rng rng(78);
  BnLayer l = make_layer(d, rng, DType::F32, s, -1.0, 1.0, 1000.0);
  d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, 0.9f, 1e-3f, l.rm, l.rv, l.sm, l.si, l.y);
  // Mean, invstd and the running variance within 1e-5. x - mean, hence y and dx, only to a
  // few ulps of 1000 (6e-5) times gamma * invstd (<= 2.6): 20x the float32 tolerance (the
  // float64-summing loops of MPX_CPU_REFERENCE=1 are 4.6e-5 off here too).
  check_forward_training(d, l, 0.9f, 1e-3f, 20.0);
  d.be->batch_norm_backward(l.x, l.dy, l.gamma, l.sm, l.si, l.dx, l.dg, l.db);
  check_backward(d, l, 20.0);
}

TEST_CASE("backend batch norm: epsilon much larger than the variance, and a constant channel",
          "[backend][cpu][bn]") {
  auto t = GENERATE(DType::F32, DType::BF16);
  auto s = GENERATE(Shape{4, 5, 5, 9}, Shape{100, 16});
  INFO("shape " << shape_str(s) << " " << dtype_name(t));
  Dev d;
  Rng rng(79);
  // Spread 1e-4 around 0.5 (variance ~1e-9, or exactly 0 after 16-bit rounding) vs epsilon 1e-3:
  // the backward pass sees invstd = 1/sqrt(var + eps) ~ 31.6 and must not depend on var alone.
  BnLayer l = make_layer(d, rng, t, s, -1e-4, 1e-4, 0.5);
  // Channel 0 exactly constant: var = 0, y = beta, dx = gamma/sqrt(eps) * (dy - mean dy).
  for (int64_t m = 0; m < l.M; ++m) l.xv[static_cast<size_t>(m * l.C)] = 0.25f;
  d.put(l.x, l.xv);
  run_all(d, l, 0.99f, 1e-3f);
  const std::vector<float> y = d.get(l.y);
  for (int64_t m = 0; m < l.M; ++m) REQUIRE(y[static_cast<size_t>(m * l.C)] == round_to(t, l.bv[0]));
}

TEST_CASE("backend batch norm: small epsilon, unit variance (variance recovered from invstd)",
          "[backend][cpu][bn]") {
  auto eps = GENERATE(1e-5f, 1e-7f);
  Dev d;
  Rng rng(80);
  BnLayer l = make_layer(d, rng, DType::F32, Shape{6, 9, 9, 20}, -2.0, 2.0);
  run_all(d, l, 0.99f, eps);
}

TEST_CASE("backend batch norm: momentum 1 keeps the running statistics, 0 replaces them", "[backend][cpu][bn]") {
  // 48 rows per channel either way: the unbiased variance is 48/47 (2 %) above the biased one.
  // C = 10 takes the plain loops on AVX2 (no oneDNN JIT kernel), C = 16 oneDNN's primitive.
  auto s = GENERATE(Shape{3, 4, 4, 10}, Shape{48, 10}, Shape{3, 4, 4, 16}, Shape{48, 16});
  INFO("shape " << shape_str(s));
  Dev d;
  Rng rng(81);
  BnLayer l = make_layer(d, rng, DType::F32, s, 1.0, 3.0);
  d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, 1.0f, 1e-3f, l.rm, l.rv, l.sm, l.si, l.y);
  REQUIRE(d.get(l.rm) == l.rmv);
  REQUIRE(d.get(l.rv) == l.rvv);
  d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, 0.0f, 1e-3f, l.rm, l.rv, l.sm, l.si, l.y);
  const ref::BnForward r = ref::batch_norm_forward_training(l.M, l.C, widen(l.xv), widen(l.gv), widen(l.bv), 1e-3);
  check_close("running mean = batch mean", d.get(l.rm), r.mean, DType::F32);
  if (s.rank == 4)
    check_close("running var = unbiased batch variance (4-D, tf-keras 2)", d.get(l.rv), r.var_unbiased, DType::F32);
  else
    check_close("running var = biased batch variance (2-D, tf-keras 2)", d.get(l.rv), r.var, DType::F32);
}

TEST_CASE("backend batch norm: layers of one shape interleaved, one shape with two epsilons", "[backend][cpu][bn]") {
  Dev d;
  Rng rng(82);
  const Shape s{4, 6, 6, 16};
  // Two layers of the same shape with very different statistics: forward A, forward B,
  // backward A, backward B (the order of a net's step): each backward uses its own statistics.
  BnLayer a = make_layer(d, rng, DType::F32, s, -0.1, 0.1, 3.0);
  BnLayer b = make_layer(d, rng, DType::F32, s, -10.0, 10.0);
  d.be->batch_norm_forward_training(a.x, a.gamma, a.beta, 0.9f, 1e-3f, a.rm, a.rv, a.sm, a.si, a.y);
  d.be->batch_norm_forward_training(b.x, b.gamma, b.beta, 0.9f, 1e-5f, b.rm, b.rv, b.sm, b.si, b.y);
  check_forward_training(d, a, 0.9f, 1e-3f);
  check_forward_training(d, b, 0.9f, 1e-5f);
  d.be->batch_norm_backward(a.x, a.dy, a.gamma, a.sm, a.si, a.dx, a.dg, a.db);
  d.be->batch_norm_backward(b.x, b.dy, b.gamma, b.sm, b.si, b.dx, b.dg, b.db);
  check_backward(d, a);
  check_backward(d, b);
  // Inference with two epsilons on one shape.
  for (float eps : {1e-3f, 1.0f}) {
    Tensor yi = d.make(DType::F32, s);
    d.be->batch_norm_forward_inference(a.x, a.gamma, a.beta, a.rm, a.rv, eps, yi);
    check_close("bn inference eps " + std::to_string(eps), d.get(yi),
                ref::batch_norm_forward_inference(a.M, a.C, widen(a.xv), widen(a.gv), widen(a.bv), widen(d.get(a.rm)),
                                                  widen(d.get(a.rv)), eps),
                DType::F32);
  }
}

TEST_CASE("backend batch norm: repeated steps allocate nothing more", "[backend][cpu][bn]") {
  auto t = GENERATE(DType::F32, DType::F16);
  Dev d;
  Rng rng(83);
  BnLayer l = make_layer(d, rng, t, Shape{8, 8, 8, 24}, -1.0, 1.0);
  BnLayer l2 = make_layer(d, rng, t, Shape{40, 24}, -1.0, 1.0);
  Tensor yi = d.make(t, l.s), yi2 = d.make(t, l2.s);
  auto step = [&] {
    for (BnLayer* p : {&l, &l2}) {
      d.be->batch_norm_forward_training(p->x, p->gamma, p->beta, 0.99f, 1e-3f, p->rm, p->rv, p->sm, p->si, p->y);
      d.be->batch_norm_backward(p->x, p->dy, p->gamma, p->sm, p->si, p->dx, p->dg, p->db);
    }
    d.be->batch_norm_forward_inference(l.x, l.gamma, l.beta, l.rm, l.rv, 1e-3f, yi);
    d.be->batch_norm_forward_inference(l2.x, l2.gamma, l2.beta, l2.rm, l2.rv, 1e-3f, yi2);
  };
  step();
  const size_t after_first = d.be->memory_stats().current_bytes;
  for (int i = 0; i < 3; ++i) step();
  REQUIRE(d.be->memory_stats().current_bytes == after_first);
  check_backward(d, l);
  check_backward(d, l2);
}
