// SPDX-License-Identifier: MIT
// Model::set_updated_params (docs/fast-cifar.md, "Parameter groups"): backward() carries no
// gradient into the leading layers whose parameters the optimizer leaves alone. Checked against
// the full backward pass of the same model and batch: every other gradient the same bits, the
// skipped layers' gradients zeros, the gradient-ready hook reporting the same ranges in the same
// order, and a forward_float() backward (input gradient asked for) running every layer.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"
#include "nn/model.h"
#include "support/backend_check.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;

namespace {

constexpr int kH = 9, kW = 9, kC = 3, kClasses = 4, kN = 6;

LayerConfig named(LayerConfig l, const std::string& name) {
  l.name = name;
  return l;
}

// The fast CIFAR recipe's front: a 2x2 convolution with a GELU, then conv -> batch norm -> GELU
// twice, a residual block, and the classifier.
std::vector<LayerConfig> net() {
  LayerConfig gelu = make_layer(LayerType::Activation);
  gelu.activation = ActivationName::Gelu;
  return {named(conv_layer(6, 2, 1, Padding::Valid, ActivationName::Gelu), "whiten"),
          named(conv_layer(5, 3, 1, Padding::Same), "c1"),
          named(make_layer(LayerType::BatchNorm), "bn1"),
          gelu,
          named(conv_layer(5, 3, 1, Padding::Same), "c2"),
          named(support::residual_layer({named(conv_layer(5, 3, 1, Padding::Same, ActivationName::Relu), "r1")}),
                "res"),
          make_layer(LayerType::Flatten),
          named(dense_layer(kClasses), "out")};
}

struct Step {
  std::vector<float> grads;
  std::vector<std::pair<int64_t, int64_t>> ready;  // the hook's ranges, in order
  size_t prefix = 0;
};

/// One training step of the same model on the same batch; `frozen`: the layers whose
/// parameters are not updated (empty: set_updated_params is not called).
Step step(Backend& be, Model& m, const Tensor& x, const Tensor& dlogits, const std::vector<std::string>& frozen,
          bool call = true) {
  Step s;
  if (call)
    m.set_updated_params([&](const ParamInfo& p) {
      for (const std::string& f : frozen)
        if (p.layer == f) return false;
      return true;
    });
  s.prefix = m.frozen_prefix();
  m.set_grad_ready_hook([&](int64_t o, int64_t n) { s.ready.emplace_back(o, n); });
  for (const ParamInfo& p : m.params())  // whatever backward() leaves alone shows
    if (p.trainable) be.fill(m.grads().flat_view(p.offset, Shape{p.shape.numel()}), 7.0f);
  m.forward(x, true, 5, 1);
  m.backward(dlogits);
  m.set_grad_ready_hook({});
  s.grads = support::download_f32(be, m.grads());
  return s;
}

/// The elements of the gradient arena that belong to `layer`'s trainable parameters.
std::vector<bool> owned_by(const Model& m, const std::string& layer) {
  std::vector<bool> own(static_cast<size_t>(m.num_params()), false);
  for (const ParamInfo& p : m.params())
    if (p.trainable && p.layer == layer)
      for (int64_t i = 0; i < p.shape.numel(); ++i) own[static_cast<size_t>(p.offset + i)] = true;
  return own;
}

}  // namespace

TEST_CASE("a frozen leading layer gets no gradient; every other gradient is the same bits",
          "[nn][train][fast_cifar]") {
  for (const Policy policy : {Policy::Float32, Policy::MixedBFloat16, Policy::MixedFloat16}) {
    INFO(policy_name(policy));
    auto be = create_backend("cpu");
    Model m(support::model_config(net()), policy, *be, kH, kW, kC, kClasses, kN);
    m.init_params(21);
    std::vector<uint8_t> xv(static_cast<size_t>(kN * kH * kW * kC));
    Rng rng(4);
    for (auto& b : xv) b = static_cast<uint8_t>(rng.uniform_int(256));
    Buffer xb = be->alloc(xv.size(), "test u8 batch");
    const Tensor x = xb.view(DType::U8, Shape{kN, kH, kW, kC});
    be->upload(x, xv.data());
    const std::vector<float> dv = support::random_vec(static_cast<size_t>(kN * kClasses), 6, -1.0, 1.0);
    Buffer db = be->alloc(dv.size() * 4, "test dlogits");
    const Tensor dlogits = db.view(DType::F32, Shape{kN, kClasses});
    be->upload(dlogits, dv.data());
    const std::vector<GradRange> order = m.grad_ready_ranges();

    const Step full = step(*be, m, x, dlogits, {}, false);
    CHECK(full.prefix == 0);
    const std::vector<bool> whiten = owned_by(m, "whiten"), c1 = owned_by(m, "c1");
    REQUIRE(full.ready.size() == order.size());

    SECTION("the whitening layer frozen: one layer skipped, c1 computes no input gradient") {
      const Step s = step(*be, m, x, dlogits, {"whiten"});
      CHECK(s.prefix == 1);
      REQUIRE(s.grads.size() == full.grads.size());
      int64_t same = 0, zeros = 0, other = 0;
      for (size_t i = 0; i < s.grads.size(); ++i) {
        if (whiten[i]) {
          zeros += s.grads[i] == 0.0f && !std::signbit(s.grads[i]);
          CHECK(full.grads[i] != 0.0f);  // the full pass did give it a gradient
        } else {
          ++other;
          same += std::memcmp(&s.grads[i], &full.grads[i], 4) == 0;
        }
      }
      CHECK(zeros == 6 * 2 * 2 * 3 + 6);
      CHECK(same == other);
      CHECK(s.ready == full.ready);  // every range, in the full pass's order
      const std::vector<LayerTensors> lt = m.layer_tensors();
      CHECK(lt.at(0).input_grad.empty());  // whiten: not run
      CHECK(lt.at(1).name == "c1");
      CHECK(lt.at(1).input_grad.empty());  // c1: its weights' gradient only
      CHECK_FALSE(lt.at(2).input_grad.empty());
    }
    SECTION("two leading layers frozen: two skipped") {
      const Step s = step(*be, m, x, dlogits, {"whiten", "c1"});
      CHECK(s.prefix == 2);
      for (size_t i = 0; i < s.grads.size(); ++i) {
        if (whiten[i] || c1[i])
          CHECK(s.grads[i] == 0.0f);
        else
          CHECK(std::memcmp(&s.grads[i], &full.grads[i], 4) == 0);
      }
      CHECK(s.ready == full.ready);
    }
    SECTION("a frozen layer after an updated one: nothing skipped, the same bits everywhere") {
      const Step s = step(*be, m, x, dlogits, {"c1", "out"});
      CHECK(s.prefix == 0);
      CHECK(std::memcmp(s.grads.data(), full.grads.data(), s.grads.size() * 4) == 0);
    }
    SECTION("everything frozen: no layer runs backward, every gradient is zero") {
      const Step s = step(*be, m, x, dlogits, {"whiten", "c1", "bn1", "c2", "r1", "out"});
      CHECK(s.prefix == 8);
      for (const float g : s.grads) CHECK(g == 0.0f);
      CHECK(s.ready == full.ready);
    }
    SECTION("an input gradient asked for (forward_float): every layer runs") {
      step(*be, m, x, dlogits, {"whiten"});
      const std::vector<float> xf = support::random_vec(static_cast<size_t>(kN * kH * kW * kC), 8, -2.0, 2.0);
      Buffer fb = be->alloc(xf.size() * 4, "test float input");
      const Tensor xt = fb.view(DType::F32, Shape{kN, kH, kW, kC});
      be->upload(xt, xf.data());
      m.forward_float(xt, true, 5, 1);
      m.backward(dlogits);
      const std::vector<float> g = support::download_f32(*be, m.grads());
      int64_t nonzero = 0;
      for (size_t i = 0; i < g.size(); ++i) nonzero += whiten[i] && g[i] != 0.0f;
      CHECK(nonzero > 0);
      CHECK(support::download_f32(*be, m.input_grad()).size() == xf.size());
    }
  }
}
