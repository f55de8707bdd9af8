// SPDX-License-Identifier: MIT
// The Sequence: a model's (or a residual branch's) layers run in order, with the casts between
// them and the plan-time fusions across neighbouring layers (docs/cpu-performance.md: "Pieces of
// the batch", "The first convolution's forward with max pooling", "The first convolution's
// weight gradient in the dense walk"). Internal to lib/nn, as nn/layer.h.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/layer.h"

namespace mpx::nn {

/// @brief Layers run in order, with casts where consecutive dtypes differ.
class Sequence {
 public:
  /// Builds the layers of `cfgs` for inputs of per-sample `in_shape` arriving in `in_dtype`.
  /// `inherited_dtype` is the `dtype:` nested layers fall back on (unset: the policy); `last_of_model`
  /// marks the sequence whose last layer produces the logits; `first_of_model` marks the
  /// one whose first layer needs no input gradient.
  void build(Context& c, const std::vector<LayerConfig>& cfgs, Shape in_shape, DType in_dtype,
             std::optional<LayerDType> inherited_dtype, int depth, bool last_of_model, bool first_of_model);
  /// Appends an already-built layer (the residual projection).
  void append(Context& c, std::unique_ptr<Layer> layer, DType in_dtype, bool need_dx);

  Tensor forward(Context& c, const Tensor& x);
  Tensor backward(Context& c, const Tensor& dy, bool need_dx);

  bool empty() const { return steps_.empty(); }
  Shape out_shape() const { return out_shape_; }
  DType out_dtype() const { return out_dtype_; }
  Layer& first() { return *steps_.front().layer; }
  Layer& last() { return *steps_.back().layer; }
  const Layer& last() const { return *steps_.back().layer; }
  int64_t param_count(const Context& c) const;
  void append_infos(const Context& c, std::vector<LayerInfo>& out) const;
  void collect(std::vector<Layer*>& out);
  void collect_backward(std::vector<const Layer*>& out) const;
  /// Allocates what the first layer needs to return an input gradient.
  void enable_input_grad(Context& c);
  /// Where backward() stops when no input gradient is asked for: steps before `first` get no
  /// gradient (their parameters' gradients are zeros, their hooks still called), step `first`
  /// computes its parameters' gradients but no input gradient. 0: every step (the default).
  void set_first_backward(size_t first) { first_backward_ = first; }
  size_t size() const { return steps_.size(); }
  /// Every layer of step i (nested ones included).
  void collect_step(size_t i, std::vector<const Layer*>& out) const { steps_[i].layer->collect_backward(out); }
  /// The runs of steps whose forward goes in pieces of the batch, as "a -> b -> c in pieces of
  /// 16 rows" (docs/cpu-performance.md, "Pieces of the batch"); with `fused`, as a step takes
  /// them where a convolution and the max pooling after it run in one op (a run that starts at
  /// such a pair is not taken).
  std::vector<std::string> piece_runs(bool fused = false) const;
  /// The convolutions and max poolings whose forward runs in one op, as "a -> b in one
  /// op" (docs/cpu-performance.md, "The first convolution's forward with max pooling").
  std::vector<std::string> conv_pool_runs() const;

 private:
  struct Step {
    std::unique_ptr<Layer> layer;
    DType in_dtype = DType::F32;  // dtype the input arrives in
    Planned in_cast;              // input cast to the layer's dtype (when they differ)
    Planned dx_cast;              // dx cast back to in_dtype (when they differ)
  };
  void add_step(Context& c, std::unique_ptr<Layer> layer, DType in_dtype, bool need_dx);
  /// Steps [first, last] run their forward in pieces of `rows` (Layer::input_piece_rows).
  struct PieceRun {
    size_t first, last;
    int64_t rows;
  };
  /// Adds the run that ends in the step just added, where it asks for one (nn/pieces.cpp).
  void plan_pieces(const Context& c);
  /// The forward of `run`'s steps on x (the first step's input, cast), piece after piece.
  Tensor forward_in_pieces(Context& c, const PieceRun& run, const Tensor& x);
  std::vector<Step> steps_;
  std::vector<PieceRun> pieces_;  // in step order, not overlapping
  /// Adds the step just added, a max pooling, to conv_pool_ where it takes the forward of the
  /// convolution before it (Layer::takes_conv_forward).
  void plan_conv_pool(const Context& c);
  /// The steps i whose convolution (i) and max pooling (i + 1) run their training forward in one
  /// op (Layer::forward_with_conv), in step order.
  std::vector<size_t> conv_pool_;
  /// The step whose backward takes the weight gradients of step `first`, a convolution
  /// (Layer::backward_with_conv): a max pooling right after it, or a dense layer after a reshape
  /// of it; 0 where there is none.
  size_t conv_grads_taker(size_t first) const;
  bool fuse_ = true;  // MPX_CPU_FUSE, read as each step is added (add_step)
  size_t first_backward_ = 0;
  Shape in_shape_, out_shape_;
  DType in_dtype_ = DType::F32, out_dtype_ = DType::F32;
};

}  // namespace mpx::nn
