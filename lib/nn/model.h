// SPDX-License-Identifier: MIT
// The network built from Config: layers with their compute/variable dtypes
// (policy + per-layer overrides), the flat parameter arenas (float32 master,
// float32 gradients, one 16-bit compute copy, float32 non-trainable state),
// activation memory planned once for the maximum batch, forward and backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/tensor.h"

namespace mpx {

class Layer;

/// One row of the model summary (Keras model.summary()).
struct LayerInfo {
  std::string name;
  LayerType type = LayerType::Dense;
  Shape input_shape;    // per sample, as the layer receives it
  Shape output_shape;   // per sample: [H, W, C] or [C]
  int64_t params = 0;   // trainable + non-trainable
  DType compute_dtype = DType::F32;
  DType variable_dtype = DType::F32;
  int depth = 0;        // nesting inside residual blocks
};

/// How a parameter's elements are laid out in the weights files of `mpx export` (the table
/// in weights/weights.h). Its layer declares it with the parameter (Context::add_param), so
/// the export never guesses it from a name or a rank.
enum class ExportLayout : uint8_t {
  AsIs,           // one value per output unit or channel (bias): as is in both layouts
  InputFeatures,  // one value per input feature (batch norm): as is; in the pytorch layout,
                  // after a flatten of an [H, W, C] map, in its (c, h, w) order
  ConvKernel,     // [K, R, S, C]: keras [R, S, C, K], pytorch [K, C, R, S]
  DenseKernel,    // [Cout, Cin]: keras [Cin, Cout]; pytorch as is, the input columns
                  // of a flatten of an [H, W, C] map in its (c, h, w) order
  Permuted,       // the layer's own transposes, in ParamExport::keras and ParamExport::torch
};

/// One file layout of an ExportLayout::Permuted parameter: its elements viewed as `view` (a
/// shape of the same element count), then transposed so that file axis i is view axis perm[i].
struct ExportAxes {
  Shape view;
  std::vector<int> perm;
};

/// What a layer declares of a parameter for the weights files.
struct ParamExport {
  ExportLayout layout = ExportLayout::AsIs;
  const char* torch_name = nullptr;  // its name in the pytorch layout; nullptr: the mpx (Keras) name
  ExportAxes keras = {}, torch = {};  // ExportLayout::Permuted only
};

/// One parameter tensor inside an arena (names as Keras: kernel, bias, gamma,
/// beta, moving_mean, moving_variance). Trainable ones live in master/grads,
/// the others in state().
struct ParamInfo {
  std::string layer;
  std::string name;
  Shape shape;          // conv kernel [K, R, S, C]; dense kernel [Cout, Cin]
  int64_t offset = 0;   // elements from the start of its arena
  bool trainable = true;
  ExportLayout layout = ExportLayout::AsIs;
  ExportAxes keras_axes, torch_axes;  // ExportLayout::Permuted only
  std::string torch_name;  // the name in the pytorch layout
};

/// A range of the flat gradient arena, in float32 elements.
struct GradRange {
  int64_t offset = 0;
  int64_t count = 0;
  bool operator==(const GradRange& o) const { return offset == o.offset && count == o.count; }
};

/// One layer's tensors of the last step (`mpx inspect`): views into planned
/// memory, valid until the next forward/backward.
struct LayerTensors {
  std::string name, type;
  int depth = 0;
  Tensor output;      // [n, out_shape] in the layer's compute dtype
  Tensor input_grad;  // [n, in_shape], the gradient the layer passed back; empty where none was computed
};

/// Bytes the model keeps for one batch of the planned size.
struct MemoryReport {
  size_t activation_bytes = 0;    // kept for the backward pass (outputs, masks, BN stats)
  size_t workspace_bytes = 0;     // gradients of activations and other scratch
  size_t master_bytes = 0;        // float32 master weights
  size_t grad_bytes = 0;          // float32 gradient arena
  size_t compute_copy_bytes = 0;  // 16-bit compute copy (0 under float32)
  size_t state_bytes = 0;         // batch-norm moving statistics
};

class Model {
 public:
  /**
   * @brief Builds the network of cfg.model under `policy` (already resolved,
   * never Policy::Auto), for inputs of shape [H, W, C] and up to `max_batch`
   * records per step, and plans all of its memory on `backend`.
   * Throws ConfigError for shape errors (naming the layer) and for a last
   * layer whose width differs from num_classes. `plan_only` (`mpx validate`):
   * every buffer is counted in memory_report() but none is allocated; such a
   * model must never run or be initialized.
   */
  Model(const Config& cfg, Policy policy, Backend& backend, int H, int W, int C, int num_classes,
        int64_t max_batch, bool plan_only = false);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// The input [H, W, C] the model was built for.
  Shape input_shape() const;

  // ---- parameters ----------------------------------------------------------
  int64_t num_params() const;          // length of master/grads: trainable values + alignment gaps
  int64_t num_state() const;           // length of state: non-trainable values + alignment gaps
  Tensor master() const;               // float32 [num_params]
  Tensor grads() const;                // float32 [num_params]
  Tensor compute_copy() const;         // 16-bit [num_params], or empty when no layer computes in 16 bits
  Tensor state() const;                // float32 [num_state], or empty
  const std::vector<ParamInfo>& params() const;
  /// Every ParamInfo::offset is a multiple of this many elements (256 bytes of a 16-bit
  /// arena); the gaps between parameters hold zeros (docs/design.md "Parameter arenas").
  static int64_t param_alignment();
  /// Keras default initialization: Glorot-uniform kernels, zero biases, BN
  /// gamma 1 / beta 0 / moving mean 0 / moving variance 1; then refreshes the compute copy.
  void init_params(uint64_t seed);
  /// Casts master -> compute copy (after init or after loading weights).
  void refresh_compute_copy();
  /// Per-channel input normalization (after /255), sizes C.
  void set_input_normalization(const std::vector<double>& mean, const std::vector<double>& std);

  // ---- step ----------------------------------------------------------------
  /**
   * @brief Forward pass. x_u8: uint8 [n, H, W, C] device tensor, n <= max_batch.
   * Normalizes and casts to the first layer's compute dtype, runs every layer and
   * returns float32 logits [n, num_classes] (a softmax on the last layer is fused
   * into the loss, so the output is always the pre-softmax logits).
   * `dropout_seed` and `step` make dropout masks reproducible.
   */
  Tensor forward(const Tensor& x_u8, bool training, uint64_t dropout_seed = 0, uint64_t step = 0);
  /// Backward pass from float32 dlogits [n, num_classes] (already loss-scaled);
  /// overwrites every parameter's gradient (the arena's alignment gaps keep their zeros).
  void backward(const Tensor& dlogits);
  /**
   * @brief Which parameters the next steps update (`updated`, e.g. the optimizer's groups at
   * this epoch): backward() then carries no gradient into the leading layers that have none
   * of them, as PyTorch skips what needs no grad. Their parameters' gradients are zeros and
   * the gradient-ready hook still reports them; the first layer with an updated parameter
   * computes its parameters' gradients but no input gradient. A forward_float() backward
   * still runs every layer. The default (never called): every layer.
   */
  void set_updated_params(const std::function<bool(const ParamInfo&)>& updated);
  /// Top-level layers backward() skips (set_updated_params); 0 by default.
  size_t frozen_prefix() const;

  // ---- overlapping the gradient all-reduce with backward --------------------
  /**
   * @brief Sets (or, with an empty function, clears) the hook backward() calls as
   * soon as a layer's parameter gradients are final: once per layer with trainable
   * parameters, with that layer's range of grads() (offset and count in float32
   * elements; kernel and bias are adjacent), in the order backward() finishes the
   * layers, i.e. grad_ready_ranges(). "Final" means every op writing the range has
   * been queued on the backend (on a GPU: on the compute stream; record an event
   * there before handing the range to another stream). Over one backward() the
   * ranges partition grads() exactly. Without a hook backward() is unchanged.
   */
  void set_grad_ready_hook(std::function<void(int64_t offset, int64_t count)> hook);
  /// The ranges the hook reports during one backward(), in that order (computed from the
  /// layer structure, no pass needed). The arena is laid out in forward order, so this is
  /// mostly descending offsets; a residual block's projection comes after its branch.
  std::vector<GradRange> grad_ready_ranges() const;

  // ---- float32 input path (gradient checks) ---------------------------------
  /**
   * @brief Forward pass from an already normalized float32 input [n, H, W, C]
   * (instead of uint8 + normalize_input); the next backward() then also computes
   * the gradient with respect to this input (input_grad()). The first call
   * allocates the input-gradient buffers (a test path, not the step loop).
   */
  Tensor forward_float(const Tensor& x_f32, bool training, uint64_t dropout_seed = 0, uint64_t step = 0);
  /// After forward_float() + backward(): float32 [n, H, W, C] d(objective)/d(input).
  Tensor input_grad() const;

  // ---- numerics ------------------------------------------------------------
  /// Whether every layer's output is written in a training step, for reading after it
  /// (layer_tensors, first_nonfinite_forward): off by default, where a convolution whose output
  /// nothing else reads may run in one op with the max pooling after it and leave it unwritten
  /// (its layer_tensors output is then empty).
  void keep_layer_outputs(bool keep);
  /// After forward(): the first layer whose output holds inf/NaN, "" if none.
  std::string first_nonfinite_forward();
  /// After backward(): the first layer (from the output back) whose input gradient
  /// or weight gradient holds inf/NaN, "" if none.
  std::string first_nonfinite_backward();
  /// After forward() (+ backward()): every layer in execution order (nested
  /// layers before their block) with its output and its input gradient.
  std::vector<LayerTensors> layer_tensors() const;

  // ---- introspection -------------------------------------------------------
  Policy policy() const;
  int num_classes() const;
  int64_t max_batch() const;
  std::vector<LayerInfo> layer_infos() const;
  /// Keras-like table: layer (type), output shape, params, compute dtype, variable dtype; totals.
  std::string summary_table() const;
  MemoryReport memory_report() const;
  /// The runs of top-level layers whose forward a training step runs in pieces of the batch
  /// (docs/cpu-performance.md, "Pieces of the batch"), e.g. "conv2d_1 -> flatten_2 -> dense_3
  /// in pieces of 16 rows"; empty where none does.
  std::vector<std::string> piece_runs() const;
  /// The convolutions and max poolings whose forward a step (training or evaluation) runs in one
  /// op, as "conv -> pool in one op" (empty where keep_layer_outputs is on;
  /// docs/cpu-performance.md, "The first convolution's forward with max pooling"). piece_runs()
  /// leaves out the runs they replace.
  std::vector<std::string> conv_pool_runs() const;
  /// True when the last layer has a softmax activation (handled by the loss).
  bool softmax_output() const;
  /// Compute dtype of the layer that produces the logits.
  DType output_dtype() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// @brief Policy a layer computes in: its `dtype:` override or the model's.
/// Unset: the model's policy (which must not be Auto by now).
DType compute_dtype_for(Policy model_policy, std::optional<LayerDType> layer_dtype);

}  // namespace mpx
