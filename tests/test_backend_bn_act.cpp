// SPDX-License-Identifier: MIT
// Batch norm with the activation after it fused into its ops (the CPU backend's row loops,
// lib/backend/cpu/norm/bn_rows.h; docs/cpu-performance.md, "Batch norm and the activation
// after it"): in 16-bit the bits of the two ops run one after the other (batch norm, then
// activation_forward / activation_backward on the rounded normalized values), in float32
// within float32's bound of the float64 reference; forward training, inference and backward,
// rows within one piece of the loops (1,024 elements) and a row longer than one, every
// activation kind a layer can fuse and relu's kinds, whose backward reads the output.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/activation.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/bn_layer.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;
using support::check_close;
using support::check_exact;
using support::widen;

namespace {

using Dev = support::CpuDev;

/// The activation in float64 and its derivative (the erf form of GELU through std::erfc).
double act64(ActKind k, double x, double alpha) {
  switch (k) {
    case ActKind::Gelu: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case ActKind::GeluTanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case ActKind::Silu: return x / (1 + std::exp(-x));
    case ActKind::Relu: return x > 0 ? x : 0;
    case ActKind::LeakyRelu: return x > 0 ? x : alpha * x;
    default: return x;
  }
}
double act64_grad(ActKind k, double x, double alpha) {
  switch (k) {
    case ActKind::Gelu: return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    case ActKind::GeluTanh: {
      const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x), t = std::tanh(u);
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
    }
    case ActKind::Silu: {
      const double s = 1 / (1 + std::exp(-x));
      return s + x * s * (1 - s);
    }
    case ActKind::Relu: return x > 0 ? 1 : 0;
    case ActKind::LeakyRelu: return x > 0 ? 1 : alpha;
    default: return 1;
  }
}

using Bn = support::BnLayer;

/// One layer's tensors; the same seed gives the same values.
Bn make_bn(Dev& d, uint64_t seed, DType t, Shape s) {
  Rng rng(seed);
  return support::make_layer(d, rng, t, s, -2.0, 3.0, 0.5);
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (int i = 0; i < s.rank; ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

TEST_CASE("batch norm with a fused activation: the bits of batch norm then the activation in 16-bit, the float64 "
          "reference in float32",
          "[backend][cpu][bn][fuse]") {
  const DType t = GENERATE(DType::BF16, DType::F16, DType::F32);
  const Activation act = GENERATE(Activation(ActKind::Gelu), Activation(ActKind::GeluTanh), Activation(ActKind::Silu),
                                  Activation(ActKind::Relu), Activation(ActKind::LeakyRelu, 0.2f));
  const Shape s = GENERATE(Shape{4, 6, 6, 24}, Shape{2, 3, 3, 300}, Shape{50, 10}, Shape{7, 1500});
  INFO(dtype_name(t) << " " << activation_name(act.kind) << " " << shape_str(s));
  Dev d;
  Bn f = make_bn(d, 5, t, s), u = make_bn(d, 5, t, s);  // fused, unfused: the same values
  const float momentum = 0.6f, eps = 1e-3f;

  // Forward training: fused, and batch norm into z then the activation.
  d.be->batch_norm_forward_training(f.x, f.gamma, f.beta, momentum, eps, f.rm, f.rv, f.sm, f.si, f.y, act);
  const Tensor z = d.make(t, s);
  d.be->batch_norm_forward_training(u.x, u.gamma, u.beta, momentum, eps, u.rm, u.rv, u.sm, u.si, z);
  d.be->activation_forward(act, z, u.y);
  // Inference from the updated moving statistics.
  const Tensor yi_f = d.make(t, s), zi = d.make(t, s), yi_u = d.make(t, s);
  d.be->batch_norm_forward_inference(f.x, f.gamma, f.beta, f.rm, f.rv, eps, yi_f, act);
  d.be->batch_norm_forward_inference(u.x, u.gamma, u.beta, u.rm, u.rv, eps, zi);
  d.be->activation_forward(act, zi, yi_u);

  // Backward: fused, and the activation's backward into g then batch norm's.
  d.be->batch_norm_backward(f.x, f.dy, f.gamma, f.sm, f.si, f.dx, f.dg, f.db, f.beta, act);
  const Tensor g = d.make(t, s);
  d.be->activation_backward(act, act.backward_reads() == ActSaved::Input ? z : u.y, u.dy, g);
  d.be->batch_norm_backward(u.x, g, u.gamma, u.sm, u.si, u.dx, u.dg, u.db);

  if (is_16bit(t)) {  // both on the row loops: the same bits
    check_exact("saved mean", d.get(f.sm), d.get(u.sm));
    check_exact("saved invstd", d.get(f.si), d.get(u.si));
    check_exact("running mean", d.get(f.rm), d.get(u.rm));
    check_exact("running var", d.get(f.rv), d.get(u.rv));
    check_exact("y", d.get(f.y), d.get(u.y));
    check_exact("inference y", d.get(yi_f), d.get(yi_u));
    check_exact("dx", d.get(f.dx), d.get(u.dx));
    check_exact("dgamma", d.get(f.dg), d.get(u.dg));
    check_exact("dbeta", d.get(f.db), d.get(u.db));
    return;
  }
  // float32: the unfused batch norm is oneDNN's; both against float64.
  const ref::BnForward r = ref::batch_norm_forward_training(f.M, f.C, widen(f.xv), widen(f.gv), widen(f.bv), eps);
  check_close("saved mean", d.get(f.sm), r.mean, t);
  check_close("saved invstd", d.get(f.si), r.invstd, t);
  Vec y64(r.y.size()), g64(r.y.size());
  for (size_t i = 0; i < r.y.size(); ++i) {
    y64[i] = act64(act.kind, r.y[i], act.alpha);
    g64[i] = act64_grad(act.kind, r.y[i], act.alpha) * f.dyv[i];
  }
  check_close("fused y", d.get(f.y), y64, t, 2.0);
  check_close("unfused y", d.get(u.y), y64, t, 2.0);
  const ref::BnBackward rb =
      ref::batch_norm_backward(f.M, f.C, widen(f.xv), g64, widen(f.gv), widen(d.get(f.sm)), widen(d.get(f.si)));
  check_close("fused dx", d.get(f.dx), rb.dx, t, 10.0);
  check_close("fused dgamma", d.get(f.dg), rb.dgamma, DType::F32, 10.0);
  check_close("fused dbeta", d.get(f.db), rb.dbeta, DType::F32, 10.0);
  const std::vector<float> rm = d.get(f.rm), rv = d.get(f.rv);
  const Vec zi64 = ref::batch_norm_forward_inference(f.M, f.C, widen(f.xv), widen(f.gv), widen(f.bv), widen(rm),
                                                     widen(rv), eps);
  Vec yi64(zi64.size());
  for (size_t i = 0; i < zi64.size(); ++i) yi64[i] = act64(act.kind, zi64[i], act.alpha);
  check_close("fused inference y", d.get(yi_f), yi64, t, 2.0);
}

TEST_CASE("batch norm with a fused activation: 16-bit batch norm without one against the float64 reference, and "
          "a NaN input stays NaN",
          "[backend][cpu][bn][fuse]") {
  const DType t = GENERATE(DType::BF16, DType::F16);
  Dev d;
  Bn l = make_bn(d, 9, t, Shape{3, 5, 7, 270});
  d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, 0.9f, 1e-3f, l.rm, l.rv, l.sm, l.si, l.y,
                                    Activation(ActKind::Gelu));
  const ref::BnForward r = ref::batch_norm_forward_training(l.M, l.C, widen(l.xv), widen(l.gv), widen(l.bv), 1e-3);
  Vec y64(r.y.size());
  for (size_t i = 0; i < r.y.size(); ++i) y64[i] = act64(ActKind::Gelu, r.y[i], 0);
  check_close("gelu(bn(x))", d.get(l.y), y64, t, 4.0);  // two roundings to t: z, then gelu(z)

  // One NaN in channel 0: its statistics and every output of that channel are NaN, and the
  // other channels are untouched.
  std::vector<float> xv = l.xv;
  xv[0] = support::kNaN;
  d.put(l.x, xv);
  d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, 0.9f, 1e-3f, l.rm, l.rv, l.sm, l.si, l.y,
                                    Activation(ActKind::Gelu));
  const std::vector<float> y = d.get(l.y), sm = d.get(l.sm);
  CHECK(std::isnan(sm[0]));
  CHECK(std::isfinite(sm[1]));
  for (int64_t m = 0; m < l.M; ++m) {
    CHECK(std::isnan(y[static_cast<size_t>(m * l.C)]));
    CHECK(std::isfinite(y[static_cast<size_t>(m * l.C + 1)]));
  }
}
