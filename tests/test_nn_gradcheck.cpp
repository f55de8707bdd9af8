// SPDX-License-Identifier: MIT
// Numerical gradient checks of every layer type through the whole Model on the
// CPU backend (float32 policy): central differences of sum(proj * logits) with
// respect to the master weights and the input, against backward().
//
// Tolerance: 1e-2 relative to max(|analytic|, |numeric|, 1) with a step of 5e-3.
// The forward runs in float32, so each objective carries rounding noise of about
// 1e-7 * |objective| (~1e-6 here); divided by 2*step that is ~1e-4, and the
// truncation error of the central difference (step^2 * f''' / 6) is ~1e-5 for
// these smooth pieces: 1e-2 leaves room for both yet catches any wrong formula
// (a missing factor, a transposed kernel or a dropped term is an O(1) error).
#include <catch2/catch.hpp>

#include "backend/backend.h"
#include "nn/model.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;
using support::pool_layer;
using support::residual_layer;

namespace {

// Builds a float32 model for inputs [H, W, C], initializes it, checks it on a batch of n.
void run_check(std::vector<LayerConfig> layers, int H, int W, int C, int classes, int n, bool kinks,
               uint64_t seed = 5, double lo = -1.0, double hi = 1.0) {
  auto be = create_backend("cpu");
  Model m(support::model_config(std::move(layers)), Policy::Float32, *be, H, W, C, classes, n + 1);
  m.init_params(seed);
  const std::vector<float> x = support::random_vec(static_cast<size_t>(n * H * W * C), seed * 31 + 1, lo, hi);
  support::GradCheckOptions o;
  o.kinks = kinks;
  o.seed = seed;
  const auto r = support::gradcheck_model(m, *be, x, Shape{n, H, W, C}, o);
  INFO("checked " << r.checked << " skipped " << r.skipped << " max error " << r.max_error << " "
                  << r.first_failure);
  CHECK(r.failed == 0);
  CHECK(r.checked > 0);
  CHECK(r.skipped <= r.checked / 5);  // kinks are rare with random inputs
}

}  // namespace

TEST_CASE("gradcheck: dense (linear and relu) and flatten", "[nn][gradcheck]") {
  run_check({make_layer(LayerType::Flatten), dense_layer(6, ActivationName::Relu), dense_layer(3)}, 2, 2, 2, 3, 3,
            true);
}

TEST_CASE("gradcheck: dense with softmax on the last layer (identity, fused in the loss)", "[nn][gradcheck]") {
  run_check({make_layer(LayerType::Flatten), dense_layer(4, ActivationName::Softmax)}, 1, 3, 2, 4, 2, false);
}

TEST_CASE("gradcheck: conv2d valid with bias and fused relu", "[nn][gradcheck]") {
  run_check({conv_layer(3, 3, 1, Padding::Valid, ActivationName::Relu), make_layer(LayerType::Flatten), dense_layer(3)},
            5, 5, 2, 3, 2, true);
}

TEST_CASE("gradcheck: conv2d stride 2 same padding (asymmetric pad on H)", "[nn][gradcheck]") {
  // H=6, k=3, s=2: out 3, total pad 1 -> top 0 / bottom 1; W=5: out 3, total 2 -> 1 / 1.
  run_check({conv_layer(3, 3, 2, Padding::Same), make_layer(LayerType::Flatten), dense_layer(2)}, 6, 5, 2, 2, 2, false);
}

TEST_CASE("gradcheck: conv2d even kernel same padding, no bias", "[nn][gradcheck]") {
  LayerConfig c = conv_layer(2, 2, 1, Padding::Same);
  c.use_bias = false;
  run_check({c, make_layer(LayerType::Flatten), dense_layer(2)}, 4, 3, 2, 2, 2, false);
}

namespace {
LayerConfig depthwise_layer(int64_t multiplier, int kernel, int stride, Padding padding,
                            ActivationName activation = ActivationName::Linear) {
  LayerConfig l = make_layer(LayerType::DepthwiseConv2d);
  l.depth_multiplier = multiplier;
  l.kernel_h = l.kernel_w = kernel;
  l.stride_h = l.stride_w = stride;
  l.padding = padding;
  l.activation = activation;
  return l;
}
}  // namespace

TEST_CASE("gradcheck: depthwise_conv2d valid with bias and fused relu, depth multiplier 1", "[nn][gradcheck]") {
  run_check({depthwise_layer(1, 3, 1, Padding::Valid, ActivationName::Relu), make_layer(LayerType::Flatten),
             dense_layer(3)},
            5, 5, 3, 3, 2, true);
}

TEST_CASE("gradcheck: depthwise_conv2d stride 2 same padding, depth multiplier 2, no bias, after a conv2d",
          "[nn][gradcheck]") {
  // The conv2d in front makes the depthwise layer's input gradient part of the check.
  LayerConfig dw = depthwise_layer(2, 3, 2, Padding::Same, ActivationName::Gelu);
  dw.use_bias = false;
  run_check({conv_layer(3, 1), dw, make_layer(LayerType::Flatten), dense_layer(2)}, 6, 5, 2, 2, 2, false);
}

TEST_CASE("gradcheck: activation relu layer", "[nn][gradcheck]") {
  LayerConfig a = make_layer(LayerType::Activation);
  a.activation = ActivationName::Relu;
  run_check({conv_layer(3, 2), a, make_layer(LayerType::Flatten), dense_layer(2)}, 4, 4, 1, 2, 2, true);
}

TEST_CASE("gradcheck: max_pool (kinks skipped)", "[nn][gradcheck]") {
  run_check({conv_layer(2, 2), pool_layer(LayerType::MaxPool, 2), make_layer(LayerType::Flatten), dense_layer(3)}, 5, 5,
            2, 3, 2, true);
}

TEST_CASE("gradcheck: max_pool same padding, stride 1", "[nn][gradcheck]") {
  run_check({pool_layer(LayerType::MaxPool, 2, 1, Padding::Same), make_layer(LayerType::Flatten), dense_layer(2)}, 3, 3,
            2, 2, 2, true);
}

TEST_CASE("gradcheck: avg_pool valid and same padding", "[nn][gradcheck]") {
  run_check({conv_layer(2, 2), pool_layer(LayerType::AvgPool, 2), make_layer(LayerType::Flatten), dense_layer(2)}, 5, 5,
            1, 2, 2, false);
  run_check({pool_layer(LayerType::AvgPool, 3, 2, Padding::Same), make_layer(LayerType::Flatten), dense_layer(2)}, 4, 5,
            2, 2, 2, false);
}

TEST_CASE("gradcheck: global_avg_pool", "[nn][gradcheck]") {
  run_check({conv_layer(4, 3), make_layer(LayerType::GlobalAvgPool), dense_layer(3)}, 5, 4, 2, 3, 2, false);
}

TEST_CASE("gradcheck: batch_norm in training mode (conv and dense inputs)", "[nn][gradcheck]") {
  run_check({conv_layer(3, 2), make_layer(LayerType::BatchNorm), make_layer(LayerType::Flatten), dense_layer(2)}, 3, 3,
            2, 2, 3, false);
  run_check({make_layer(LayerType::Flatten), dense_layer(4), make_layer(LayerType::BatchNorm), dense_layer(2)}, 2, 2, 1,
            2, 4, false);
}

TEST_CASE("gradcheck: dropout with a fixed seed", "[nn][gradcheck]") {
  LayerConfig d = make_layer(LayerType::Dropout);
  d.rate = 0.4;
  run_check({make_layer(LayerType::Flatten), dense_layer(8), d, dense_layer(3)}, 2, 2, 2, 3, 3, false);
}

TEST_CASE("gradcheck: residual without projection", "[nn][gradcheck]") {
  run_check(
      {conv_layer(3, 3, 1, Padding::Same),
       residual_layer({conv_layer(3, 3, 1, Padding::Same, ActivationName::Relu), conv_layer(3, 3, 1, Padding::Same)}),
       make_layer(LayerType::GlobalAvgPool), dense_layer(2)},
      4, 4, 2, 2, 2, true);
}

TEST_CASE("gradcheck: residual with a strided 1x1 projection and batch_norm", "[nn][gradcheck]") {
  run_check({residual_layer({conv_layer(4, 3, 2, Padding::Same), make_layer(LayerType::BatchNorm)}),
             make_layer(LayerType::Flatten), dense_layer(2)},
            5, 5, 2, 2, 3, false);
}

TEST_CASE("gradcheck: batch_norm without a learned scale (gamma fixed at 1, not a trainable parameter)",
          "[nn][gradcheck]") {
  LayerConfig bn = make_layer(LayerType::BatchNorm);
  bn.scale = false;
  run_check({conv_layer(3, 2), bn, make_layer(LayerType::Flatten), dense_layer(2)}, 3, 3, 2, 2, 3, false);
  auto be = create_backend("cpu");
  Model m(support::model_config({conv_layer(3, 2), bn, make_layer(LayerType::Flatten), dense_layer(2)}),
          Policy::Float32, *be, 3, 3, 2, 2, 4);
  m.init_params(5);
  int gammas = 0;
  for (const ParamInfo& p : m.params())
    if (p.name == "gamma") {
      ++gammas;
      CHECK_FALSE(p.trainable);  // in the state arena, with the moving statistics
      std::vector<float> g(static_cast<size_t>(p.shape.numel()));
      be->download(g.data(), m.state().flat_view(p.offset, p.shape));
      for (float v : g) CHECK(v == 1.0f);
    }
  CHECK(gammas == 1);
}

TEST_CASE("gradcheck: dense output_scale (logits times a constant), with and without softmax", "[nn][gradcheck]") {
  LayerConfig d = dense_layer(3);
  d.output_scale = -0.75;
  run_check({make_layer(LayerType::Flatten), dense_layer(5, ActivationName::Relu), d}, 2, 2, 2, 3, 3, true);
  LayerConfig s = dense_layer(3, ActivationName::Softmax);
  s.output_scale = 1.0 / 9.0;
  s.use_bias = false;
  run_check({make_layer(LayerType::Flatten), s}, 2, 2, 2, 3, 3, false);

  // The logits are exactly the scale times those of the same weights without it (one float32
  // product per element).
  auto be = create_backend("cpu");
  LayerConfig plain = dense_layer(3);
  Model a(support::model_config({make_layer(LayerType::Flatten), plain}), Policy::Float32, *be, 2, 2, 2, 3, 4);
  Model b(support::model_config({make_layer(LayerType::Flatten), d}), Policy::Float32, *be, 2, 2, 2, 3, 4);
  a.init_params(3);
  b.init_params(3);
  const std::vector<float> x = support::random_vec(4 * 8, 9);
  Buffer bx = be->alloc(x.size() * 4, "x");
  const Tensor tx = bx.view(DType::F32, Shape{4, 2, 2, 2});
  be->upload(tx, x.data());
  const std::vector<float> la = support::download_f32(*be, a.forward_float(tx, false));
  const std::vector<float> lb = support::download_f32(*be, b.forward_float(tx, false));
  REQUIRE(la.size() == lb.size());
  for (size_t i = 0; i < la.size(); ++i) CHECK(lb[i] == static_cast<float>(-0.75f * la[i]));
}
