// SPDX-License-Identifier: MIT
// The shared plumbing of the layers: the Context (planned buffers, parameter
// registration, arena views), the Sequence that runs layers with dtype casts
// between them, and make_layer(), the one place that knows every layer type.
#include <fmt/format.h>

#include <algorithm>

#include "core/env.h"
#include "core/error.h"
#include "nn/sequence.h"

namespace mpx::nn {

// ---- helpers -------------------------------------------------------------------

std::string where(const LayerConfig& cfg) {
  std::string s = fmt::format("layer '{}' ({})", cfg.name, cfg.type);
  if (!cfg.key_path.empty()) s += " at " + cfg.key_path;
  if (cfg.line > 0) s += fmt::format(", line {}", cfg.line);
  return s;
}

Shape with_batch(int64_t n, const Shape& per_sample) {
  Shape s;
  s.rank = per_sample.rank + 1;
  MPX_CHECK(s.rank <= Shape::kMaxRank);
  s[0] = n;
  for (int i = 0; i < per_sample.rank; ++i) s[i + 1] = per_sample[i];
  return s;
}

Tensor Planned::at(int64_t n) const {
  return Tensor(buf.data(), dtype, with_batch(n, per_sample));
}

Activation parse_activation(const LayerConfig& cfg, bool is_last) {
  if (cfg.type == LayerType::Dense && cfg.output_scale != 1.0) {
    // output_scale: logits multiplied by a constant, an activation of its own (docs/fast-cifar.md).
    if (cfg.activation != ActivationName::Linear && cfg.activation != ActivationName::Softmax)
      throw ConfigError(fmt::format("{}: output_scale needs activation linear or softmax, not {}; put the "
                                    "activation in a layer of its own",
                                    where(cfg), enum_name(cfg.activation)));
    if (cfg.activation == ActivationName::Softmax && !is_last)
      throw ConfigError(where(cfg) + ": activation softmax is only allowed on the last layer of the model");
    return Activation{ActKind::Scale, static_cast<float>(cfg.output_scale)};
  }
  if (cfg.activation == ActivationName::Softmax) {
    if (!is_last)
      throw ConfigError(where(cfg) +
                        ": activation softmax is only allowed on the last layer of the model (it is fused into "
                        "the float32 loss); use relu or linear here");
    return Activation::None;
  }
  // Every other name is core/activation.h's (the config enum is made from its list).
  const std::optional<ActKind> kind = activation_kind(enum_name(cfg.activation));
  if (!kind) throw ConfigError(fmt::format("{}: activation {} has no kernel", where(cfg), enum_name(cfg.activation)));
  return Activation{*kind, *kind == ActKind::LeakyRelu ? static_cast<float>(cfg.negative_slope) : 0.0f};
}

void FusedActivation::plan(Context& c, const LayerConfig& cfg, bool is_last, DType t, Shape out) {
  act = parse_activation(cfg, is_last);
  if (act.is_none()) return;
  if (act.backward_reads() == ActSaved::Input) pre = c.plan(t, out, cfg.name + " pre-activation", true);
  dz = c.plan(t, out, cfg.name + " " + activation_name(act.kind) + " gradient", false);
}

Tensor FusedActivation::backward(Context& c, const Tensor& y, const Tensor& dy) const {
  if (act.is_none() || backward_by_next) return dy;
  const int64_t n = dy.shape[0];
  const Tensor g = dz.at(n);
  c.be->activation_backward(act, act.backward_reads() == ActSaved::Input ? pre.at(n) : y, dy, g);
  return g;
}

void FusedActivation::hand_backward_to_next(Context& c) {
  backward_by_next = true;
  c.workspace_bytes -= dz.buf.bytes();
  dz = Planned();
}

// ---- Context -------------------------------------------------------------------

Buffer Context::alloc(size_t bytes, const char* what) const {
  if (plan_only) return Buffer(nullptr, nullptr, bytes);  // counted, never touched
  return be->alloc(bytes, what);
}

Planned Context::plan(DType t, Shape per_sample, const std::string& what, bool kept) {
  Planned p;
  p.dtype = t;
  p.per_sample = per_sample;
  const size_t bytes = static_cast<size_t>(max_batch * per_sample.numel()) * dtype_size(t);
  p.buf = alloc(bytes, what.c_str());
  (kept ? activation_bytes : workspace_bytes) += bytes;
  return p;
}

Planned Context::plan_flat(DType t, int64_t numel, const std::string& what, bool kept) {
  Planned p;
  p.dtype = t;
  p.per_sample = Shape{numel};
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(t);
  p.buf = alloc(bytes, what.c_str());
  (kept ? activation_bytes : workspace_bytes) += bytes;
  return p;
}

int Context::add_param(const std::string& layer, const std::string& name, Shape shape, bool trainable, Init init,
                       ParamExport export_as, int64_t fi, int64_t fo) {
  ParamInfo p;
  p.layer = layer;
  p.name = name;
  p.shape = shape;
  p.trainable = trainable;
  p.layout = export_as.layout;
  p.keras_axes = export_as.keras;
  p.torch_axes = export_as.torch;
  p.torch_name = export_as.torch_name ? export_as.torch_name : name;
  int64_t& end = trainable ? n_params : n_state;
  p.offset = align_param(end);
  end = p.offset + shape.numel();
  params.push_back(p);
  inits.push_back(init);
  fan_in.push_back(fi);
  fan_out.push_back(fo);
  return static_cast<int>(params.size()) - 1;
}

Tensor Context::weight(int id, DType t) const {
  const ParamInfo& p = params[static_cast<size_t>(id)];
  MPX_CHECK(p.trainable);
  if (t == DType::F32) return master.flat_view(p.offset, p.shape);
  MPX_CHECK(!compute_copy.empty() && compute_copy.dtype == t);
  return compute_copy.flat_view(p.offset, p.shape);
}

Tensor Context::master_of(int id) const {
  const ParamInfo& p = params[static_cast<size_t>(id)];
  MPX_CHECK(p.trainable);
  return master.flat_view(p.offset, p.shape);
}

Tensor Context::grad_of(int id) const {
  const ParamInfo& p = params[static_cast<size_t>(id)];
  MPX_CHECK(p.trainable);
  return grads.flat_view(p.offset, p.shape);
}

Tensor Context::state_of(int id) const {
  const ParamInfo& p = params[static_cast<size_t>(id)];
  MPX_CHECK(!p.trainable);
  return state.flat_view(p.offset, p.shape);
}

Tensor Context::scratch(DType t, int64_t offset, Shape s) const {
  MPX_CHECK(offset + s.numel() <= wgrad_scratch_numel);
  return Tensor(static_cast<char*>(wgrad_scratch.data()) + static_cast<size_t>(offset) * dtype_size(t), t, s);
}

void Context::note_dtype(DType t, const LayerConfig& cfg) {
  if (!is_16bit(t)) return;
  if (half == DType::F32) {
    half = t;
    half_layer = cfg.name;
    return;
  }
  if (half != t)
    throw ConfigError(fmt::format(
        "{} computes in {} but layer '{}' computes in {}: a model may not mix float16 and bfloat16 (use one "
        "16-bit type, or float32 for some layers)",
        where(cfg), dtype_name(t), half_layer, dtype_name(half)));
}

// ---- gradient-ready ranges (Model::set_grad_ready_hook) ---------------------------

GradRange grad_range(const Context& c, const Layer& l) {
  int64_t lo = 0, hi = 0, sum = 0;
  for (int id : l.param_ids()) {
    const ParamInfo& p = c.params[static_cast<size_t>(id)];
    if (!p.trainable) continue;
    const int64_t n = p.shape.numel();
    if (sum == 0) {
      lo = p.offset;
      hi = p.offset + n;
    } else {
      lo = std::min(lo, p.offset);
      hi = std::max(hi, p.offset + n);
    }
    sum += n;
  }
  // A layer registers its parameters one after the other, so they are adjacent in the arena
  // but for the alignment gaps; the range runs to the next aligned offset, where the next
  // layer's parameters start, so the ranges of all layers cover the arena.
  int64_t footprint = 0;
  for (int id : l.param_ids()) {
    const ParamInfo& p = c.params[static_cast<size_t>(id)];
    if (p.trainable) footprint += align_param(p.shape.numel());
  }
  MPX_CHECK_MSG(align_param(hi) - lo == footprint,
                fmt::format("layer '{}': its trainable parameters are not contiguous in the gradient arena", l.name()));
  if (sum == 0) return GradRange{};
  return GradRange{lo, align_param(hi) - lo};
}

void grads_ready(const Context& c, const Layer& l) {
  if (!c.grad_ready_hook) return;
  const GradRange r = grad_range(c, l);
  if (r.count > 0) c.grad_ready_hook(r.offset, r.count);
}

// ---- Layer defaults ------------------------------------------------------------

void Layer::plan_dx(Context& c) {
  if (dx_.empty()) dx_ = c.plan(in_dtype_, in_shape_, name() + " input gradient", false);
}

int64_t Layer::param_count(const Context& c) const {
  int64_t n = 0;
  for (int id : param_ids_) n += c.params[static_cast<size_t>(id)].shape.numel();
  return n;
}

void Layer::append_infos(const Context& c, std::vector<LayerInfo>& out) const {
  LayerInfo i;
  i.name = name();
  i.type = type();
  i.input_shape = in_shape_;
  i.output_shape = out_shape_;
  i.params = param_count(c);
  i.compute_dtype = dtype_;
  i.variable_dtype = DType::F32;
  i.depth = depth_;
  out.push_back(i);
}

// ---- Sequence ------------------------------------------------------------------

void Sequence::build(Context& c, const std::vector<LayerConfig>& cfgs, Shape in_shape, DType in_dtype,
                     std::optional<LayerDType> inherited_dtype, int depth, bool last_of_model, bool first_of_model) {
  in_shape_ = out_shape_ = in_shape;
  in_dtype_ = out_dtype_ = in_dtype;
  for (size_t i = 0; i < cfgs.size(); ++i) {
    LayerConfig cfg = cfgs[i];
    if (cfg.name.empty()) cfg.name = fmt::format("{}_{}", cfg.type, c.next_layer_index);
    DType t;
    try {
      t = compute_dtype_for(c.policy, cfg.dtype ? cfg.dtype : inherited_dtype);
    } catch (const ConfigError& e) {
      throw ConfigError(where(cfg) + ": " + e.what());
    }
    c.note_dtype(t, cfg);
    const bool is_last = last_of_model && i + 1 == cfgs.size();
    const bool need_dx = !(first_of_model && i == 0);
    auto layer = make_layer(c, cfg, out_shape_, out_dtype_, t, cfg.dtype ? cfg.dtype : inherited_dtype, depth, is_last,
                            need_dx);
    add_step(c, std::move(layer), out_dtype_, need_dx);
  }
}

void Sequence::append(Context& c, std::unique_ptr<Layer> layer, DType in_dtype, bool need_dx) {
  if (steps_.empty()) in_dtype_ = out_dtype_ = in_dtype;
  add_step(c, std::move(layer), in_dtype, need_dx);
}

void Sequence::add_step(Context& c, std::unique_ptr<Layer> layer, DType in_dtype, bool need_dx) {
  fuse_ = env_flag("MPX_CPU_FUSE", true);  // every plan-time fusion below and in plan_pieces
  Step s;
  s.in_dtype = in_dtype;
  if (in_dtype != layer->input_dtype()) {
    s.in_cast = c.plan(layer->dtype(), layer->in_shape(), layer->name() + " input cast", true);
    if (need_dx) s.dx_cast = c.plan(in_dtype, layer->in_shape(), layer->name() + " input gradient cast", false);
  }
  // A relu's backward fused into the next layer's (docs/cpu-performance.md "Max pooling after
  // relu", "Relu before a dense layer"): only when the next layer reads the relu's output
  // tensor itself (no cast between them, only reshapes such as flatten; a float32 dense layer
  // that reads a 16-bit input as it is qualifies) and returns an input gradient;
  // MPX_CPU_FUSE=0 turns it off.
  if (need_dx && in_dtype == layer->input_dtype() && fuse_) {
    Layer* relu = nullptr;
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
      if (it->layer->dtype() != in_dtype) break;
      if (!it->layer->passes_relu_through()) {
        relu = it->layer.get();
        break;
      }
      if (it->in_dtype != in_dtype) break;  // a cast before the reshape
    }
    if (relu && relu->ends_in_relu() && layer->fuse_input_relu()) relu->skip_relu_backward(c);
  }
  // An activation layer whose backward reads its input, right after a batch norm of the same
  // dtype with no cast between them: the batch norm applies it in its own ops, so its input
  // is never stored (docs/cpu-performance.md, "Batch norm and the activation after it");
  // MPX_CPU_FUSE=0 turns it off too.
  if (!steps_.empty() && in_dtype == layer->input_dtype() && fuse_) {
    const Activation a = layer->standalone_activation();
    Layer* prev = steps_.back().layer.get();
    if (!a.is_none() && a.backward_reads() == ActSaved::Input && prev->dtype() == in_dtype &&
        prev->absorb_next_activation(c, a))
      layer->hand_activation_to_previous(c);
  }
  out_shape_ = layer->out_shape();
  out_dtype_ = layer->dtype();
  s.layer = std::move(layer);
  steps_.push_back(std::move(s));
  plan_pieces(c);
  plan_conv_pool(c);
}

void Sequence::enable_input_grad(Context& c) {
  if (steps_.empty()) return;
  Step& s = steps_.front();
  s.layer->plan_dx(c);
  if (s.in_dtype != s.layer->input_dtype() && s.dx_cast.empty())
    s.dx_cast = c.plan(s.in_dtype, s.layer->in_shape(), s.layer->name() + " input gradient cast", false);
}

Tensor Sequence::forward(Context& c, const Tensor& x) {
  const int64_t n = x.shape[0];
  Tensor h = x;
  auto run = pieces_.begin();
  auto conv_pool = conv_pool_.begin();
  const bool fused_fwd = !c.keep_outputs;  // the convolution's output is not read
  for (size_t i = 0; i < steps_.size(); ++i) {
    Step& s = steps_[i];
    if (!s.in_cast.empty()) {
      const Tensor t = s.in_cast.at(n);
      c.be->cast(h, t);
      h = t;
    }
    if (conv_pool != conv_pool_.end() && *conv_pool == i) {
      ++conv_pool;
      if (fused_fwd) {
        // The convolution and the pooling in one op; a run of pieces from the convolution is left,
        // and the steps after the pooling in it run on the whole batch.
        h = steps_[i + 1].layer->forward_with_conv(c, h, *s.layer);
        s.layer->last_out = Tensor();  // never written
        steps_[i + 1].layer->last_out = h;
        while (run != pieces_.end() && run->first <= i + 1) ++run;
        ++i;
        continue;
      }
    }
    if (run != pieces_.end() && run->first == i && n > run->rows) {
      h = forward_in_pieces(c, *run, h);
      i = run->last;
      ++run;
      continue;
    }
    if (run != pieces_.end() && run->last == i) ++run;
    h = s.layer->forward(c, h);
    s.layer->last_out = h;
  }
  return h;
}

Tensor Sequence::backward(Context& c, const Tensor& dy, bool need_dx) {
  const int64_t n = dy.shape[0];
  const size_t first = need_dx ? 0 : std::min(first_backward_, steps_.size());
  Tensor g = dy;
  for (size_t i = steps_.size(); i-- > first;) {
    Step& s = steps_[i];
    if (!need_dx && i > first && i == conv_grads_taker(first)) {
      // The layer, any reshape and the first convolution in one op: no input gradient is kept;
      // their hooks are called in the order the steps' own backward would call them.
      s.layer->backward_with_conv(c, g, *steps_[first].layer);
      for (size_t j = i + 1; j-- > first;) {
        grads_ready(c, *steps_[j].layer);
        steps_[j].layer->last_dx = Tensor();
      }
      break;
    }
    const bool nd = need_dx || i > first;
    g = s.layer->backward(c, g, nd);
    grads_ready(c, *s.layer);
    s.layer->last_dx = g;
    if (!nd) break;
    if (s.in_dtype != s.layer->input_dtype()) {
      const Tensor t = s.dx_cast.at(n);
      c.be->cast(g, t);
      g = t;
    }
  }
  if (need_dx) return g;
  // Steps before `first` have no parameter the optimizer updates, so no gradient is carried to
  // them (docs/fast-cifar.md, "Parameter groups"): their parameters' gradients are zeros, and
  // their hooks are called in the order a full backward() would call them.
  for (size_t i = first; i-- > 0;) {
    std::vector<const Layer*> layers;
    steps_[i].layer->collect_backward(layers);
    for (const Layer* l : layers) {
      for (int id : l->param_ids())
        if (c.params[static_cast<size_t>(id)].trainable) c.be->fill(c.grad_of(id), 0.0f);
      grads_ready(c, *l);
    }
    std::vector<Layer*> all;
    steps_[i].layer->collect(all);
    for (Layer* l : all) l->last_dx = Tensor();
  }
  return Tensor();
}

int64_t Sequence::param_count(const Context& c) const {
  int64_t n = 0;
  for (const Step& s : steps_) n += s.layer->param_count(c);
  return n;
}

void Sequence::append_infos(const Context& c, std::vector<LayerInfo>& out) const {
  for (const Step& s : steps_) s.layer->append_infos(c, out);
}

void Sequence::collect(std::vector<Layer*>& out) {
  for (Step& s : steps_) s.layer->collect(out);
}

void Sequence::collect_backward(std::vector<const Layer*>& out) const {
  for (size_t i = steps_.size(); i-- > 0;) steps_[i].layer->collect_backward(out);
}

// ---- make_layer ------------------------------------------------------------------

std::unique_ptr<Layer> make_layer(Context& c, const LayerConfig& cfg, Shape in, DType in_dtype, DType t,
                                  std::optional<LayerDType> inherited_dtype, int depth, bool is_last, bool need_dx) {
  std::unique_ptr<Layer> l;
  if (!(layer_shares(cfg.type) & kActivation)) parse_activation(cfg, is_last);  // defaults: linear
  const LayerArgs args{c, cfg, in, t, inherited_dtype, depth, is_last};
  switch (cfg.type) {
#define MPX_LAYER(id, text, factory, shares) \
  case LayerType::id:                        \
    l = factory(args);                       \
    break;
#include "config/layer_table.inc"
  }
  if (!l) throw ConfigError(fmt::format("{}: unknown layer type {}", where(cfg), static_cast<int>(cfg.type)));
  // The input cast folded into the layer's ops (docs/cpu-performance.md, "Dense layers with few outputs").
  if (in_dtype != t && l->reads_input_as(in_dtype) && env_flag("MPX_FOLD_CASTS", true)) l->set_input_dtype(in_dtype);
  if (need_dx) l->plan_dx(c);
  return l;
}

}  // namespace mpx::nn
