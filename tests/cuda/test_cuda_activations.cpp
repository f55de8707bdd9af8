// SPDX-License-Identifier: MIT
// The activations on the CUDA backend against the CPU backend, float32/float16/bfloat16:
// activation_forward/backward (relu and leaky_relu bit for bit: one comparison and one
// product; gelu, gelu_tanh, silu within the per-dtype tolerance: the same formulas,
// core/activation.h, but nvcc contracts them into FMAs), each activation fused in
// conv2d_forward (the bias+activation kernel)
// and dense_forward (cuBLASLt epilogues: GELU[_AUX][_BIAS] for gelu_tanh; the kernel
// for the rest, relu included), with and without the pre-activation output, every bias kind;
// NaN through every activation fused in dense and conv; and a small model's logits and
// gradients with each activation.
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/activation.h"
#include "cuda/cuda_compare.h"
#include "nn/model.h"

using namespace cudatest;

namespace {

/// Every kind of core/activation.h's table but the identity (leaky_relu with two slopes).
std::vector<Activation> activations() {
  std::vector<Activation> v;
  for (const ActivationEntry& n : kActivationNames) {
    if (n.kind == ActKind::None) continue;
    bool seen = false;
    for (Activation a : v) seen = seen || a.kind == n.kind;
    if (seen) continue;
    v.push_back(Activation{n.kind, n.kind == ActKind::LeakyRelu ? kLeakyReluDefaultSlope : 0.0f});
    if (n.kind == ActKind::LeakyRelu) v.push_back(Activation{n.kind, 0.01f});
  }
  return v;
}

std::string act_name(Activation a) {
  std::string s = activation_name(a.kind);
  if (a.kind == ActKind::LeakyRelu) s += "(" + std::to_string(a.alpha) + ")";
  return s;
}

bool exact_on_both(Activation a) { return a.kind == ActKind::Relu || a.kind == ActKind::LeakyRelu; }

/// cuBLASLt's fused GELU epilogue (gelu_tanh in dense) is cuBLASLt's own tanh approximation
/// evaluation, not ours: float32 gets a looser whole-tensor tolerance there.
double fused_tolerance(DType t, Activation a, bool conv) {
  if (a.kind == ActKind::GeluTanh && t == DType::F32 && !conv) return 1e-3;
  return tolerance(t, conv);
}

}  // namespace

TEST_CASE("cuda: activation forward/backward of every kind", "[cuda][elementwise][activation]") {
  Rng rng(31);
  for (DType t : float_dtypes())
    for (Activation a : activations()) {
      const std::string what = act_name(a);
      const Shape s{3, 7, 5, 33};
      Dual x = random_dual(rng, t, s, -6.0f, 6.0f);
      Dual y = poisoned(t, s);
      be().cpu->activation_forward(a, x.c, y.c);
      be().gpu->activation_forward(a, x.g, y.g);
      Dual dy = random_dual(rng, t, s);
      Dual dx = poisoned(t, s);
      const Dual& saved = a.backward_reads() == ActSaved::Input ? x : y;
      be().cpu->activation_backward(a, saved.c, dy.c, dx.c);
      be().gpu->activation_backward(a, saved.g, dy.g, dx.g);
      if (exact_on_both(a)) {
        expect_bits(y, what + " forward");
        expect_bits(dx, what + " backward");
      } else {
        expect_close(y, tolerance(t), what + " forward");
        expect_close(dx, tolerance(t), what + " backward");
      }
      // In place.
      be().cpu->activation_backward(a, saved.c, dy.c, dy.c);
      be().gpu->activation_backward(a, saved.g, dy.g, dy.g);
      expect_close(dy, tolerance(t), what + " backward in place");
    }
}

TEST_CASE("cuda: activations fused in conv2d_forward, with and without the pre-activation",
          "[cuda][conv][activation]") {
  Rng rng(32);
  Conv2dParams p;
  p.R = p.S = 3;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = 1;
  const int64_t N = 3, H = 9, W = 8, C = 8, K = 16;
  for (DType t : float_dtypes()) {
    if (!be().gpu->supports(Op::Conv2d, t)) continue;
    Dual x = random_dual(rng, t, Shape{N, H, W, C});
    Dual w = random_dual(rng, t, Shape{K, 3, 3, C}, -0.5f, 0.5f);
    Dual b = random_dual(rng, DType::F32, Shape{K});
    for (Activation a : activations())
      for (bool with_pre : {false, true}) {
        const std::string what = "conv " + act_name(a) + (with_pre ? " with pre" : "");
        Dual y = poisoned(t, Shape{N, H, W, K}), pre = poisoned(t, Shape{N, H, W, K});
        be().cpu->conv2d_forward(p, x.c, w.c, b.c, y.c, a, with_pre ? pre.c : Tensor());
        be().gpu->conv2d_forward(p, x.g, w.g, b.g, y.g, a, with_pre ? pre.g : Tensor());
        expect_close(y, fused_tolerance(t, a, true), what);
        if (with_pre) expect_close(pre, tolerance(t, true), what + ": pre-activation");
      }
  }
}

TEST_CASE("cuda: activations fused in dense_forward (cuBLASLt epilogues or the kernel after)",
          "[cuda][dense][activation]") {
  Rng rng(33);
  struct D {
    int N, Ci, Co;
  };
  // Co 16: the GELU_AUX epilogue's leading dimension (a multiple of 8); Co 17: the kernel.
  for (const D& dd : {D{32, 64, 16}, D{7, 33, 17}, D{128, 256, 128}})
    for (DType t : float_dtypes()) {
      if (!be().gpu->supports(Op::Dense, t)) continue;
      Dual x = random_dual(rng, t, Shape{dd.N, dd.Ci});
      Dual w = random_dual(rng, t, Shape{dd.Co, dd.Ci}, -0.3f, 0.3f);
      Dual b16 = random_dual(rng, t, Shape{dd.Co});
      Dual b32 = random_dual(rng, DType::F32, Shape{dd.Co});
      for (Activation a : activations())
        for (int bias_kind = 0; bias_kind < 3; ++bias_kind)
          for (bool with_pre : {false, true}) {
            const std::string what = "dense " + std::to_string(dd.N) + "x" + std::to_string(dd.Ci) + "->" +
                                     std::to_string(dd.Co) + " " + act_name(a) + " bias " +
                                     std::to_string(bias_kind) + (with_pre ? " with pre" : "");
            const Tensor bc = bias_kind == 0 ? Tensor() : bias_kind == 1 ? b16.c : b32.c;
            const Tensor bg = bias_kind == 0 ? Tensor() : bias_kind == 1 ? b16.g : b32.g;
            Dual y = poisoned(t, Shape{dd.N, dd.Co}), pre = poisoned(t, Shape{dd.N, dd.Co});
            be().cpu->dense_forward(x.c, w.c, bc, y.c, a, with_pre ? pre.c : Tensor());
            be().gpu->dense_forward(x.g, w.g, bg, y.g, a, with_pre ? pre.g : Tensor());
            expect_close(y, fused_tolerance(t, a, false), what);
            if (with_pre) expect_close(pre, tolerance(t), what + ": pre-activation");
          }
    }
}

TEST_CASE("cuda: NaN survives every activation fused in dense_forward and conv2d_forward (the NaN contract)",
          "[cuda][dense][conv][activation][nan]") {
  Rng rng(34);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType t : float_dtypes()) {
    if (!be().gpu->supports(Op::Dense, t)) continue;
    // Row 0 of x holds a NaN: every output of row 0 is NaN before the activation.
    std::vector<float> xv = random_floats(rng, 8 * 32);
    xv[5] = nan;
    Dual x = from_floats(t, Shape{8, 32}, xv);
    Dual w = random_dual(rng, t, Shape{16, 32}, -0.3f, 0.3f);
    Dual b = random_dual(rng, t, Shape{16});
    // Conv: one NaN pixel of image 0 reaches the outputs whose window covers it.
    std::vector<float> cv = random_floats(rng, 2 * 6 * 6 * 8);
    cv[(2 * 6 + 3) * 8 + 1] = nan;
    Dual cx = from_floats(t, Shape{2, 6, 6, 8}, cv);
    Dual cw = random_dual(rng, t, Shape{8, 3, 3, 8}, -0.3f, 0.3f);
    Conv2dParams p;
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    for (Activation a : activations())
      for (bool with_bias : {false, true}) {
        const std::string what = std::string(dtype_name(t)) + " " + act_name(a) + (with_bias ? " bias" : "");
        Dual y = poisoned(t, Shape{8, 16});
        be().cpu->dense_forward(x.c, w.c, with_bias ? b.c : Tensor(), y.c, a);
        be().gpu->dense_forward(x.g, w.g, with_bias ? b.g : Tensor(), y.g, a);
        const std::vector<float> g = floats(*be().gpu, y.g);
        for (int k = 0; k < 16; ++k) {
          INFO("dense " << what << ": row 0, unit " << k << " = " << g[static_cast<size_t>(k)]);
          CHECK(std::isnan(g[static_cast<size_t>(k)]));
        }
        expect_close(y, fused_tolerance(t, a, false), "dense " + what + " (rows without NaN)");
        Dual cy = poisoned(t, Shape{2, 6, 6, 8});
        be().cpu->conv2d_forward(p, cx.c, cw.c, with_bias ? b.c.slice_rows(0, 8) : Tensor(), cy.c, a);
        be().gpu->conv2d_forward(p, cx.g, cw.g, with_bias ? b.g.slice_rows(0, 8) : Tensor(), cy.g, a);
        const std::vector<float> cg = floats(*be().gpu, cy.g);
        INFO("conv " << what << ": the output at the NaN pixel = " << cg[(2 * 6 + 3) * 8]);
        CHECK(std::isnan(cg[(2 * 6 + 3) * 8]));
        // (no whole-tensor comparison: a Winograd or FFT algorithm may spread the NaN over its tile)
        CHECK(std::isnan(floats(*be().cpu, cy.c)[(2 * 6 + 3) * 8]));
      }
  }
}

TEST_CASE("cuda: a small model with each activation: logits and gradients match the CPU",
          "[cuda][nn][activation]") {
  for (const ActivationEntry& n : kActivationNames)
    for (Policy policy : {Policy::Float32, Policy::MixedBFloat16}) {
      const ActivationName act = *parse_enum<ActivationName>(n.name);
      INFO(n.name << " " << policy_name(policy));
      auto layer = [&](LayerType type) {
        LayerConfig l;
        l.type = type;
        return l;
      };
      Config cfg;
      LayerConfig conv = layer(LayerType::Conv2d);
      conv.filters = 8;
      conv.padding = Padding::Same;
      conv.activation = act;
      LayerConfig a = layer(LayerType::Activation);
      a.activation = act;
      LayerConfig d = layer(LayerType::Dense);
      d.units = 16;  // a multiple of 8: gelu_tanh takes cuBLASLt's GELU_AUX epilogue
      d.activation = act;
      LayerConfig out = layer(LayerType::Dense);
      out.units = 10;
      cfg.model.layers = {conv, a, layer(LayerType::Flatten), d, out};
      const int n = 8;
      Model mc(cfg, policy, *be().cpu, 6, 6, 2, 10, n), mg(cfg, policy, *be().gpu, 6, 6, 2, 10, n);
      mc.init_params(3);
      mg.init_params(3);
      Rng rng(34);
      Dual x = random_dual(rng, DType::F32, Shape{n, 6, 6, 2}, -2.0f, 2.0f);
      Dual logits = alloc_dual(DType::F32, Shape{n, 10});
      be().cpu->copy(logits.c, mc.forward_float(x.c, true, 1, 1));
      be().gpu->copy(logits.g, mg.forward_float(x.g, true, 1, 1));
      const double tol = policy == Policy::Float32 ? 1e-4 : 2e-2;
      expect_close(logits, tol, std::string(enum_name(act)) + " logits");
      Dual proj = random_dual(rng, DType::F32, Shape{n, 10});
      mc.backward(proj.c);
      mg.backward(proj.g);
      Dual grads = alloc_dual(DType::F32, Shape{mc.num_params()});
      be().cpu->copy(grads.c, mc.grads());
      be().gpu->copy(grads.g, mg.grads());
      expect_close(grads, policy == Policy::Float32 ? 1e-4 : 3e-2, std::string(enum_name(act)) + " gradients");
    }
}
