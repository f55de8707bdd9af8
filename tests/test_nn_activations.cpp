// SPDX-License-Identifier: MIT
// The activations through the whole Model on the CPU backend: numerical gradient checks
// (central differences of sum(proj * logits) in float64 against backward(), as in
// test_nn_gradcheck.cpp) of each activation as its own layer and fused into dense and
// conv2d, including the residual block; the buffers a fused activation plans (a kept
// pre-activation only where the backward reads the input); and 16-bit models.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/activation.h"
#include "nn/model.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;
using support::residual_layer;

namespace {

/// Every name of core/activation.h's table but linear (relu has its own checks in
/// test_nn_gradcheck.cpp but costs little), leaky_relu at Keras 3's default slope and another.
struct Named {
  std::string name;
  double slope;
};
const std::vector<Named> kNew = [] {
  std::vector<Named> v;
  for (const ActivationEntry& n : kActivationNames) {
    if (n.kind == ActKind::None) continue;
    v.push_back({n.name, kLeakyReluDefaultSlope});
    if (n.kind == ActKind::LeakyRelu) v.push_back({n.name, 0.03});
  }
  return v;
}();

/// relu and leaky_relu have a kink at 0 (the check skips coordinates that straddle it).
bool has_kink(const Named& a) { return activation_kind(a.name) == ActKind::Relu || a.name == "leaky_relu"; }

LayerConfig with_act(LayerConfig l, const Named& a) {
  l.activation = *parse_enum<ActivationName>(a.name);
  l.negative_slope = a.slope;
  return l;
}
LayerConfig act_layer(const Named& a) { return with_act(make_layer(LayerType::Activation), a); }

// As test_nn_gradcheck.cpp: a float32 model for inputs [H, W, C], checked on a batch of n.
void run_check(std::vector<LayerConfig> layers, int H, int W, int C, int classes, int n, bool kinks,
               uint64_t seed = 5) {
  auto be = create_backend("cpu");
  Model m(support::model_config(std::move(layers)), Policy::Float32, *be, H, W, C, classes, n + 1);
  m.init_params(seed);
  const std::vector<float> x = support::random_vec(static_cast<size_t>(n * H * W * C), seed * 31 + 1, -2.0, 2.0);
  support::GradCheckOptions o;
  o.kinks = kinks;
  o.seed = seed;
  const auto r = support::gradcheck_model(m, *be, x, Shape{n, H, W, C}, o);
  INFO("checked " << r.checked << " skipped " << r.skipped << " max error " << r.max_error << " "
                  << r.first_failure);
  CHECK(r.failed == 0);
  CHECK(r.checked > 0);
  CHECK(r.skipped <= r.checked / 5);
}

}  // namespace

TEST_CASE("gradcheck: each activation fused in dense", "[nn][gradcheck][activation]") {
  for (const Named& a : kNew) {
    INFO(a.name << " " << a.slope);
    run_check({make_layer(LayerType::Flatten), with_act(dense_layer(6), a), with_act(dense_layer(5), a), dense_layer(3)}, 2, 2,
              2, 3, 3, has_kink(a));
  }
}

TEST_CASE("gradcheck: each activation fused in conv2d", "[nn][gradcheck][activation]") {
  for (const Named& a : kNew) {
    INFO(a.name << " " << a.slope);
    run_check({with_act(conv_layer(3, 3, 1, Padding::Valid), a), with_act(conv_layer(2, 2, 2, Padding::Same), a),
               make_layer(LayerType::Flatten), dense_layer(3)},
              6, 5, 2, 3, 2, has_kink(a));
  }
}

TEST_CASE("gradcheck: each activation as its own layer, after a conv and a dense", "[nn][gradcheck][activation]") {
  for (const Named& a : kNew) {
    INFO(a.name << " " << a.slope);
    run_check({conv_layer(3, 2), act_layer(a), make_layer(LayerType::Flatten), dense_layer(4), act_layer(a), dense_layer(2)}, 4,
              4, 1, 2, 2, has_kink(a));
  }
}

TEST_CASE("gradcheck: activations inside a residual block", "[nn][gradcheck][activation]") {
  const Named gelu{"gelu", 0}, silu{"silu", 0};
  run_check({conv_layer(3, 3, 1, Padding::Same),
             residual_layer({with_act(conv_layer(3, 3, 1, Padding::Same), gelu), conv_layer(3, 3, 1, Padding::Same),
                             act_layer(silu)}),
             make_layer(LayerType::GlobalAvgPool), dense_layer(2)},
            4, 4, 2, 2, 2, false);
}

TEST_CASE("a fused activation keeps the pre-activation only where its backward reads the input",
          "[nn][activation][memory]") {
  auto be = create_backend("cpu");
  auto bytes = [&](const std::string& act, Policy policy) {
    Model m(support::model_config({make_layer(LayerType::Flatten), with_act(dense_layer(64), Named{act, 0.2}), dense_layer(10)}),
            policy, *be, 4, 4, 1, 10, 32);
    return m.memory_report().activation_bytes;
  };
  for (Policy p : {Policy::Float32, Policy::MixedBFloat16}) {
    const size_t elt = p == Policy::Float32 ? 4 : 2;
    const size_t linear = bytes("linear", p);
    for (const ActivationEntry& n : kActivationNames) {
      INFO(n.name);
      // backward from the output: nothing more; from the input: the [max_batch, 64] pre-activation.
      const bool reads_input = backward_reads(n.kind) == ActSaved::Input;
      CHECK(bytes(n.name, p) == linear + (reads_input ? 32 * 64 * elt : 0));
    }
  }
}

TEST_CASE("16-bit models with every activation: finite logits close to float32's, backward runs",
          "[nn][activation][mixed]") {
  auto be = create_backend("cpu");
  for (const Named& a : kNew) {
    for (Policy p : {Policy::MixedFloat16, Policy::MixedBFloat16}) {
      INFO(a.name << " " << policy_name(p));
      auto layers = [&] {
        return std::vector<LayerConfig>{with_act(conv_layer(4, 3, 1, Padding::Same), a), act_layer(a), make_layer(LayerType::Flatten),
                                        with_act(dense_layer(8), a), dense_layer(3)};
      };
      Model f(support::model_config(layers()), Policy::Float32, *be, 5, 5, 2, 3, 4);
      Model h(support::model_config(layers()), p, *be, 5, 5, 2, 3, 4);
      f.init_params(2);
      h.init_params(2);
      const std::vector<float> xv = support::random_vec(4 * 5 * 5 * 2, 9, -2, 2);
      Buffer xb = be->alloc(xv.size() * 4, "x");
      const Tensor x = xb.view(DType::F32, Shape{4, 5, 5, 2});
      be->upload(x, xv.data());
      const auto lf = support::download_f32(*be, f.forward_float(x, true, 1, 1));
      const auto lh = support::download_f32(*be, h.forward_float(x, true, 1, 1));
      double scale = 0, diff = 0;
      for (size_t i = 0; i < lf.size(); ++i) {
        scale = std::max(scale, static_cast<double>(std::fabs(lf[i])));
        diff = std::max(diff, static_cast<double>(std::fabs(lf[i] - lh[i])));
        REQUIRE(std::isfinite(lh[i]));
      }
      CHECK(diff < 0.05 * scale + 0.02);
      Buffer pb = be->alloc(lh.size() * 4, "proj");
      const Tensor proj = pb.view(DType::F32, Shape{4, 3});
      const std::vector<float> pv = support::random_vec(lh.size(), 3);
      be->upload(proj, pv.data());
      h.backward(proj);
      const auto g = support::download_f32(*be, h.grads());
      double gsum = 0;
      for (float v : g) {
        REQUIRE(std::isfinite(v));
        gsum += std::fabs(v);
      }
      CHECK(gsum > 0);
    }
  }
}
