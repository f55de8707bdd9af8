// SPDX-License-Identifier: MIT
// Optimizer: state arenas and the fused update.
#include "train/optimizer.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

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

namespace {
// The value of the first rule of `rules` whose pattern matches `name`, else `fallback`.
const ParamRule* first_match(const std::vector<ParamRule>& rules, const std::string& name) {
  for (const ParamRule& r : rules)
    if (fnmatch(r.pattern.c_str(), name.c_str(), 0) == 0) return &r;
  return nullptr;
}
}  // namespace

void Optimizer::set_groups(const std::vector<ParamInfo>& params) {
  segments_.clear();
  const struct {
    const char* key;
    const std::vector<ParamRule>& rules;
  } lists[] = {{"optimizer.lr_multipliers", cfg_.lr_multipliers},
               {"optimizer.weight_decay_multipliers", cfg_.weight_decay_multipliers},
               {"optimizer.freeze_after_epochs", cfg_.freeze_after_epochs}};
  bool any = false;
  std::string names;
  for (const ParamInfo& p : params)
    if (p.trainable) names += (names.empty() ? "" : ", ") + p.layer + "/" + p.name;
  for (const auto& l : lists) {
    for (size_t i = 0; i < l.rules.size(); ++i) {
      any = true;
      const bool hit = std::any_of(params.begin(), params.end(), [&](const ParamInfo& p) {
        return p.trainable && fnmatch(l.rules[i].pattern.c_str(), (p.layer + "/" + p.name).c_str(), 0) == 0;
      });
      if (!hit)
        throw ConfigError(fmt::format("{}[{}]: \"{}\" matches no trainable parameter; they are: {}", l.key, i,
                                      l.rules[i].pattern, names));
    }
  }
  if (!any) return;
  std::vector<const ParamInfo*> order;
  for (const ParamInfo& p : params)
    if (p.trainable) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](const ParamInfo* a, const ParamInfo* b) { return a->offset < b->offset; });
  for (size_t i = 0; i < order.size(); ++i) {
    const std::string name = order[i]->layer + "/" + order[i]->name;
    Segment s;
    s.offset = i == 0 ? 0 : order[i]->offset;  // the gap before a parameter goes with the one before it
    s.count = (i + 1 < order.size() ? order[i + 1]->offset : n_) - s.offset;
    if (const ParamRule* r = first_match(cfg_.lr_multipliers, name)) s.lr_mult = static_cast<float>(r->value);
    if (const ParamRule* r = first_match(cfg_.weight_decay_multipliers, name)) s.wd_mult = static_cast<float>(r->value);
    if (const ParamRule* r = first_match(cfg_.freeze_after_epochs, name))
      s.until_epoch = static_cast<int64_t>(std::llround(r->value));
    Segment* last = segments_.empty() ? nullptr : &segments_.back();
    if (last && last->lr_mult == s.lr_mult && last->wd_mult == s.wd_mult && last->until_epoch == s.until_epoch)
      last->count += s.count;
    else if (s.count > 0)
      segments_.push_back(s);
  }
}

bool Optimizer::frozen(const Segment& s) const {
  return s.lr_mult == 0.0f || (s.until_epoch >= 0 && epoch_ >= s.until_epoch);
}

bool Optimizer::updates(int64_t offset) const {
  for (const Segment& s : segments_)
    if (offset >= s.offset && offset < s.offset + s.count) return !frozen(s);
  return true;
}

template <typename F>
void Optimizer::for_segments(const Tensor& master, const Tensor& grads, const Tensor& compute_copy, F&& f) const {
  if (segments_.empty()) {
    f(Segment{0, n_}, master, grads, states_, compute_copy);
    return;
  }
  std::vector<Tensor> st(states_.size());
  for (const Segment& s : segments_) {
    // A frozen range (multiplier 0, or past its epochs) is not touched at all: its state
    // arenas keep their values, as PyTorch's requires_grad = False.
    if (frozen(s)) continue;
    const Shape sh{s.count};
    for (size_t i = 0; i < st.size(); ++i) st[i] = states_[i].empty() ? Tensor() : states_[i].flat_view(s.offset, sh);
    f(s, master.flat_view(s.offset, sh), grads.flat_view(s.offset, sh), st,
      compute_copy.empty() ? Tensor() : compute_copy.flat_view(s.offset, sh));
  }
}

void Optimizer::step(const Tensor& master, const Tensor& grads, const Tensor& compute_copy, double lr) {
  const OptimizerStep base = step_params(lr, applied_ + 1);
  for_segments(master, grads, compute_copy,
               [&](const Segment& s, const Tensor& m, const Tensor& g, const std::vector<Tensor>& st, const Tensor& c) {
                 OptimizerStep u = base;
                 u.lr = base.lr * s.lr_mult;  // float32 products: 1 leaves the bits of the plain pass
                 u.weight_decay = base.weight_decay * s.wd_mult;
                 backend_.optimizer_step(u, m, g, st, c);
               });
  ++applied_;
}

void Optimizer::step_on_device(const Tensor& master, const Tensor& grads, const Tensor& compute_copy,
                               const Tensor& step_state, const Tensor& lr) {
  const OptimizerStep base = step_params(0.0, 1);
  for_segments(master, grads, compute_copy,
               [&](const Segment& s, const Tensor& m, const Tensor& g, const std::vector<Tensor>& st, const Tensor& c) {
                 OptimizerStep u = base;
                 u.lr_scale = s.lr_mult;
                 u.weight_decay = base.weight_decay * s.wd_mult;
                 backend_.optimizer_step_state(u, m, g, st, c, step_state, lr);
               });
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
