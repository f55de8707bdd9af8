// SPDX-License-Identifier: MIT
// The plan-time fusion of a relu's backward into the max pooling, global average pooling or
// dense layer after it (docs/cpu-performance.md "Max pooling after relu", "Relu before a
// dense layer", "Relu before global average pooling"), the
// dense one across a flatten and into a float32 dense layer that reads a 16-bit input as it
// is: a model's gradients are the same
// bits with the fusion on and off (MPX_CPU_FUSE=0), under float32 and the 16-bit
// policies, for a relu fused into conv2d and for a relu activation layer; and the fusion
// really ran (the pool layer's input gradient is then already zero where the relu was
// not active), releasing the relu gradient buffers it makes unnecessary, only where the
// rule allows it (not after leaky_relu, not across a cast).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "nn/model.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;
using support::pool_layer;

namespace {

struct Fuse {
  explicit Fuse(bool on) { on ? unsetenv("MPX_CPU_FUSE") : setenv("MPX_CPU_FUSE", "0", 1); }
  ~Fuse() { unsetenv("MPX_CPU_FUSE"); }
};

struct Run {
  std::vector<float> grads, input_grad;
  int64_t routed_past_relu = 0;
  size_t workspace_bytes = 0;  // pool input-gradient entries nonzero where the pool's input is <= 0
};

constexpr int kH = 10, kW = 10, kC = 2, kClasses = 3, kN = 4;

/// `fused_type`: the layers whose input gradient is counted where their input is not > 0.
Run run(const std::vector<LayerConfig>& layers, Policy policy, bool fuse, const std::string& fused_type = "max_pool") {
  Fuse f(fuse);
  Run r;
  auto be = create_backend("cpu");
  Model m(support::model_config(layers), policy, *be, kH, kW, kC, kClasses, kN);
  m.init_params(11);
  m.keep_layer_outputs(true);  // the layers' outputs are read below
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
  const std::vector<LayerTensors> lt = m.layer_tensors();
  for (size_t i = 1; i < lt.size(); ++i) {
    if (lt[i].type != fused_type) continue;
    const std::vector<float> in = support::download_f32(*be, lt[i - 1].output);
    const std::vector<float> g = support::download_f32(*be, lt[i].input_grad);
    REQUIRE(in.size() == g.size());
    for (size_t j = 0; j < g.size(); ++j)
      if (g[j] != 0.0f && !(in[j] > 0.0f)) ++r.routed_past_relu;
  }
  return r;
}

void same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  INFO(what);
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

LayerConfig relu_conv(int64_t filters) { return conv_layer(filters, 3, 1, Padding::Valid, ActivationName::Relu); }
LayerConfig with_dtype(LayerConfig l, LayerDType t) {
  l.dtype = t;
  return l;
}

}  // namespace

TEST_CASE("relu then max_pool: the same gradient bits with the fusion on and off", "[nn][pool][fuse]") {
  LayerConfig relu = make_layer(LayerType::Activation);
  relu.activation = ActivationName::Relu;
  const std::vector<std::vector<LayerConfig>> nets = {
      // conv(relu) -> max_pool 2 (tiled) -> flatten -> dense: the MNIST smoke net's shape.
      {relu_conv(6), pool_layer(LayerType::MaxPool, 2), make_layer(LayerType::Flatten), dense_layer(kClasses)},
      // conv -> relu layer -> overlapping max_pool 3/2 same (general loops) -> ...
      {conv_layer(5, 3), relu, pool_layer(LayerType::MaxPool, 3, 2, Padding::Same), relu_conv(4),
       pool_layer(LayerType::MaxPool, 2), make_layer(LayerType::Flatten), dense_layer(kClasses)},
  };
  // The relu gradient buffers the fusion releases, per sample in elements: net 0's conv
  // output [8, 8, 6]; net 1's relu layer [8, 8, 5] and second conv [2, 2, 4].
  const std::vector<size_t> released = {8 * 8 * 6, 8 * 8 * 5 + 2 * 2 * 4};
  for (const Policy policy : {Policy::Float32, Policy::MixedBFloat16, Policy::MixedFloat16})
    for (size_t i = 0; i < nets.size(); ++i) {
      INFO("net " << i << ", policy " << policy_name(policy));
      const Run on = run(nets[i], policy, true), off = run(nets[i], policy, false);
      same_bits(on.grads, off.grads, "weight gradients");
      same_bits(on.input_grad, off.input_grad, "input gradient");
      CHECK(on.routed_past_relu == 0);  // the pool computed the relu's gradient too
      CHECK(off.routed_past_relu > 0);  // two passes: the pool's own gradient, relu after it
      const size_t bytes = policy == Policy::Float32 ? 4 : 2;
      CHECK(off.workspace_bytes - on.workspace_bytes == released[i] * kN * bytes);
    }
}

TEST_CASE("relu then max_pool: no fusion after leaky_relu or across a dtype change", "[nn][pool][fuse]") {
  LayerConfig leaky = conv_layer(6, 3, 1, Padding::Valid, ActivationName::LeakyRelu);
  leaky.negative_slope = 0.0;  // still not relu: the rule names relu only
  const std::vector<std::vector<LayerConfig>> nets = {
      {leaky, pool_layer(LayerType::MaxPool, 2), make_layer(LayerType::Flatten), dense_layer(kClasses)},
      {relu_conv(6), with_dtype(pool_layer(LayerType::MaxPool, 2), LayerDType::Float32),
       make_layer(LayerType::Flatten), dense_layer(kClasses)},
  };
  for (size_t i = 0; i < nets.size(); ++i) {
    INFO("net " << i);
    const Run on = run(nets[i], Policy::MixedBFloat16, true), off = run(nets[i], Policy::MixedBFloat16, false);
    same_bits(on.grads, off.grads, "weight gradients");
    CHECK(on.routed_past_relu > 0);  // not fused: the pool's own gradient
    CHECK(on.workspace_bytes == off.workspace_bytes);
  }
}

TEST_CASE("relu then (flatten then) dense, or global_avg_pool: the same gradient bits with the fusion on and off",
          "[nn][dense][fuse]") {
  LayerConfig relu = make_layer(LayerType::Activation);
  relu.activation = ActivationName::Relu;
  LayerConfig dense32 = with_dtype(dense_layer(kClasses), LayerDType::Float32);
  const std::vector<std::vector<LayerConfig>> nets = {
      // conv(relu) -> flatten -> dense: the seed MNIST net's shape.
      {relu_conv(6), make_layer(LayerType::Flatten), dense_layer(kClasses)},
      // ... -> dense(relu) -> dense: two fusions.
      {relu_conv(4), make_layer(LayerType::Flatten), dense_layer(8, ActivationName::Relu), dense_layer(kClasses)},
      // a relu layer before the flatten.
      {conv_layer(5, 3), relu, make_layer(LayerType::Flatten), dense_layer(kClasses)},
      // a float32 dense layer (the seed net's `dtype: float32` classifier): under the 16-bit
      // policies it reads the conv's 16-bit output as it is.
      {relu_conv(6), make_layer(LayerType::Flatten), dense32},
      // conv(relu) -> global_avg_pool -> dense(relu) -> dense: the CIFAR seed net's shape; here
      // the pooling takes the conv's relu and the last dense layer the first one's.
      {relu_conv(6), make_layer(LayerType::GlobalAvgPool), dense_layer(8, ActivationName::Relu),
       dense_layer(kClasses)},
  };
  // The relu gradient buffers released, per sample in elements (the layer's dtype): the conv
  // or relu layer outputs [8, 8, C], and net 1's dense(relu) output [8].
  const std::vector<size_t> released = {8 * 8 * 6, 8 * 8 * 4 + 8, 8 * 8 * 5, 8 * 8 * 6, 8 * 8 * 6 + 8};
  for (const Policy policy : {Policy::Float32, Policy::MixedBFloat16, Policy::MixedFloat16})
    for (size_t i = 0; i < nets.size(); ++i) {
      INFO("net " << i << ", policy " << policy_name(policy));
      const Run on = run(nets[i], policy, true, "dense"), off = run(nets[i], policy, false, "dense");
      same_bits(on.grads, off.grads, "weight gradients");
      same_bits(on.input_grad, off.input_grad, "input gradient");
      CHECK(on.routed_past_relu == 0);  // every dense layer computed its input relu's gradient too
      CHECK(off.routed_past_relu > 0);
      if (i == 4) {  // and the global pooling its own
        const Run gon = run(nets[i], policy, true, "global_avg_pool"),
                  goff = run(nets[i], policy, false, "global_avg_pool");
        CHECK(gon.routed_past_relu == 0);
        CHECK(goff.routed_past_relu > 0);
      }
      const size_t bytes = policy == Policy::Float32 ? 4 : 2;
      CHECK(off.workspace_bytes - on.workspace_bytes == released[i] * kN * bytes);
    }
}

TEST_CASE("relu then dense: no fusion after leaky_relu, across a cast or past a layer that changes values",
          "[nn][dense][fuse]") {
  LayerConfig leaky = conv_layer(6, 3, 1, Padding::Valid, ActivationName::LeakyRelu);
  leaky.negative_slope = 0.0;
  LayerConfig flatten32 = with_dtype(make_layer(LayerType::Flatten), LayerDType::Float32);
  LayerConfig dropout = make_layer(LayerType::Dropout);
  dropout.rate = 0.5;
  const std::vector<std::vector<LayerConfig>> nets = {
      {leaky, make_layer(LayerType::Flatten), dense_layer(kClasses)},
      {relu_conv(6), flatten32, dense_layer(kClasses)},  // a cast into the float32 flatten
      {relu_conv(6), make_layer(LayerType::Flatten), dropout, dense_layer(kClasses)},
  };
  for (size_t i = 0; i < nets.size(); ++i) {
    INFO("net " << i);
    const Run on = run(nets[i], Policy::MixedBFloat16, true, "dense"),
              off = run(nets[i], Policy::MixedBFloat16, false, "dense");
    same_bits(on.grads, off.grads, "weight gradients");
    CHECK(on.workspace_bytes == off.workspace_bytes);
    if (i != 2) CHECK(on.routed_past_relu > 0);  // not fused: the dense layer's own gradient
  }
}
