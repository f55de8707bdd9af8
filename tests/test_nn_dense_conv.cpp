// SPDX-License-Identifier: MIT
// The backward of the seed MNIST net's dense layer with its first convolution's weight gradient
// in one op (Backend::dense_conv_backward; docs/cpu-performance.md, "The first convolution's
// weight gradient in the dense walk"): planned where a model's first step is a convolution whose
// relu's gradient the dense layer computes, a reshape between them and no input gradient asked
// for. Its gradients against MPX_CPU_FUSE=0: the dense layer's the same bits, the convolution's
// within float32 summation of them where the CPU backend's walk runs (a float32 input), the same
// bits where it does not (bfloat16: the base runs the two ops); the walk named in the kernels
// list exactly there; a frozen convolution (not updated) leaves it out.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/dense/dense_few.h"
#include "nn/model.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;

namespace {

// The seed MNIST net's shapes: 28x28x1 -> 26x26x32, 21,632 features for the dense layer.
constexpr int kH = 28, kW = 28, kC = 1, kClasses = 10, kMaxBatch = 37;

struct Result {
  std::vector<float> grads;
  std::string walk;  // the kernels list's entry for the walk, or ""
  int64_t conv_params = 0;  // the convolution's kernel and bias (and alignment) come first in the arena
};

Result run(Policy policy, bool fuse, int64_t n, bool freeze_conv = false) {
  if (!fuse) setenv("MPX_CPU_FUSE", "0", 1);
  auto be = create_backend("cpu");
  LayerConfig conv = conv_layer(32, 3, 1, Padding::Valid, ActivationName::Relu), dense = dense_layer(kClasses);
  conv.name = "conv";
  dense.name = "logits";
  dense.dtype = LayerDType::Float32;
  Model m(support::model_config({conv, make_layer(LayerType::Flatten), dense}), policy, *be, kH, kW, kC, kClasses,
          kMaxBatch);
  unsetenv("MPX_CPU_FUSE");
  m.init_params(11);
  if (freeze_conv) m.set_updated_params([](const ParamInfo& p) { return p.layer != "conv"; });
  Result r;
  r.grads = support::image_step_grads(m, *be, n, kH, kW, kC, kClasses);
  for (const KernelChoice& k : be->kernels())
    if (k.op.find("with the convolution's weight gradient") != std::string::npos) r.walk = k.impl;
  for (const ParamInfo& p : m.params())  // the dense layer's start in the arena: the convolution's end
    if (p.layer == "logits" && p.name == "kernel") r.conv_params = p.offset;
  return r;
}

}  // namespace

TEST_CASE("the dense layer's backward with the first convolution's weight gradient: the gradients of the ops one "
          "after the other",
          "[nn][fuse]") {
  for (const int64_t n : {int64_t{32}, int64_t{kMaxBatch}, int64_t{5}}) {
    INFO("batch " << n);
    // float32: the walk runs (mpx's few-output loops, a float32 x of 21,632 columns).
    const Result on = run(Policy::Float32, true, n), off = run(Policy::Float32, false, n);
    // The rule (choose_dense_conv_backward): the AVX-512 or AVX2 build, MPX_DENSE_FEW auto.
    const std::string isa = cpu::dense_few_isa();
    const char* mode = std::getenv("MPX_DENSE_FEW");
    const bool runs = !(mode && std::string(mode) != "auto") && !std::getenv("MPX_CPU_REFERENCE") &&
                      (isa == "avx512" || isa == "avx2");
    INFO("walk: '" << on.walk << "', build " << isa);
    if (runs)
      CHECK(on.walk == "mpx:few-outputs " + isa +
                           ", both passes and the first convolution's weight gradient in one walk, float32 x in "
                           "registers, dx not stored");
    else
      CHECK(on.walk.empty());
    CHECK(off.walk.empty());
    REQUIRE(on.grads.size() == off.grads.size());
    const size_t first_dense = static_cast<size_t>(on.conv_params);
    REQUIRE(on.grads.size() > first_dense);
    double conv_max = 0;
    for (size_t i = 0; i < first_dense; ++i) conv_max = std::max(conv_max, std::fabs(double{off.grads[i]}));
    REQUIRE(conv_max > 0);
    for (size_t i = 0; i < on.grads.size(); ++i) {
      const double a = on.grads[i], b = off.grads[i];
      if (i >= first_dense || on.walk.empty()) {
        if (std::memcmp(&on.grads[i], &off.grads[i], 4) != 0) FAIL("gradient " << i << ": " << a << " against " << b);
      } else if (!(std::fabs(a - b) <= 1e-5 * std::fabs(b) + 1e-6 * conv_max)) {
        FAIL("the convolution's gradient " << i << ": " << a << " against " << b);
      }
    }
    // mixed_bfloat16: the rule leaves a 16-bit x to the two ops, so every bit is the same.
    const Result on16 = run(Policy::MixedBFloat16, true, n), off16 = run(Policy::MixedBFloat16, false, n);
    CHECK(on16.walk.empty());
    REQUIRE(on16.grads.size() == off16.grads.size());
    CHECK(std::memcmp(on16.grads.data(), off16.grads.data(), on16.grads.size() * 4) == 0);
  }
}

TEST_CASE("a frozen first convolution leaves the dense layer's backward as it is", "[nn][fuse]") {
  // Not updated, the convolution gets no gradient (zeros) and the dense layer returns none either.
  const Result on = run(Policy::Float32, true, 16, true), off = run(Policy::Float32, false, 16, true);
  CHECK(on.walk.empty());
  REQUIRE(on.grads.size() == off.grads.size());
  CHECK(std::memcmp(on.grads.data(), off.grads.data(), on.grads.size() * 4) == 0);
  REQUIRE(on.conv_params >= 32 * 3 * 3 + 32);
  for (int64_t i = 0; i < on.conv_params; ++i) REQUIRE(on.grads[static_cast<size_t>(i)] == 0.0f);
}
