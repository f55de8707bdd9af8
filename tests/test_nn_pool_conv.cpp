// SPDX-License-Identifier: MIT
// The backward of the MNIST smoke net's max pooling with its first convolution's weight gradient in
// one op (Backend::max_pool_conv_backward; docs/cpu-performance.md, "Max pooling's backward in the
// first convolution's weight gradient"): planned where a model's first step is a convolution whose
// relu's gradient the max pooling right after it computes and no input gradient is asked for. Every
// gradient the same bits as with MPX_CPU_FUSE=0 (each op on its own), in float32, mixed_bfloat16
// and mixed_float16; the route named in the kernels list where it runs; a frozen convolution (not
// updated) leaves it out. The forward of the same two layers in one op as well
// (Backend::conv_max_pool_forward; "The first convolution's forward with max pooling"), named in
// the kernels list, the gradients still the bits of the ops one after the other; an evaluation's
// forward in one op too (no window positions), its logits the training forward's bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "nn/model.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;

namespace {

// The MNIST smoke net's shapes: 28x28x1 -> 26x26x32 -> 13x13x32, 5,408 features for the dense layer.
constexpr int kH = 28, kW = 28, kC = 1, kClasses = 10, kMaxBatch = 37;

struct Result {
  std::vector<float> grads;
  std::string route;      // the kernels list's entry for the route, or ""
  std::string fwd_route;  // the pooled forward's entry, or ""
  std::vector<std::string> pieces, conv_pool;  // Model::piece_runs, conv_pool_runs
  std::vector<float> train_logits, eval_logits;  // a training forward's and an evaluation's, after the step
  bool eval_conv_out = false;                    // the evaluation wrote the convolution's output
};

Result run(Policy policy, bool fuse, int64_t n, bool freeze_conv = false, bool keep_outputs = false,
           std::vector<LayerTensors>* tensors = nullptr) {
  if (!fuse) setenv("MPX_CPU_FUSE", "0", 1);
  auto be = create_backend("cpu");
  LayerConfig conv = conv_layer(32, 3, 1, Padding::Valid, ActivationName::Relu), dense = dense_layer(kClasses);
  LayerConfig pool = support::pool_layer(LayerType::MaxPool, 2);
  conv.name = "conv";
  pool.name = "pool";
  dense.name = "logits";
  dense.dtype = LayerDType::Float32;
  Model m(support::model_config(
              {conv, pool, make_layer(LayerType::Flatten), dense}),
          policy, *be, kH, kW, kC, kClasses, kMaxBatch);
  unsetenv("MPX_CPU_FUSE");
  m.init_params(13);
  if (freeze_conv) m.set_updated_params([](const ParamInfo& p) { return p.layer != "conv"; });
  m.keep_layer_outputs(keep_outputs);
  Result r;
  r.grads = support::image_step_grads(m, *be, n, kH, kW, kC, kClasses);
  if (tensors) *tensors = m.layer_tensors();
  {
    const support::FixedImages in = support::fixed_images(*be, n, kH, kW, kC, 53, 5);
    r.train_logits = support::download_f32(*be, m.forward(in.x, true, 7, 4));
    r.eval_logits = support::download_f32(*be, m.forward(in.x, false));
    r.eval_conv_out = !m.layer_tensors().front().output.empty();
  }
  r.pieces = m.piece_runs();
  r.conv_pool = m.conv_pool_runs();
  for (const KernelChoice& k : be->kernels()) {
    if (k.op.find("with max pooling's backward") != std::string::npos) r.route = k.impl;
    if (k.op.find("convolution forward with max pooling") != std::string::npos) r.fwd_route = k.impl;
  }
  return r;
}

}  // namespace

TEST_CASE("max pooling's backward with the first convolution's weight gradient: the bits of the ops one after the "
          "other",
          "[nn][fuse]") {
  // The rule: the few-channel weight gradient (mpx's loops, the weight-gradient switch at its default).
  const char* wgrad = std::getenv("MPX_CONV_WGRAD");
  const bool runs = !std::getenv("MPX_CPU_REFERENCE") && !(wgrad && std::string(wgrad) != "auto");
  for (const Policy policy : {Policy::Float32, Policy::MixedBFloat16, Policy::MixedFloat16})
    for (const int64_t n : {int64_t{32}, int64_t{kMaxBatch}, int64_t{5}}) {
      INFO(policy_name(policy) << ", batch " << n);
      const Result on = run(policy, true, n), off = run(policy, false, n);
      INFO("route: '" << on.route << "', forward: '" << on.fwd_route << "'");
      CHECK(on.route.empty() == !runs);
      CHECK(off.route.empty());
      // The training forward: the convolution and the pooling in one op where the few-channel
      // kernel takes it (mpx's loops, the forward switch at its default).
      const char* fwd = std::getenv("MPX_CONV_FORWARD");
      CHECK(on.fwd_route.empty() ==
            (std::getenv("MPX_CPU_REFERENCE") != nullptr || (fwd && std::string(fwd) != "auto")));
      CHECK(off.fwd_route.empty());
      REQUIRE(on.grads.size() == off.grads.size());
      CHECK(std::memcmp(on.grads.data(), off.grads.data(), on.grads.size() * 4) == 0);
      double mag = 0;
      for (float v : on.grads) mag += std::fabs(v);
      CHECK(mag > 0);
    }
}

TEST_CASE("a frozen first convolution leaves max pooling's backward as it is", "[nn][fuse]") {
  const Result on = run(Policy::Float32, true, 16, true), off = run(Policy::Float32, false, 16, true);
  CHECK(on.route.empty());
  REQUIRE(on.grads.size() == off.grads.size());
  CHECK(std::memcmp(on.grads.data(), off.grads.data(), on.grads.size() * 4) == 0);
}

TEST_CASE("keep_layer_outputs: every layer's output written, the convolution and the pooling each in its own op",
          "[nn][fuse]") {
  const char* fwd = std::getenv("MPX_CONV_FORWARD");
  const bool runs = !std::getenv("MPX_CPU_REFERENCE") && !(fwd && std::string(fwd) != "auto");
  for (const Policy policy : {Policy::Float32, Policy::MixedBFloat16}) {
    INFO(policy_name(policy));
    std::vector<LayerTensors> kept, fused;
    const Result on = run(policy, true, 16, false, true, &kept), off = run(policy, true, 16, false, false, &fused);
    CHECK(on.fwd_route.empty());
    CHECK(off.fwd_route.empty() == !runs);
    // As `mpx bench` reports them: the pair in one op, and no run of pieces that it replaces
    // (float32's conv -> pool run, taken when the outputs are kept).
    CHECK(on.conv_pool.empty());
    CHECK(off.conv_pool == (runs ? std::vector<std::string>{"conv -> pool in one op"} : std::vector<std::string>{}));
    if (runs && policy == Policy::Float32)
      CHECK(on.pieces == std::vector<std::string>{"conv -> pool in pieces of 16 rows"});
    if (runs) CHECK(off.pieces.empty());
    REQUIRE(kept.size() == fused.size());
    REQUIRE(kept.front().name == "conv");
    // The convolution's output: there when kept, left empty where the forward went in one op.
    CHECK(!kept.front().output.empty());
    CHECK(fused.front().output.empty() == runs);
    for (size_t i = 1; i < kept.size(); ++i) CHECK(!kept[i].output.empty());
    // The same gradients either way.
    REQUIRE(on.grads.size() == off.grads.size());
    CHECK(std::memcmp(on.grads.data(), off.grads.data(), on.grads.size() * 4) == 0);
  }
}

TEST_CASE("an evaluation's forward: the convolution and the max pooling in one op, the training forward's logits",
          "[nn][fuse]") {
  const char* fwd = std::getenv("MPX_CONV_FORWARD");
  const bool runs = !std::getenv("MPX_CPU_REFERENCE") && !(fwd && std::string(fwd) != "auto");
  for (const Policy policy : {Policy::Float32, Policy::MixedBFloat16, Policy::MixedFloat16})
    for (const int64_t n : {int64_t{kMaxBatch}, int64_t{5}}) {
      INFO(policy_name(policy) << ", batch " << n);
      const Result on = run(policy, true, n), off = run(policy, false, n);
      // One op where the route runs: the convolution's output never written.
      CHECK(on.eval_conv_out == !runs);
      CHECK(off.eval_conv_out);
      // No dropout or batch norm: an evaluation gives the training forward's logits, bit for bit,
      // the pooled forward with or without its window positions.
      REQUIRE(on.eval_logits.size() == static_cast<size_t>(n * kClasses));
      CHECK(std::memcmp(on.eval_logits.data(), on.train_logits.data(), on.eval_logits.size() * 4) == 0);
      CHECK(std::memcmp(off.eval_logits.data(), off.train_logits.data(), off.eval_logits.size() * 4) == 0);
      // Against the ops one after the other: the few-channel kernel's bits where conv2d_forward runs
      // it too (16-bit outputs; float32 without AVX-512 runs oneDNN's kernel), else within float32
      // rounding of the sums.
      int64_t far = 0;
      double mag = 0;
      for (size_t i = 0; i < on.eval_logits.size(); ++i) {
        const float a = on.eval_logits[i], b = off.eval_logits[i];
        mag += std::fabs(b);
        const float tol = policy == Policy::Float32 ? 1e-4f * (1.0f + std::fabs(b)) : 0.0f;
        if (!(std::fabs(a - b) <= tol)) ++far;
      }
      CHECK(far == 0);
      CHECK(mag > 0);
    }
}
