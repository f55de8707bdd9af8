// SPDX-License-Identifier: MIT
// The Layer interface of the Model and the context its layers share (backend,
// arenas, planned buffers, the step's settings). Internal to lib/nn: code
// outside the module uses nn/model.h only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/tensor.h"
#include "nn/model.h"

namespace mpx::nn {

/// How a parameter is initialized (Keras defaults).
/// Dirac (conv2d kernels [K, R, S, C] only): Glorot, then filters k < min(K, C) become the
/// identity on channel k (1 at tap (R / 2, S / 2), 0 elsewhere), as PyTorch's dirac_ on them.
enum class Init : uint8_t { Glorot, Zeros, Ones, Dirac };

/// A buffer planned for max_batch rows of a per-sample shape; at(n) is the view of
/// the first n rows (a partial batch uses the same memory).
struct Planned {
  Buffer buf;
  DType dtype = DType::F32;
  Shape per_sample;
  Tensor at(int64_t n) const;
  bool empty() const { return buf.data() == nullptr; }
};

/// Every parameter starts at a multiple of this many elements in every arena: 256 bytes
/// of the 16-bit compute copy (512 of the float32 ones), so cuDNN and cuBLASLt see
/// aligned operands (Tensor Core kernels refuse 2-byte-aligned ones). The gaps are
/// zeros that no layer reads or writes (docs/design.md "Parameter arenas").
inline constexpr int64_t kParamAlign = 128;
inline int64_t align_param(int64_t n) { return (n + kParamAlign - 1) / kParamAlign * kParamAlign; }

/// Shared by every layer of one model.
struct Context {
  Backend* be = nullptr;
  Policy policy = Policy::Float32;
  int64_t max_batch = 0;
  DType half = DType::F32;  // the model's 16-bit compute type, F32 while none seen
  std::string half_layer;   // the layer that fixed `half` (for the mixing error)

  // Parameters: ParamInfo (public) + how to initialize each one.
  std::vector<ParamInfo> params;
  std::vector<Init> inits;
  std::vector<int64_t> fan_in, fan_out;
  int64_t n_params = 0, n_state = 0;  // arena lengths (parameters + alignment gaps)
  Tensor master, grads, compute_copy, state;  // views of the arenas (set after planning)

  // Shared scratch for weight gradients of 16-bit layers (dw and db, compute dtype).
  int64_t wgrad_scratch_numel = 0;
  Buffer wgrad_scratch;

  // Model::set_grad_ready_hook: told (offset, count) of a layer's gradient range as soon as
  // its backward has written it (grads_ready()); empty = no hook (the default).
  std::function<void(int64_t, int64_t)> grad_ready_hook;

  // Accounting (MemoryReport).
  size_t activation_bytes = 0, workspace_bytes = 0;
  /// Plan only (`mpx validate`): buffers are counted but not allocated; such a model never runs.
  bool plan_only = false;
  /// A buffer of `bytes` on the backend, or an unallocated one of that size under plan_only.
  Buffer alloc(size_t bytes, const char* what) const;

  // The step's settings.
  bool training = false;
  /// Every layer's output is read after the step (inspect, debug.check_numerics): no fusion may
  /// leave one unwritten (Model::keep_layer_outputs).
  bool keep_outputs = false;
  uint64_t dropout_seed = 0, step = 0;
  int next_layer_index = 0;

  /// Allocates [max_batch, per_sample...] of `t`; `kept` says whether backward needs it.
  Planned plan(DType t, Shape per_sample, const std::string& what, bool kept);
  /// Allocates a buffer of `numel` elements without a batch dimension.
  Planned plan_flat(DType t, int64_t numel, const std::string& what, bool kept);
  /// Registers a parameter with its layout in the weights files; returns its index in `params`.
  int add_param(const std::string& layer, const std::string& name, Shape shape, bool trainable, Init init,
                ParamExport export_as, int64_t fan_in = 0, int64_t fan_out = 0);
  /// The weights a layer of compute dtype `t` reads: the 16-bit copy or the float32 master.
  Tensor weight(int id, DType t) const;
  /// The float32 master / gradient / state view of a parameter.
  Tensor master_of(int id) const;
  Tensor grad_of(int id) const;
  Tensor state_of(int id) const;
  /// A view of the 16-bit weight-gradient scratch at element `offset`.
  Tensor scratch(DType t, int64_t offset, Shape s) const;
  /// Room for a 16-bit dw of `dw_numel` and, after it at an aligned offset, db.
  void need_scratch(int64_t dw_numel, int64_t db_numel) {
    wgrad_scratch_numel = std::max(wgrad_scratch_numel, align_param(dw_numel) + db_numel);
  }
  /// Records that a layer computes in `t`; throws when float16 and bfloat16 mix.
  void note_dtype(DType t, const LayerConfig& cfg);
};

/// @brief The activation of a conv2d/dense layer, fused into its forward op, and what its
/// backward needs: the pre-activation (kept) when backward_reads() is Input, else the
/// layer's own output; and a buffer for the gradient before the activation.
struct FusedActivation {
  Activation act;
  Planned pre, dz;
  /// Set at plan time when the next layer computes this relu's gradient along with its own
  /// (Layer::fuse_input_relu); backward then returns dy unchanged.
  bool backward_by_next = false;
  /// Sets backward_by_next and releases the gradient buffer it no longer needs.
  void hand_backward_to_next(Context& c);
  /// Whether the layer's output is a relu's output (relu exactly, not leaky_relu).
  bool is_relu() const { return act == Activation::Relu; }
  /// Parses cfg's activation and plans the buffers for outputs of per-sample shape `out`.
  void plan(Context& c, const LayerConfig& cfg, bool is_last, DType t, Shape out);
  /// Where the forward op writes the pre-activation (empty when backward does not read it
  /// or when not training).
  Tensor pre_at(const Context& c, int64_t n) const { return pre.empty() || !c.training ? Tensor() : pre.at(n); }
  /// The gradient before the activation, from dy and the layer's output y (dy itself when
  /// there is no activation).
  Tensor backward(Context& c, const Tensor& y, const Tensor& dy) const;
};

/// "layer 'conv2d_1' (conv2d) at model.layers[3], line 7"
std::string where(const LayerConfig& cfg);
/// Per-sample shape with a batch dimension in front.
Shape with_batch(int64_t n, const Shape& per_sample);

/// @brief One layer. Inputs arrive in input_dtype(): the layer's compute dtype (the
/// Sequence casts), or a 16-bit dtype that the layer reads as it is (reads_input_as);
/// outputs leave in the compute dtype; backward takes dy in it and returns dx in
/// input_dtype().
class Layer {
 public:
  Layer(const LayerConfig& cfg, DType dtype, Shape in_shape, int depth, int index)
      : cfg_(cfg), dtype_(dtype), in_dtype_(dtype), in_shape_(in_shape), depth_(depth), index_(index) {}
  virtual ~Layer() = default;

  const std::string& name() const { return cfg_.name; }
  LayerType type() const { return cfg_.type; }
  const LayerConfig& cfg() const { return cfg_; }
  DType dtype() const { return dtype_; }
  /// The dtype the input arrives in and the input gradient leaves in.
  DType input_dtype() const { return in_dtype_; }
  /// Whether the layer can take its input in `t` (not its compute dtype) as it is and return
  /// its input gradient in `t`, doing the Sequence's two casts inside its ops.
  virtual bool reads_input_as(DType /*t*/) const { return false; }
  /// Makes input_dtype() `t` (before plan_dx; only where reads_input_as(t)).
  void set_input_dtype(DType t) { in_dtype_ = t; }
  Shape in_shape() const { return in_shape_; }
  Shape out_shape() const { return out_shape_; }
  int depth() const { return depth_; }

  /// x: [n, in_shape] in dtype(); returns [n, out_shape] in dtype().
  virtual Tensor forward(Context& c, const Tensor& x) = 0;
  /// dy: [n, out_shape] in dtype(). Writes the weight gradients into the arena and,
  /// when need_dx, returns dx [n, in_shape] in dtype() (else an empty tensor).
  virtual Tensor backward(Context& c, const Tensor& dy, bool need_dx) = 0;
  /// Allocates the input-gradient buffer (normally at build; lazily for the first layer).
  virtual void plan_dx(Context& c);

  // The forward in pieces of the batch, decided by the Sequence (docs/cpu-performance.md,
  // "Pieces of the batch"): the layers that feed a layer that asks for pieces (a dense layer, a
  // max pooling) and that layer run piece after piece, so that it reads its input from the cache.
  /// Whether the layer may run in pieces before the layer that asks for them: a per-sample
  /// forward whose output row depends on its input row alone, bit for bit (as a partial batch
  /// run on a row slice already needs), and that costs no more per row in pieces (the backend
  /// says for convolutions: Backend::conv2d_forward_in_pieces).
  virtual bool forwards_by_rows(const Context& /*c*/) const { return false; }
  /// The forward of rows [begin, begin + x.shape[0]) of a batch of n (x holds those rows),
  /// written into the layer's whole-batch buffers; returns those rows of the output.
  virtual Tensor forward_rows(Context& c, const Tensor& x, int64_t begin, int64_t n);
  /// After the last piece, for the whole batch's input x: what forward(c, x) leaves for the
  /// backward pass and returns (the whole output).
  virtual Tensor forward_rows_done(const Tensor& x);
  /// Rows per piece in which the layers feeding this one should run their forward with it
  /// (Backend::dense_input_piece_rows, max_pool_input_piece_rows); 0: none. Such a layer
  /// implements forward_rows and forward_rows_done.
  virtual int64_t input_piece_rows(const Context& /*c*/) const { return 0; }

  // Plan-time fusion of a relu's backward into the next layer's backward, decided by the
  // Sequence where it connects two layers (docs/cpu-performance.md "Max pooling after relu").
  /// Whether the layer's output is a relu's output and its backward can leave that relu's
  /// gradient to the next layer.
  virtual bool ends_in_relu() const { return false; }
  /// Called on such a layer when the next layer took the relu's gradient over.
  virtual void skip_relu_backward(Context& /*c*/) {}
  /// Whether this layer computes, along with its own, the gradient of the relu whose output
  /// is its input; when it returns true it does so from then on.
  virtual bool fuse_input_relu() { return false; }
  /// Whether the layer's output is its input reshaped (flatten) and its backward returns dy
  /// reshaped: a relu's output is still one after it, so the fusion may reach across it.
  virtual bool passes_relu_through() const { return false; }

  // The backward of a layer and of the model's first convolution in one op, decided by the Sequence
  // where the layer follows the convolution or a reshape of it: a dense layer
  // (Backend::dense_conv_backward; docs/cpu-performance.md, "The first convolution's weight
  // gradient in the dense walk") or a max pooling (Backend::max_pool_conv_backward; "Max pooling's
  // backward in the first convolution's weight gradient").
  /// As that convolution: whether its relu's gradient is the next layer's (skip_relu_backward).
  virtual bool gives_conv_weight_grads() const { return false; }
  /// Calls fn(p, x, dw, db) with the convolution's window, its input of the last forward and
  /// its gradient buffers (db may be empty); only where gives_conv_weight_grads().
  virtual void conv_weight_grads(
      Context& /*c*/,
      const std::function<void(const Conv2dParams&, const Tensor&, const Tensor&, const Tensor&)>& /*fn*/) {}
  /// As that layer: whether it can take the convolution's weight gradients into its backward
  /// (it computes the relu's gradient, fuse_input_relu; a dense layer also is float32).
  virtual bool takes_conv_weight_grads() const { return false; }
  /// Its backward from dy with `conv`'s weight gradients (conv.conv_weight_grads), no input
  /// gradient kept; only where takes_conv_weight_grads().
  virtual void backward_with_conv(Context& /*c*/, const Tensor& /*dy*/, Layer& /*conv*/) {}

  // A convolution's forward (training or evaluation) in one op with the max pooling right after
  // it, decided by the Sequence (Backend::conv_max_pool_forward; docs/cpu-performance.md, "The
  // first convolution's forward with max pooling").
  /// As that convolution: its window where the next layer takes its relu's gradient, else null.
  virtual const Conv2dParams* conv_forward_window() const { return nullptr; }
  /// Calls fn(w, b, y): its weights and bias (b may be empty), its output buffer for n rows.
  virtual void conv_forward_args(Context& /*c*/, int64_t /*n*/,
                                 const std::function<void(const Tensor&, const Tensor&, const Tensor&)>& /*fn*/) {}
  /// As the max pooling: whether it takes `conv`'s forward into its own (asked at plan time).
  virtual bool takes_conv_forward(const Context& /*c*/, const Layer& /*conv*/) const { return false; }
  /// Both forwards from conv's input x; returns this layer's output, conv's left unwritten.
  virtual Tensor forward_with_conv(Context& c, const Tensor& x, Layer& conv);

  // Plan-time fusion of an activation layer into the batch norm before it, decided by the
  // Sequence (docs/cpu-performance.md, "Batch norm and the activation after it").
  /// The activation of a standalone activation layer that applies one itself (None for every
  /// other layer, and once it handed the activation to the layer before).
  virtual Activation standalone_activation() const { return {}; }
  /// Whether this layer applies, in its own forward and backward ops and from then on, the
  /// activation `a` of the layer right after it (batch norm does).
  virtual bool absorb_next_activation(Context& /*c*/, Activation /*a*/) { return false; }
  /// Called on the activation layer whose activation the layer before took over: its forward
  /// and backward then pass their tensors through, and its buffers are released.
  virtual void hand_activation_to_previous(Context& /*c*/) {}

  /// Trainable + non-trainable parameter count (nested layers included).
  virtual int64_t param_count(const Context& c) const;
  /// Summary rows: this layer, then nested ones.
  virtual void append_infos(const Context& c, std::vector<LayerInfo>& out) const;
  /// Every layer in forward execution order (nested ones before their block).
  virtual void collect(std::vector<Layer*>& out) { out.push_back(this); }
  /// Every layer in the order backward() finishes them (what grads_ready() reports).
  virtual void collect_backward(std::vector<const Layer*>& out) const { out.push_back(this); }
  /// Parameters of this layer itself (indexes into Context::params).
  const std::vector<int>& param_ids() const { return param_ids_; }

  /// The tensors of the last step, for the numerics check.
  Tensor last_out, last_dx;

 protected:
  LayerConfig cfg_;
  DType dtype_, in_dtype_;
  Shape in_shape_, out_shape_;
  int depth_, index_;
  std::vector<int> param_ids_;
  Planned dx_;
  /// Writes dw/db computed by `fn(dw, db)` into the gradient arena: directly for
  /// float32 layers, through the 16-bit scratch and a cast otherwise.
  template <typename Fn>
  void weight_grads(Context& c, int kernel_id, int bias_id, Fn fn);
};

/// @brief A layer with a kernel, an optional bias and a fused activation (conv2d,
/// depthwise_conv2d, dense): its forward and backward passes around the three backend ops
/// its subclass names. The subclass adds the kernel (it knows its shape, fans and export
/// layout), then calls add_bias and plan_output.
class KernelLayer : public Layer {
 public:
  using Layer::Layer;
  Tensor forward(Context& c, const Tensor& x) override;
  Tensor backward(Context& c, const Tensor& dy, bool need_dx) override;
  Tensor forward_rows(Context& c, const Tensor& x, int64_t begin, int64_t n) override;
  Tensor forward_rows_done(const Tensor& x) override;

 protected:
  /// The bias of `units` outputs when cfg.use_bias, and the 16-bit scratch for the
  /// kernel's `kernel_numel` weights and the bias.
  void add_bias(Context& c, int64_t units, int64_t kernel_numel);
  /// The output buffer and the fused activation's.
  void plan_output(Context& c, bool is_last);
  /// y = act(x * w + b); b may be empty.
  virtual void run_forward(Context& c, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                           const Tensor& pre) = 0;
  /// dw and db (db may be empty) from the layer's input x and the gradient g before the activation.
  virtual void run_backward_weights(Context& c, const Tensor& x, const Tensor& g, const Tensor& dw,
                                    const Tensor& db) = 0;
  /// dx from g and w.
  virtual void run_backward_data(Context& c, const Tensor& g, const Tensor& w, const Tensor& dx) = 0;
  /// Both: run_backward_weights, then run_backward_data (a subclass may do them in one op).
  virtual void run_backward(Context& c, const Tensor& x, const Tensor& g, const Tensor& w, const Tensor& dw,
                            const Tensor& db, const Tensor& dx);

  FusedActivation act_;
  int kernel_ = -1, bias_ = -1;
  Planned y_;
  Tensor x_;
};

/// The window of a convolution layer (conv2d, depthwise_conv2d) over a per-sample [H, W, C]
/// input, Keras "same"/"valid" padding: the rank, the window's and `count_key`'s
/// (filters, depth_multiplier) positivity and the output size checked, errors naming `cfg`.
Conv2dParams conv_window(const LayerConfig& cfg, Shape in, const char* count_key, int64_t count);

/// The contiguous range of the gradient arena holding layer `l`'s own trainable
/// parameters (count 0 when it has none).
GradRange grad_range(const Context& c, const Layer& l);
/// Calls c.grad_ready_hook (when set) with l's gradient range, if it has one; called by
/// whoever runs l->backward(), right after it.
void grads_ready(const Context& c, const Layer& l);

/// Keras/TF "same" padding along one axis of size H for a window R and stride s:
/// output ceil(H/s), total pad max((out-1)*s + R - H, 0), the extra one at the bottom/right.
inline void same_pad(int H, int R, int s, int& lo, int& hi) {
  const int out = (H + s - 1) / s;
  const int total = std::max((out - 1) * s + R - H, 0);
  lo = total / 2;
  hi = total - lo;
}

/// Builds one layer from its config (shape checks, parameters, buffers); its input arrives in
/// `in_dtype` (the layer reads it as it is where it can, see Layer::reads_input_as;
/// MPX_FOLD_CASTS=0 keeps the casts). `is_last` is true for the top-level layer that produces
/// the logits.
std::unique_ptr<Layer> make_layer(Context& c, const LayerConfig& cfg, Shape in_shape, DType in_dtype, DType dtype,
                                  std::optional<LayerDType> inherited_dtype, int depth, bool is_last, bool need_dx);

/// What a layer's factory builds it from: its config, its input shape, its compute dtype,
/// the `dtype:` it inherits from an enclosing block (residual), its nesting depth, and
/// whether it is the top-level layer that produces the logits.
struct LayerArgs {
  Context& c;
  const LayerConfig& cfg;
  Shape in;
  DType t;
  std::optional<LayerDType> inherited_dtype;
  int depth;
  bool is_last;
};

// The factory of every layer type (config/layer_table.inc names them; one file each).
#define MPX_LAYER(id, text, factory, shares) std::unique_ptr<Layer> factory(const LayerArgs& a);
#include "config/layer_table.inc"

/// Maps cfg.activation (core/activation.h's names, with cfg.negative_slope for leaky_relu) to
/// the activation; softmax is the identity here (fused into the loss); throws for softmax
/// unless is_last.
Activation parse_activation(const LayerConfig& cfg, bool is_last);

// ---- template ----------------------------------------------------------------

template <typename Fn>
void Layer::weight_grads(Context& c, int kernel_id, int bias_id, Fn fn) {
  const Tensor dw = c.grad_of(kernel_id);
  const Tensor db = bias_id >= 0 ? c.grad_of(bias_id) : Tensor();
  if (dtype_ == DType::F32) {
    fn(dw, db);
    return;
  }
  const Tensor dw16 = c.scratch(dtype_, 0, dw.shape);
  const Tensor db16 = bias_id >= 0 ? c.scratch(dtype_, align_param(dw.numel()), db.shape) : Tensor();
  fn(dw16, db16);
  c.be->cast(dw16, dw);
  if (bias_id >= 0) c.be->cast(db16, db);
}

}  // namespace mpx::nn
