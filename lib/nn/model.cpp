// SPDX-License-Identifier: MIT
// Model: builds the layer Sequence from Config under a precision policy, owns
// the parameter arenas and the planned input/logits buffers, and runs the
// forward and backward passes (casting the logits to float32 at the end).
#include "nn/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"
#include "core/fnv1a.h"
#include "core/rng.h"
#include "nn/sequence.h"

namespace mpx {

struct Model::Impl {
  nn::Context c;
  nn::Sequence seq;
  int H = 0, W = 0, C = 0, classes = 0;
  Buffer master_buf, grads_buf, copy_buf, state_buf, mean_buf, std_buf;
  Tensor mean, std;
  nn::Planned input;      // normalized input in the first layer's dtype (its input cast)
  nn::Planned logits32;   // float32 logits when the last layer is 16-bit
  nn::Planned dlogits16;  // dlogits cast to the last layer's dtype
  nn::Planned input_grad32;
  bool want_input_grad = false, input_grad_ready = false;
  size_t frozen_prefix = 0;  // set_updated_params()
  Tensor last_input_grad;
  bool softmax = false, last_training = false;
  int64_t last_n = 0;
  std::vector<nn::Layer*> order;  // forward execution order, nested layers included

  /// Builds the layers and plans every buffer and arena (throws ConfigError).
  void build(const Config& cfg, Policy policy, int num_classes);

  Tensor run(const Tensor& x, bool training, uint64_t dropout_seed, uint64_t step) {
    c.training = training;
    c.dropout_seed = dropout_seed;
    c.step = step;
    last_training = training;
    last_n = x.shape[0];
    const Tensor out = seq.forward(c, x);
    if (out.dtype == DType::F32) return out;
    const Tensor l = logits32.at(last_n);
    c.be->cast(out, l);
    return l;
  }

  void check_batch(const Tensor& x, DType want, const char* what) const {
    MPX_CHECK_MSG(x.dtype == want && x.shape.rank == 4 && x.shape[1] == H && x.shape[2] == W && x.shape[3] == C &&
                      x.shape[0] >= 1 && x.shape[0] <= c.max_batch,
                  fmt::format("{}: expected {}[n, {}, {}, {}] with 1 <= n <= {}, got {}", what, dtype_name(want), H,
                              W, C, c.max_batch, x.str()));
  }
};

namespace {

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string keras_shape(const Shape& s) {
  std::string r = "(None";
  for (int i = 0; i < s.rank; ++i) r += fmt::format(", {}", s[i]);
  return r + ")";
}

}  // namespace

Model::Model(const Config& cfg, Policy policy, Backend& backend, int H, int W, int C, int num_classes,
             int64_t max_batch, bool plan_only)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (policy == Policy::Auto) throw Error("Model: policy 'auto' must be resolved before the model is built");
  if (H <= 0 || W <= 0 || C <= 0) throw ConfigError(fmt::format("model input shape [{}, {}, {}] must be positive", H, W, C));
  if (max_batch <= 0) throw ConfigError(fmt::format("batch size must be positive, got {}", max_batch));
  if (cfg.model.layers.empty()) throw ConfigError("model.layers is empty: the model needs at least one layer");
  m.H = H;
  m.W = W;
  m.C = C;
  m.classes = num_classes;
  m.c.be = &backend;
  m.c.policy = policy;
  m.c.max_batch = max_batch;
  m.c.plan_only = plan_only;

  try {
    m.build(cfg, policy, num_classes);
  } catch (const ConfigError& e) {
    // Name the file too, as every config error does.
    if (cfg.source.empty()) throw;
    throw ConfigError(cfg.source + ": " + e.what());
  }
  if (plan_only) return;  // nothing allocated, so nothing to initialize
  set_input_normalization(std::vector<double>(static_cast<size_t>(C), 0.0),
                          std::vector<double>(static_cast<size_t>(C), 1.0));
  init_params(0);
}

void Model::Impl::build(const Config& cfg, Policy policy, int num_classes) {
  Impl& m = *this;
  const int H = m.H, W = m.W, C = m.C;
  const LayerConfig& first = cfg.model.layers.front();
  DType d0;
  try {
    d0 = compute_dtype_for(policy, first.dtype);
  } catch (const ConfigError& e) {
    throw ConfigError(nn::where(first) + ": " + e.what());
  }
  m.input = m.c.plan(d0, Shape{H, W, C}, "model input", true);
  m.seq.build(m.c, cfg.model.layers, Shape{H, W, C}, d0, std::nullopt, 0, true, true);

  const nn::Layer& last = m.seq.last();
  const Shape out = m.seq.out_shape();
  if (out.rank != 1 || out[0] != num_classes)
    throw ConfigError(fmt::format(
        "{}: the last layer outputs {} per sample but the data set has {} classes; the last layer must be a "
        "dense layer with units: {} (or a layer of that flat width)",
        nn::where(last.cfg()), out.str(), num_classes, num_classes));
  m.softmax = last.cfg().activation == ActivationName::Softmax;
  if (last.dtype() != DType::F32) {
    m.logits32 = m.c.plan(DType::F32, out, "logits float32 cast", false);
    m.dlogits16 = m.c.plan(last.dtype(), out, "logits gradient cast", false);
  }

  // The arenas end at an aligned length, so the last layer's gradient range covers them.
  m.c.n_params = nn::align_param(m.c.n_params);
  m.c.n_state = nn::align_param(m.c.n_state);
  m.master_buf = m.c.alloc(static_cast<size_t>(m.c.n_params) * 4, "master weights (float32)");
  m.grads_buf = m.c.alloc(static_cast<size_t>(m.c.n_params) * 4, "weight gradients (float32)");
  m.c.master = m.master_buf.view(DType::F32, Shape{m.c.n_params});
  m.c.grads = m.grads_buf.view(DType::F32, Shape{m.c.n_params});
  if (is_16bit(m.c.half)) {
    m.copy_buf = m.c.alloc(static_cast<size_t>(m.c.n_params) * 2, "16-bit compute copy of the weights");
    m.c.compute_copy = m.copy_buf.view(m.c.half, Shape{m.c.n_params});
    if (m.c.wgrad_scratch_numel > 0) {
      m.c.wgrad_scratch = m.c.alloc(static_cast<size_t>(m.c.wgrad_scratch_numel) * 2, "16-bit weight gradient scratch");
      m.c.workspace_bytes += static_cast<size_t>(m.c.wgrad_scratch_numel) * 2;
    }
  }
  if (m.c.n_state > 0) {
    m.state_buf = m.c.alloc(static_cast<size_t>(m.c.n_state) * 4, "batch-norm moving statistics (float32)");
    m.c.state = m.state_buf.view(DType::F32, Shape{m.c.n_state});
  }
  m.mean_buf = m.c.alloc(static_cast<size_t>(C) * 4, "input normalization mean");
  m.std_buf = m.c.alloc(static_cast<size_t>(C) * 4, "input normalization std");
  m.mean = m.mean_buf.view(DType::F32, Shape{C});
  m.std = m.std_buf.view(DType::F32, Shape{C});
  m.seq.collect(m.order);
}

Model::~Model() = default;

// ---- parameters ------------------------------------------------------------------

int64_t Model::num_params() const { return impl_->c.n_params; }
int64_t Model::num_state() const { return impl_->c.n_state; }
int64_t Model::param_alignment() { return nn::kParamAlign; }
Tensor Model::master() const { return impl_->c.master; }
Tensor Model::grads() const { return impl_->c.grads; }
Tensor Model::compute_copy() const { return impl_->c.compute_copy; }
Tensor Model::state() const { return impl_->c.state; }
const std::vector<ParamInfo>& Model::params() const { return impl_->c.params; }

void Model::init_params(uint64_t seed) {
  nn::Context& c = impl_->c;
  std::vector<float> master(static_cast<size_t>(c.n_params)), state(static_cast<size_t>(c.n_state));
  for (size_t i = 0; i < c.params.size(); ++i) {
    const ParamInfo& p = c.params[i];
    float* dst = (p.trainable ? master.data() : state.data()) + p.offset;
    const int64_t n = p.shape.numel();
    switch (c.inits[i]) {
      case nn::Init::Zeros: std::fill(dst, dst + n, 0.0f); break;
      case nn::Init::Ones: std::fill(dst, dst + n, 1.0f); break;
      case nn::Init::Glorot:
      case nn::Init::Dirac: {
        // One stream per tensor, keyed by its name: adding a layer does not shift the others.
        Rng rng(mix64(seed ^ fnv1a(p.layer + "/" + p.name)));
        const double limit = std::sqrt(6.0 / static_cast<double>(c.fan_in[i] + c.fan_out[i]));
        for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<float>(rng.uniform(-limit, limit));
        if (c.inits[i] == nn::Init::Dirac) {
          MPX_CHECK_MSG(p.shape.rank == 4, "dirac initialization of " + p.layer + "/" + p.name);
          const int64_t K = p.shape[0], R = p.shape[1], S = p.shape[2], C = p.shape[3];
          for (int64_t f = 0; f < std::min(K, C); ++f) {
            float* w = dst + f * R * S * C;
            std::fill(w, w + R * S * C, 0.0f);
            w[((R / 2) * S + S / 2) * C + f] = 1.0f;
          }
        }
        break;
      }
    }
  }
  if (c.n_params > 0) c.be->upload(c.master, master.data());
  if (c.n_state > 0) c.be->upload(c.state, state.data());
  if (c.n_params > 0) c.be->fill(c.grads, 0.0f);
  refresh_compute_copy();
}

void Model::refresh_compute_copy() {
  nn::Context& c = impl_->c;
  if (!c.compute_copy.empty() && c.n_params > 0) c.be->cast(c.master, c.compute_copy);
}

void Model::set_input_normalization(const std::vector<double>& mean, const std::vector<double>& std) {
  Impl& m = *impl_;
  if (mean.size() != static_cast<size_t>(m.C) || std.size() != static_cast<size_t>(m.C))
    throw ConfigError(fmt::format("data.normalize: mean and std need {} values (one per input channel), got {} and {}",
                                  m.C, mean.size(), std.size()));
  std::vector<float> mf(mean.begin(), mean.end()), sf(std.begin(), std.end());
  for (size_t i = 0; i < sf.size(); ++i)
    if (!(sf[i] > 0.0f)) throw ConfigError(fmt::format("data.normalize.std[{}] must be > 0, got {}", i, std[i]));
  m.c.be->upload(m.mean, mf.data());
  m.c.be->upload(m.std, sf.data());
}

// ---- step ------------------------------------------------------------------------

Tensor Model::forward(const Tensor& x_u8, bool training, uint64_t dropout_seed, uint64_t step) {
  Impl& m = *impl_;
  m.check_batch(x_u8, DType::U8, "Model::forward");
  m.want_input_grad = false;
  const Tensor x = m.input.at(x_u8.shape[0]);
  m.c.be->normalize_input(x_u8, m.mean, m.std, x);
  return m.run(x, training, dropout_seed, step);
}

Tensor Model::forward_float(const Tensor& x_f32, bool training, uint64_t dropout_seed, uint64_t step) {
  Impl& m = *impl_;
  m.check_batch(x_f32, DType::F32, "Model::forward_float");
  if (!m.input_grad_ready) {
    m.seq.enable_input_grad(m.c);
    if (m.input.dtype != DType::F32)
      m.input_grad32 = m.c.plan(DType::F32, Shape{m.H, m.W, m.C}, "input gradient (float32, tests)", false);
    m.input_grad_ready = true;
  }
  m.want_input_grad = true;
  const Tensor x = m.input.at(x_f32.shape[0]);
  m.c.be->cast(x_f32, x);
  return m.run(x, training, dropout_seed, step);
}

void Model::backward(const Tensor& dlogits) {
  Impl& m = *impl_;
  MPX_CHECK_MSG(m.last_n > 0, "Model::backward before forward");
  MPX_CHECK_MSG(m.last_training, "Model::backward needs a training-mode forward");
  MPX_CHECK_MSG(dlogits.dtype == DType::F32 && dlogits.shape == Shape({m.last_n, m.classes}),
                fmt::format("Model::backward: dlogits must be float32[{}, {}], got {}", m.last_n, m.classes,
                            dlogits.str()));
  Tensor g = dlogits;
  if (!m.dlogits16.empty()) {
    g = m.dlogits16.at(m.last_n);
    m.c.be->cast(dlogits, g);
  }
  const Tensor dx = m.seq.backward(m.c, g, m.want_input_grad);
  m.last_input_grad = Tensor();
  if (m.want_input_grad) {
    if (dx.dtype == DType::F32) {
      m.last_input_grad = dx;
    } else {
      m.last_input_grad = m.input_grad32.at(m.last_n);
      m.c.be->cast(dx, m.last_input_grad);
    }
  }
}

void Model::set_updated_params(const std::function<bool(const ParamInfo&)>& updated) {
  Impl& m = *impl_;
  size_t first = 0;
  for (; first < m.seq.size(); ++first) {
    std::vector<const nn::Layer*> layers;
    m.seq.collect_step(first, layers);
    bool any = false;
    for (const nn::Layer* l : layers)
      for (int id : l->param_ids()) {
        const ParamInfo& p = m.c.params[static_cast<size_t>(id)];
        any = any || (p.trainable && updated(p));
      }
    if (any) break;
  }
  m.frozen_prefix = first;
  m.seq.set_first_backward(first);
}

size_t Model::frozen_prefix() const { return impl_->frozen_prefix; }

void Model::set_grad_ready_hook(std::function<void(int64_t offset, int64_t count)> hook) {
  impl_->c.grad_ready_hook = std::move(hook);
}

Shape Model::input_shape() const { return Shape{impl_->H, impl_->W, impl_->C}; }
std::vector<GradRange> Model::grad_ready_ranges() const {
  std::vector<const nn::Layer*> layers;
  impl_->seq.collect_backward(layers);
  std::vector<GradRange> out;
  for (const nn::Layer* l : layers) {
    const GradRange r = nn::grad_range(impl_->c, *l);
    if (r.count > 0) out.push_back(r);
  }
  return out;
}

Tensor Model::input_grad() const {
  MPX_CHECK_MSG(!impl_->last_input_grad.empty(), "Model::input_grad needs forward_float() + backward()");
  return impl_->last_input_grad;
}

// ---- numerics --------------------------------------------------------------------

void Model::keep_layer_outputs(bool keep) { impl_->c.keep_outputs = keep; }

std::string Model::first_nonfinite_forward() {
  Impl& m = *impl_;
  for (nn::Layer* l : m.order) {
    if (l->last_out.empty()) continue;
    const TensorStats s = m.c.be->stats(l->last_out);
    if (!s.all_finite())
      return fmt::format("{} ({}, {} output: {} inf, {} NaN)", l->name(), l->type(), dtype_name(l->last_out.dtype),
                         s.n_inf, s.n_nan);
  }
  return "";
}

std::string Model::first_nonfinite_backward() {
  Impl& m = *impl_;
  for (auto it = m.order.rbegin(); it != m.order.rend(); ++it) {
    nn::Layer* l = *it;
    for (int id : l->param_ids()) {
      const ParamInfo& p = m.c.params[static_cast<size_t>(id)];
      if (!p.trainable) continue;
      const TensorStats s = m.c.be->stats(m.c.grad_of(id));
      if (!s.all_finite())
        return fmt::format("{} ({}, {} gradient: {} inf, {} NaN)", l->name(), l->type(), p.name, s.n_inf, s.n_nan);
    }
    if (l->last_dx.empty()) continue;
    const TensorStats s = m.c.be->stats(l->last_dx);
    if (!s.all_finite())
      return fmt::format("{} ({}, {} input gradient: {} inf, {} NaN)", l->name(), l->type(),
                         dtype_name(l->last_dx.dtype), s.n_inf, s.n_nan);
  }
  return "";
}

std::vector<LayerTensors> Model::layer_tensors() const {
  std::vector<LayerTensors> out;
  for (const nn::Layer* l : impl_->order)
    out.push_back({l->name(), enum_name(l->type()), l->depth(), l->last_out, l->last_dx});
  return out;
}

// ---- introspection ---------------------------------------------------------------

Policy Model::policy() const { return impl_->c.policy; }
int Model::num_classes() const { return impl_->classes; }
int64_t Model::max_batch() const { return impl_->c.max_batch; }
bool Model::softmax_output() const { return impl_->softmax; }
DType Model::output_dtype() const { return impl_->seq.last().dtype(); }

std::vector<LayerInfo> Model::layer_infos() const {
  std::vector<LayerInfo> out;
  impl_->seq.append_infos(impl_->c, out);
  return out;
}

std::string Model::summary_table() const {
  const std::vector<LayerInfo> infos = layer_infos();
  std::vector<std::array<std::string, 5>> rows;
  std::array<std::string, 5> head{"Layer (type)", "Output Shape", "Param #", "Compute dtype", "Variable dtype"};
  std::array<size_t, 5> w{};
  for (size_t k = 0; k < 5; ++k) w[k] = head[k].size();
  for (const LayerInfo& i : infos) {
    std::array<std::string, 5> r{
        std::string(static_cast<size_t>(2 * i.depth), ' ') + i.name + " (" + enum_name(i.type) + ")",
        keras_shape(i.output_shape), with_commas(i.params), dtype_name(i.compute_dtype), dtype_name(i.variable_dtype)};
    for (size_t k = 0; k < 5; ++k) w[k] = std::max(w[k], r[k].size());
    rows.push_back(r);
  }
  auto line = [&](const std::array<std::string, 5>& r) {
    std::string l = fmt::format(" {:<{}}  {:<{}}  {:>{}}  {:<{}}  {}", r[0], w[0], r[1], w[1], r[2], w[2], r[3], w[3],
                                r[4]);
    return l + "\n";
  };
  const size_t width = w[0] + w[1] + w[2] + w[3] + w[4] + 9;
  std::string s = fmt::format("Model (policy {})\n", policy_name(impl_->c.policy));
  s += std::string(width, '_') + "\n" + line(head) + std::string(width, '=') + "\n";
  for (const auto& r : rows) s += line(r);
  s += std::string(width, '=') + "\n";
  int64_t tr = 0, nt = 0;  // parameters, without the arenas' alignment gaps
  for (const ParamInfo& p : impl_->c.params) (p.trainable ? tr : nt) += p.shape.numel();
  s += "Total params: " + with_commas(tr + nt) + "\n";
  s += "Trainable params: " + with_commas(tr) + "\n";
  s += "Non-trainable params: " + with_commas(nt) + "\n";
  s += std::string(width, '_') + "\n";
  return s;
}

std::vector<std::string> Model::piece_runs() const { return impl_->seq.piece_runs(!impl_->c.keep_outputs); }
std::vector<std::string> Model::conv_pool_runs() const {
  return impl_->c.keep_outputs ? std::vector<std::string>() : impl_->seq.conv_pool_runs();
}

MemoryReport Model::memory_report() const {
  const nn::Context& c = impl_->c;
  MemoryReport r;
  r.activation_bytes = c.activation_bytes;
  r.workspace_bytes = c.workspace_bytes;
  r.master_bytes = static_cast<size_t>(c.n_params) * 4;
  r.grad_bytes = static_cast<size_t>(c.n_params) * 4;
  r.compute_copy_bytes = is_16bit(c.half) ? static_cast<size_t>(c.n_params) * 2 : 0;  // also under plan_only
  r.state_bytes = static_cast<size_t>(c.n_state) * 4;
  return r;
}

}  // namespace mpx
