// SPDX-License-Identifier: MIT
// Parameter alignment on the GPU (docs/design.md "Parameter arenas"): every weight and
// gradient a cuDNN or cuBLASLt call receives starts 256-byte aligned, in the 16-bit copy
// too, for a model whose sizes are all odd.
#include <catch2/catch.hpp>

#include <cstdint>

#include "cuda/cuda_compare.h"
#include "nn/model.h"
#include "support/gradcheck.h"

using namespace cudatest;

namespace {
bool aligned256(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data) % 256 == 0; }
}  // namespace

TEST_CASE("cuda: every parameter of every arena starts 256-byte aligned", "[cuda][param_align]") {
  Backend& g = *be().gpu;
  const Config cfg = support::model_config(
      {support::conv_layer(5, 3, 1, Padding::Same, ActivationName::Relu), support::make_layer(LayerType::BatchNorm),
       support::make_layer(LayerType::GlobalAvgPool), support::dense_layer(7, ActivationName::Relu),
       support::dense_layer(3)});
  for (Policy policy : {Policy::Float32, Policy::MixedFloat16, Policy::MixedBFloat16}) {
    INFO("policy " << policy_name(policy));
    Model m(cfg, policy, g, 6, 6, 3, 3, 2);
    for (const ParamInfo& p : m.params()) {
      INFO(p.layer << "/" << p.name);
      if (p.trainable) {
        CHECK(aligned256(m.master().flat_view(p.offset, p.shape)));
        CHECK(aligned256(m.grads().flat_view(p.offset, p.shape)));
        if (!m.compute_copy().empty())
          CHECK(aligned256(m.compute_copy().flat_view(p.offset, p.shape)));
      } else {
        CHECK(aligned256(m.state().flat_view(p.offset, p.shape)));
      }
    }
  }
}
