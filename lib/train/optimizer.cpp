// SPDX-License-Identifier: MIT
// Optimizer: state arenas and the fused update.
#include "train/optimizer.h"

#include "core/error.h"

namespace mpx {

namespace {
// The fused update of `cfg` (core/optimizer_kind.h lists the same names as the config).
const OptimizerInfo& info_of(const OptimizerConfig& cfg) {
  const OptimizerInfo* k = find_optimizer(enum_name(cfg.name));
  if (!k)
    throw Error(std::string("optimizer '") + enum_name(cfg.name) + "' has no fused update (core/optimizer_kind.h)");
  return *k;
}
}  // namespace

int Optimizer::num_arenas(const OptimizerConfig& cfg) { return info_of(cfg).num_arenas(); }

Optimizer::Optimizer(const OptimizerConfig& cfg, Backend& backend, int64_t num_params)
    : cfg_(cfg), backend_(backend), n_(num_params) {
  const OptimizerInfo& k = info_of(cfg);
  kind_ = k.kind;
  const bool keeps = state_bytes_for(cfg, 1) > 0;
  states_.resize(static_cast<size_t>(k.num_arenas()));
  bufs_.resize(states_.size());
  for (size_t i = 0; i < states_.size(); ++i) {
    if (!keeps || n_ == 0) continue;
    const std::string what = std::string("optimizer state ") + k.arenas[i];
    bufs_[i] = backend.alloc(static_cast<size_t>(n_) * sizeof(float), what.c_str());
    states_[i] = bufs_[i].view(DType::F32, Shape{n_});
    backend.fill(states_[i], 0.0f);
  }
}

size_t Optimizer::state_bytes_for(const OptimizerConfig& cfg, int64_t num_params) {
  if (cfg.name == OptimizerName::Sgd && cfg.momentum == 0.0) return 0;  // plain SGD keeps no state
  return static_cast<size_t>(num_arenas(cfg)) * static_cast<size_t>(num_params) * sizeof(float);
}

size_t Optimizer::state_bytes() const {
  size_t b = 0;
  for (const Tensor& t : states_) b += t.empty() ? 0 : t.bytes();
  return b;
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
  backend_.optimizer_step(step_params(lr, applied_ + 1), master, grads, states_, compute_copy);
  ++applied_;
}

void Optimizer::step_on_device(const Tensor& master, const Tensor& grads, const Tensor& compute_copy,
                               const Tensor& step_state, const Tensor& lr) {
  backend_.optimizer_step_state(step_params(0.0, 1), master, grads, states_, compute_copy, step_state, lr);
}

std::vector<std::vector<float>> Optimizer::download_states() const {
  std::vector<std::vector<float>> out(states_.size());
  for (size_t i = 0; i < states_.size(); ++i) {
    if (states_[i].empty()) continue;
    out[i].resize(static_cast<size_t>(states_[i].numel()));
    backend_.download(out[i].data(), states_[i]);
  }
  return out;
}

void Optimizer::upload_states(const std::vector<std::vector<float>>& s) {
  auto sizes = [](const std::vector<size_t>& v) {
    std::string t;
    for (size_t i = 0; i < v.size(); ++i) t += (i ? " + " : "") + std::to_string(v[i]);
    return t.empty() ? std::string("none") : t;
  };
  std::vector<size_t> want, got;
  for (const Tensor& t : states_) want.push_back(t.empty() ? 0 : static_cast<size_t>(t.numel()));
  for (const auto& v : s) got.push_back(v.size());
  while (got.size() > want.size() && got.back() == 0) got.pop_back();  // a file with more (empty) arenas
  if (want != got)
    throw ConfigError("the checkpoint's optimizer state (" + sizes(got) + " values) does not fit optimizer '" +
                      std::string(enum_name(cfg_.name)) + "' (" + sizes(want) + ")");
  for (size_t i = 0; i < states_.size(); ++i)
    if (!states_[i].empty()) backend_.upload(states_[i], s[i].data());
}

}  // namespace mpx
