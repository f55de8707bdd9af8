// SPDX-License-Identifier: MIT
// An activation layer after a batch norm, applied in the batch norm's ops (nn/sequence.cpp,
// Layer::absorb_next_activation; docs/cpu-performance.md, "Batch norm and the activation
// after it"): a training step and an inference forward give the same bits with the fusion on
// and off (MPX_CPU_FUSE=0) under the 16-bit policies, where the fusion releases the
// activation's output and gradient buffers; no fusion in float32, after a relu (its backward
// reads its output, which the next layer may take over) or across a dtype change.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "nn/model.h"
#include "support/backend_check.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;

namespace {

struct Fuse {
  explicit Fuse(bool on) { on ? unsetenv("MPX_CPU_FUSE") : setenv("MPX_CPU_FUSE", "0", 1); }
  ~Fuse() { unsetenv("MPX_CPU_FUSE"); }
};

struct Run {
  std::vector<float> grads, input_grad, eval_out;
  size_t activation_bytes = 0, workspace_bytes = 0;
};

constexpr int kH = 8, kW = 8, kC = 3, kClasses = 4, kN = 5;

Run run(const std::vector<LayerConfig>& layers, Policy policy, bool fuse) {
  Fuse f(fuse);
  Run r;
  auto be = create_backend("cpu");
  Model m(support::model_config(layers), policy, *be, kH, kW, kC, kClasses, kN);
  m.init_params(13);
  r.activation_bytes = m.memory_report().activation_bytes;
  r.workspace_bytes = m.memory_report().workspace_bytes;
  const std::vector<float> xh = support::random_vec(static_cast<size_t>(kN * kH * kW * kC), 3, -2.0, 2.0);
  const std::vector<float> ph = support::random_vec(static_cast<size_t>(kN * kClasses), 4);
  Buffer xb = be->alloc(xh.size() * 4, "test input"), pb = be->alloc(ph.size() * 4, "test projection");
  const Tensor x = xb.view(DType::F32, Shape{kN, kH, kW, kC}), proj = pb.view(DType::F32, Shape{kN, kClasses});
  be->upload(x, xh.data());
  be->upload(proj, ph.data());
  m.forward_float(x, true, 7, 3);
  m.backward(proj);
  r.grads = support::download_f32(*be, m.grads());
  r.input_grad = support::download_f32(*be, m.input_grad());
  r.eval_out = support::download_f32(*be, m.forward_float(x, false, 7, 4));  // moving statistics
  return r;
}

void same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  INFO(what);
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

LayerConfig act_layer(ActivationName a) {
  LayerConfig l = make_layer(LayerType::Activation);
  l.activation = a;
  return l;
}

}  // namespace

TEST_CASE("batch norm then gelu or silu: the same bits with the fusion on and off, and the buffers it releases",
          "[nn][bn][fuse]") {
  for (const ActivationName a : {ActivationName::Gelu, ActivationName::Silu, ActivationName::GeluTanh}) {
    // conv -> batch_norm -> act -> conv -> batch_norm -> act -> flatten -> dense: the fast
    // CIFAR recipe's block, twice.
    const std::vector<LayerConfig> net = {conv_layer(6, 3), make_layer(LayerType::BatchNorm), act_layer(a),
                                          conv_layer(5, 3), make_layer(LayerType::BatchNorm), act_layer(a),
                                          make_layer(LayerType::Flatten), dense_layer(kClasses)};
    for (const Policy policy : {Policy::MixedBFloat16, Policy::MixedFloat16, Policy::Float32}) {
      INFO(policy_name(policy) << ", " << static_cast<int>(a));
      const Run on = run(net, policy, true), off = run(net, policy, false);
      same_bits(on.grads, off.grads, "weight gradients");
      same_bits(on.input_grad, off.input_grad, "input gradient");
      same_bits(on.eval_out, off.eval_out, "inference logits");
      // Released per sample: each activation layer's output (kept) and input gradient, of
      // [6, 6, 6] and [4, 4, 5] elements; float32 layers are not fused.
      const size_t released = policy == Policy::Float32 ? 0 : (6 * 6 * 6 + 4 * 4 * 5) * kN * 2;
      CHECK(off.activation_bytes - on.activation_bytes == released);
      CHECK(off.workspace_bytes - on.workspace_bytes == released);
    }
  }
}

TEST_CASE("batch norm then an activation: no fusion after relu or across a dtype change", "[nn][bn][fuse]") {
  LayerConfig bn32 = make_layer(LayerType::BatchNorm);
  bn32.dtype = LayerDType::Float32;
  const std::vector<std::vector<LayerConfig>> nets = {
      {conv_layer(6, 3), make_layer(LayerType::BatchNorm), act_layer(ActivationName::Relu),
       make_layer(LayerType::Flatten), dense_layer(kClasses)},
      {conv_layer(6, 3), bn32, act_layer(ActivationName::Gelu), make_layer(LayerType::Flatten), dense_layer(kClasses)},
  };
  for (const auto& net : nets) {
    const Run on = run(net, Policy::MixedBFloat16, true), off = run(net, Policy::MixedBFloat16, false);
    CHECK(on.activation_bytes == off.activation_bytes);
    same_bits(on.grads, off.grads, "weight gradients");
    same_bits(on.input_grad, off.input_grad, "input gradient");
  }
}
