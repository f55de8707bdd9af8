// SPDX-License-Identifier: MIT
// Optimizer: state arenas and the fused update.
#include "train/optimizer.h"

#include "core/error.h"

namespace mpx {

Optimizer::Optimizer(const OptimizerConfig& cfg, Backend& backend, int64_t num_params)
    : cfg_(cfg), backend_(backend), n_(num_params) {
  bool two = false, one = false;
  switch (cfg.name) {
    case OptimizerName::Sgd:
      kind_ = OptimizerStep::Kind::Sgd;
      one = cfg.momentum != 0.0;
      break;
    case OptimizerName::Adam:
      kind_ = OptimizerStep::Kind::Adam;
      one = two = true;
      break;
    case OptimizerName::AdamW:
      kind_ = OptimizerStep::Kind::AdamW;
      one = two = true;
      break;
  }
  const size_t bytes = static_cast<size_t>(n_) * sizeof(float);
  if (one && n_ > 0) {
    buf1_ = backend.alloc(bytes, cfg.name == OptimizerName::Sgd ? "optimizer momentum" : "optimizer state m");
    state1_ = buf1_.view(DType::F32, Shape{n_});
    backend.fill(state1_, 0.0f);
  }
  if (two && n_ > 0) {
    buf2_ = backend.alloc(bytes, "optimizer state v");
    state2_ = buf2_.view(DType::F32, Shape{n_});
    backend.fill(state2_, 0.0f);
  }
}

OptimizerStep Optimizer::step_params(double lr, int64_t t) const {
  OptimizerStep s;
  s.kind = kind_;
  s.lr = static_cast<float>(lr);
  s.momentum = static_cast<float>(cfg_.momentum);
  s.nesterov = cfg_.nesterov;
  s.beta1 = static_cast<float>(cfg_.beta1);
  s.beta2 = static_cast<float>(cfg_.beta2);
  s.epsilon = static_cast<float>(cfg_.epsilon);
  s.weight_decay = static_cast<float>(cfg_.weight_decay);
  s.t = t;
  return s;
}

void Optimizer::step(const Tensor& master, const Tensor& grads, const Tensor& compute_copy, double lr) {
  backend_.optimizer_step(step_params(lr, applied_ + 1), master, grads, state1_, state2_, compute_copy);
  ++applied_;
}

void Optimizer::step_on_device(const Tensor& master, const Tensor& grads, const Tensor& compute_copy,
                               const Tensor& step_state, const Tensor& lr) {
  backend_.optimizer_step_state(step_params(0.0, 1), master, grads, state1_, state2_, compute_copy, step_state, lr);
}

std::vector<float> Optimizer::download_state1() const {
  if (state1_.empty()) return {};
  std::vector<float> v(static_cast<size_t>(state1_.numel()));
  backend_.download(v.data(), state1_);
  return v;
}

std::vector<float> Optimizer::download_state2() const {
  if (state2_.empty()) return {};
  std::vector<float> v(static_cast<size_t>(state2_.numel()));
  backend_.download(v.data(), state2_);
  return v;
}

void Optimizer::upload_state(const std::vector<float>& s1, const std::vector<float>& s2) {
  const size_t n1 = state1_.empty() ? 0 : static_cast<size_t>(state1_.numel());
  const size_t n2 = state2_.empty() ? 0 : static_cast<size_t>(state2_.numel());
  if (s1.size() != n1 || s2.size() != n2)
    throw ConfigError("the checkpoint's optimizer state (" + std::to_string(s1.size()) + " + " +
                      std::to_string(s2.size()) + " values) does not fit optimizer '" +
                      std::string(enum_name(cfg_.name)) + "' (" + std::to_string(n1) + " + " + std::to_string(n2) +
                      ")");
  if (n1) backend_.upload(state1_, s1.data());
  if (n2) backend_.upload(state2_, s2.data());
}

}  // namespace mpx
