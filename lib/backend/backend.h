// SPDX-License-Identifier: MIT
// The Backend interface: coarse primitive operations on device buffers, shared
// by the CPU (oneDNN) and CUDA (cuDNN/cuBLAS) implementations. Public methods
// validate shapes and dtypes once and call a private *_impl, so the
// implementations never repeat validation and cannot drift on it. The compute ops
// are declared once, in op_table.inc (docs/design.md, "The op table").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/activation.h"
#include "core/dtype.h"
#include "core/optimizer_kind.h"
#include "core/tensor.h"
#include "backend/device_info.h"
#include "backend/op_params.h"

namespace mpx {

class Backend;

/// @brief Owning handle of one device allocation (host memory on the CPU backend).
/// Allocated once when the model is planned, never inside the step loop.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* backend, void* ptr, size_t bytes) : backend_(backend), ptr_(ptr), bytes_(bytes) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  /// A tensor view of the start of the buffer.
  Tensor view(DType t, Shape s) const;

 private:
  void reset();
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};


/// Operation groups for supports() (ggml's supports_op): callers and tests ask before dispatching.
enum class Op : uint8_t {
  Cast, NormalizeInput, Conv2d, Dense, BiasAdd, Activation, Pool, GlobalAvgPool,
  BatchNorm, SoftmaxCrossEntropy, Dropout, Add, UnscaleAndCheck, OptimizerStep, Stats, Memory,
};

/// One op of the op table (op_table.inc): its name and the group supports() answers for.
struct OpInfo {
  const char* name;
  Op group;
};
/// Every op of the op table, in its order.
const std::vector<OpInfo>& backend_ops();

/// The argument list of an op table row without its parentheses: MPX_OP_ARGS (a, b) is a, b.
#define MPX_OP_ARGS(...) __VA_ARGS__

/**
 * @brief Primitive operations on device tensors, NHWC.
 *
 * Conventions for every op:
 *  - Tensors are views into Buffers of this backend; outputs are overwritten
 *    (never accumulated into) unless the method says otherwise.
 *  - "Compute dtype" tensors are float32, float16 or bfloat16; 16-bit outputs
 *    are rounded to nearest-even from a float32 accumulator (Tensor Core math).
 *  - The first dimension of activations is the batch; a partial last batch
 *    simply passes smaller N (implementations cache their plans by shape).
 */
class Backend {
 public:
  virtual ~Backend() = default;

  // ---- device --------------------------------------------------------------
  virtual DeviceInfo info() const = 0;
  virtual bool supports(Op op, DType t) const = 0;
  /// Whether conv2d (forward and both backward passes) runs with these shapes (x [N,H,W,C],
  /// w [K,R,S,C]) in compute dtype t. The model asks once per conv layer when it is built, so
  /// that a policy the device cannot run stops at start (exit 2) with the reason. The CUDA
  /// backend answers from a probe of cuDNN, once per shape; the default is supports(Conv2d, t).
  virtual Support supports_conv2d(const Conv2dParams& p, const Shape& x, const Shape& w, DType t);
  /// The library plans chosen so far (the CUDA backend's cuDNN algorithms and cuBLASLt
  /// matmuls); empty on the CPU.
  virtual std::vector<PlanReport> plans() const { return {}; }
  /// Waits for all queued work (no-op on the CPU).
  virtual void synchronize() = 0;
  /// The compute library this backend runs on, with its version and where it was loaded
  /// from (CPU: "oneDNN 3.2.0 (...)"); empty where a backend does not say.
  virtual std::string library() const { return {}; }
  /// The library kernels chosen so far, one per distinct op and shape, in creation order.
  virtual std::vector<KernelChoice> kernels() const { return {}; }
  /// How the 16-bit convolutions and dense layers that ran so far were computed, one entry
  /// per 16-bit dtype that ran (CPU: native kernels or widened; docs/precision.md); empty
  /// where a backend does not say.
  virtual std::vector<Math16Report> math16() const { return {}; }
  MemoryStats memory_stats() const { return mem_; }

  // ---- memory --------------------------------------------------------------
  /// Allocates `bytes` (64-byte aligned). `what` names the allocation in the
  /// out-of-memory error (OutOfMemoryError, exit 5).
  Buffer alloc(size_t bytes, const char* what);
  void upload(const Tensor& dst, const void* host_src);
  void download(void* host_dst, const Tensor& src);

  // ---- the compute ops of the op table ---------------------------------------
  // Declared once, with their documentation and argument checks, in op_table.inc:
  // memory fill/copy, casts and input, convolution, dense, elementwise, global average
  // pooling, batch normalization, softmax cross-entropy, dropout, the optimizer pass.
  // Each public method validates its arguments once and then calls NAME_impl.
#define MPX_OP(NAME, GROUP, PARAMS, ARGS, ...) void NAME PARAMS;
#define MPX_DEFAULT(v) = v
#include "backend/op_table.inc"

  // ---- pooling -------------------------------------------------------------
  /// Whether this backend keeps max pooling's window positions for this geometry: then a
  /// caller may pass an argmax tensor (uint8, y's shape) to pool_forward, which writes in it
  /// each output's position in its window (r * S + s of the first maximum), and the same
  /// tensor to the backward, which reads it instead of searching x again
  /// (docs/cpu-performance.md, "Max pooling after relu").
  bool max_pool_keeps_argmax(const PoolParams& p, const Shape& x) const;
  void pool_forward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& argmax = Tensor());
  /// Max pooling routes dy to the first maximum of each window (recomputed from x, y, or
  /// read from the forward's argmax).
  void pool_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                     const Tensor& argmax = Tensor());
  /// Max pooling's backward and, in the same call, the backward of the relu whose output
  /// is x: dx = the pool gradient where x > 0, else 0; the same bits as pool_backward
  /// followed by activation_backward(relu, x, dx, dx) (docs/cpu-performance.md).
  void max_pool_relu_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                              const Tensor& dx, const Tensor& argmax = Tensor());

  /// The backward of a max pooling (p; its input x, output y and, where the forward kept it, argmax)
  /// whose input is the relu output of a model's first convolution (cp; its input conv_x, its weight
  /// gradient conv_dw and bias gradient conv_db, which may be empty), where that convolution's input
  /// gradient is not needed: max_pool_relu_backward(p, x, y, dy, dx, argmax), then
  /// conv2d_backward_filter(cp, conv_x, dx, conv_dw, conv_db). dx is working space of x's shape and
  /// dtype, its contents afterwards unspecified: a backend may route dy into each row of dx as the
  /// weight gradient reads it and never store dx (docs/cpu-performance.md, "Max pooling's backward in
  /// the first convolution's weight gradient").
  void max_pool_conv_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                              const Tensor& dx, const Tensor& argmax, const Conv2dParams& cp, const Tensor& conv_x,
                              const Tensor& conv_dw, const Tensor& conv_db);

  /// The forward of a convolution with relu (cp; its input x, weights w, bias, which may be empty;
  /// no kept pre-activation) and of the max pooling (p) that reads its output: conv2d_forward(cp, x,
  /// w, bias, conv_y, relu), then pool_forward(p, conv_y, y, argmax). conv_y is working space of the
  /// convolution's output shape and dtype, its contents afterwards unspecified: a backend may pool
  /// each window's rows as they are computed and never store conv_y (docs/cpu-performance.md, "The
  /// first convolution's forward with max pooling"). A model calls it only where
  /// conv_max_pool_forward_fuses says so, and only when nothing reads the convolution's output
  /// later: in a training step the pooling's backward then works from argmax; an evaluation's
  /// forward passes no argmax.
  void conv_max_pool_forward(const Conv2dParams& cp, const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Tensor& conv_y, const PoolParams& p, const Tensor& y, const Tensor& argmax);
  /// Whether conv_max_pool_forward leaves conv_y unwritten for these shapes (x [N, H, W, C], w
  /// [K, R, S, C], all in dtype t), with an argmax or without; false in the base (and the CUDA
  /// backend).
  bool conv_max_pool_forward_fuses(const Conv2dParams& cp, const Shape& x, const Shape& w, DType t,
                                   const PoolParams& p) const;

  // ---- the forward in pieces of the batch ------------------------------------
  /// Rows per piece in which a model should run the forward passes of the per-sample layers
  /// that feed a dense layer of `units` outputs, computing in dtype `t`, reading `features`
  /// inputs in dtype `x` (t, or a 16-bit dtype that a float32 layer reads as it is) (the
  /// producing layers and the dense layer piece after piece, so that the dense layer reads
  /// each piece of its input from the cache; docs/cpu-performance.md, "Pieces of the batch");
  /// 0: the whole batch at once, the base's answer (and the CUDA backend's).
  int64_t dense_input_piece_rows(int64_t features, int64_t units, DType t, DType x) const;
  /// The same for a max pooling of x [N, H, W, C] in dtype t (p.kind Max).
  int64_t max_pool_input_piece_rows(const PoolParams& p, const Shape& x, DType t) const;
  /// Whether a convolution (x [N,H,W,C], w [K,R,S,C], dtype t) may take part in such a run: its
  /// forward costs the same per row at the pieces' batch as at the whole one (no per-call work
  /// that grows with the calls, such as a filter transform); false in the base.
  bool conv2d_forward_in_pieces(const Conv2dParams& p, const Shape& x, const Shape& w, DType t) const;

  // ---- dense after relu ------------------------------------------------------
  /// dense_backward_data and, in the same call, the backward of the relu whose output is
  /// x, the dense layer's input (dx's shape and dtype): dx = dy * w where x > 0, else 0; the
  /// same bits as dense_backward_data followed by activation_backward(relu, x, dx, dx)
  /// (docs/cpu-performance.md, "Relu before a dense layer").
  void dense_relu_backward_data(const Tensor& dy, const Tensor& w, const Tensor& x, const Tensor& dx);
  /// Both backward passes of a dense layer in one call: dense_backward_weights(x, dy, dw, db),
  /// then dense_relu_backward_data(dy, w, x, dx) when `relu_input` (x a relu's output) or
  /// dense_backward_data(dy, w, dx); the same results as those calls. A backend may do both
  /// in one walk over x (docs/cpu-performance.md, "Both backward passes in one walk").
  void dense_backward(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw, const Tensor& db,
                      const Tensor& dx, bool relu_input);
  /// The backward of a dense layer whose input x [N, P*Q*K] is the relu output of a model's
  /// first convolution (p; its input conv_x [N, H, W, C], its weight gradient conv_dw [K, R, S, C]
  /// and bias gradient conv_db, which may be empty), flattened, where that convolution's input
  /// gradient is not needed: dense_backward(x, dy, w, dw, db, dx, true), then
  /// conv2d_backward_filter(p, conv_x, dx as [N, P, Q, K], conv_dw, conv_db). dx is working
  /// space of x's shape and dtype, its contents afterwards unspecified: a backend may take the
  /// convolution's sums from each block of dx while it is in cache and never store dx
  /// (docs/cpu-performance.md, "The first convolution's weight gradient in the dense walk").
  void dense_conv_backward(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw, const Tensor& db,
                           const Tensor& dx, const Conv2dParams& p, const Tensor& conv_x, const Tensor& conv_dw,
                           const Tensor& conv_db);
  /// global_avg_pool_backward and, in the same call, the backward of the relu whose output
  /// is x, the pooling's input (dx's shape and dtype): dx = dy / (H W) where x > 0, else 0;
  /// the same bits as global_avg_pool_backward followed by activation_backward(relu, x, dx,
  /// dx) (docs/cpu-performance.md, "Relu before global average pooling").
  void global_avg_pool_relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);

  // ---- fused mixed-precision passes over flat float32 arenas ----------------
  /// grads *= inv_scale in place, in one pass that also tests every value.
  /// Returns true when every value is finite.
  bool unscale_and_check(const Tensor& grads, float inv_scale);
  /// optimizer_step (op_table.inc) for an optimizer of at most two arenas (state2 is
  /// ignored by SGD).
  void optimizer_step(const OptimizerStep& s, const Tensor& master, const Tensor& grads, const Tensor& state1,
                      const Tensor& state2, const Tensor& compute_copy) {
    optimizer_step(s, master, grads, first_arenas(s, state1, state2), compute_copy);
  }

  // ---- reductions ----------------------------------------------------------
  /// min/max/mean|x|/inf/nan/zero counts of any float tensor (synchronous).
  TensorStats stats(const Tensor& x);

  // ---- the step without host synchronisation (docs/design.md "One training step, as data") ----
  // The loss scale, the finiteness verdict, Adam's t and the metrics of the log window
  // live in a StepState in device memory; the host reads it back (download) only every
  // log_every steps. Each op below is the twin of the host-driven op named in its
  // comment and gives bit-identical results on the same backend.

  /// Like softmax_cross_entropy with grad_scale = float(state.scale * weight).
  void softmax_cross_entropy_scaled(const Tensor& logits, const Tensor& labels, const Tensor& state, double weight,
                                    const Tensor& loss_sum_out, const Tensor& correct_out, const Tensor& dlogits,
                                    float label_smoothing = 0.0f);
  /// Like unscale_and_check with inv_scale = float(1.0 / (state.scale * world)); the verdict
  /// goes to state.finite (1 when loss_sum [float32 1] and every gradient are finite).
  void unscale_and_check_state(const Tensor& grads, const Tensor& loss_sum, const Tensor& state, int world);
  /// Like optimizer_step with lr = *lr_dev (float32 [1] device tensor) and t = state.applied_total + 1
  /// (s.lr and s.t are ignored); does nothing when state.finite is 0.
  void optimizer_step_state(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                            const std::vector<Tensor>& states, const Tensor& compute_copy, const Tensor& state,
                            const Tensor& lr_dev);
  /// The same for an optimizer of at most two arenas (state2 is ignored by SGD).
  void optimizer_step_state(const OptimizerStep& s, const Tensor& master, const Tensor& grads, const Tensor& state1,
                            const Tensor& state2, const Tensor& compute_copy, const Tensor& state,
                            const Tensor& lr_dev) {
    optimizer_step_state(s, master, grads, first_arenas(s, state1, state2), compute_copy, state, lr_dev);
  }
  /// The loss-scaler update of one step (train/loss_scaler.cpp, LossScaler::update, on the
  /// device) from state.finite, then the window sums: loss_sum/correct (float32 [1]) of a step
  /// with a finite loss, and `n` records.
  void loss_scale_update_state(const Tensor& state, const LossScaleRule& rule, const Tensor& loss_sum,
                               const Tensor& correct, int64_t n);

  // ---- double-buffered input upload ----------------------------------------
  // CUDA: page-locked staging memory, a copy stream and events, so that the upload of the
  // next batch overlaps this step and the GPU never waits for the host. CPU: plain host
  // memory and memcpy. `slot` is 0 or 1.

  /// Host staging memory of slot (at least `bytes`, allocated at the first call), safe to
  /// write: waits until the previous upload from this slot has finished.
  void* staging(int slot, size_t bytes);
  /// Queues the copy of `bytes` from staging(slot) + offset into device memory `dst`; it
  /// starts once the compute work queued before the last release_staged(slot) is done, and
  /// compute work queued after this call waits for it.
  void upload_staged(int slot, void* dst, size_t offset, size_t bytes);
  /// Marks the compute work queued so far as the last reader of slot's device buffers.
  void release_staged(int slot);

  // ---- graphs ------------------------------------------------------------------
  /// CUDA: starts capturing the ops queued from now on into a CUDA graph and returns true;
  /// backends without graphs return false and the caller runs the ops as usual.
  bool graph_begin_capture();
  /// Ends the capture; returns the graph's id for graph_launch.
  int graph_end_capture();
  /// Ends a capture without keeping it (its partial graph is dropped and the stream works
  /// again); nothing happens without an open capture. Never throws: GraphCapture
  /// (graph_capture.h) calls it while an exception unwinds.
  void graph_abort_capture() noexcept { graph_abort_capture_impl(); }
  /// Replays graph `id` (the captured ops, on the same buffers).
  void graph_launch(int id);
  /// Whether graph_begin_capture can work here (CUDA without MPX_CUDA_SYNC_DEBUG).
  virtual bool supports_graphs() const { return false; }
  /// The native queue the ops run on (CUDA: the cudaStream_t), for communicators that
  /// order their own work after it; nullptr on the CPU.
  virtual void* native_stream() const { return nullptr; }

 protected:
  /// Accounting hook for implementations' allocations.
  void note_alloc(size_t bytes);
  void note_free(size_t bytes);
  /// Device-wide total/free bytes (CUDA: cudaMemGetInfo), refreshed by implementations that know them.
  void note_device_memory(size_t total, size_t free) {
    mem_.device_total_bytes = total;
    mem_.device_free_bytes = free;
  }

 private:
  friend class Buffer;
  virtual void* alloc_impl(size_t bytes) = 0;  // nullptr on failure
  virtual void free_impl(void* p) = 0;
  virtual void upload_impl(void* dst, const void* src, size_t bytes) = 0;
  virtual void download_impl(void* dst, const void* src, size_t bytes) = 0;
#define MPX_OP(NAME, GROUP, PARAMS, ARGS, ...) virtual void NAME##_impl PARAMS = 0;
#include "backend/op_table.inc"
  virtual void pool_forward_impl(const PoolParams& p, const Tensor& x, const Tensor& y) = 0;
  virtual void pool_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                  const Tensor& dx) = 0;
  /// The base composes pool_backward_impl and activation_backward_impl; the CPU backend fuses.
  virtual void max_pool_relu_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y,
                                           const Tensor& dy, const Tensor& dx);
  /// The base composes dense_backward_data_impl and activation_backward_impl; the CPU
  /// backend fuses.
  virtual void dense_relu_backward_data_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                             const Tensor& dx);

 protected:
  /// The base calls the two passes' impls; the CPU backend walks x once where it can, and
  /// calls this where it cannot.
  virtual void dense_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                                   const Tensor& db, const Tensor& dx, bool relu_input);
  /// The base runs the pooling's backward (from argmax where it is not empty) and
  /// conv2d_backward_filter_impl; the CPU backend does both in one walk where it can, and calls
  /// this where it cannot.
  virtual void max_pool_conv_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                           const Tensor& dx, const Tensor& argmax, const Conv2dParams& cp,
                                           const Tensor& conv_x, const Tensor& conv_dw, const Tensor& conv_db);
  /// The base runs conv2d_forward_impl and the pooling's forward; the CPU backend pools each
  /// window's rows as it computes them where it can, and calls this where it cannot.
  virtual void conv_max_pool_forward_impl(const Conv2dParams& cp, const Tensor& x, const Tensor& w,
                                          const Tensor& bias, const Tensor& conv_y, const PoolParams& p,
                                          const Tensor& y, const Tensor& argmax);
  /// The base runs dense_backward_impl and conv2d_backward_filter_impl; the CPU backend does both
  /// in one walk where it can, and calls this where it cannot.
  virtual void dense_conv_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                                        const Tensor& db, const Tensor& dx, const Conv2dParams& p,
                                        const Tensor& conv_x, const Tensor& conv_dw, const Tensor& conv_db);

 private:
  /// The same for global average pooling.
  virtual void global_avg_pool_relu_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& dx);
  /// max_pool_keeps_argmax and the ops that take an argmax: the base keeps none.
  virtual bool max_pool_keeps_argmax_impl(const PoolParams&, const Shape&) const { return false; }
  /// dense_input_piece_rows: the base runs whole batches.
  virtual int64_t dense_input_piece_rows_impl(int64_t /*features*/, int64_t /*units*/, DType /*t*/,
                                              DType /*x*/) const {
    return 0;
  }
  virtual int64_t max_pool_input_piece_rows_impl(const PoolParams&, const Shape&, DType) const { return 0; }
  virtual bool conv2d_forward_in_pieces_impl(const Conv2dParams&, const Shape&, const Shape&, DType) const {
    return false;
  }
  virtual bool conv_max_pool_forward_fuses_impl(const Conv2dParams&, const Shape&, const Shape&, DType,
                                                const PoolParams&, const Shape&) const {
    return false;
  }
  /// pool_forward with an argmax to write (only called where max_pool_keeps_argmax_impl said so).
  virtual void max_pool_forward_argmax_impl(const PoolParams& p, const Tensor& x, const Tensor& y,
                                            const Tensor& argmax);
  /// pool_backward (relu false) or max_pool_relu_backward (relu true) from the forward's argmax.
  virtual void max_pool_backward_argmax_impl(const PoolParams& p, const Tensor& y, const Tensor& argmax,
                                             const Tensor& dy, const Tensor& dx, bool relu);
  virtual bool unscale_and_check_impl(const Tensor& grads, float inv_scale) = 0;
  virtual TensorStats stats_impl(const Tensor& x) = 0;
  virtual void softmax_cross_entropy_scaled_impl(const Tensor& logits, const Tensor& labels, const Tensor& state,
                                                 double weight, const Tensor& loss_sum_out, const Tensor& correct_out,
                                                 const Tensor& dlogits, float label_smoothing) = 0;
  virtual void unscale_and_check_state_impl(const Tensor& grads, const Tensor& loss_sum, const Tensor& state,
                                            int world) = 0;
  virtual void optimizer_step_state_impl(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                                         const std::vector<Tensor>& states, const Tensor& compute_copy,
                                         const Tensor& state, const Tensor& lr_dev) = 0;
  /// {state1, state2} cut to the kind's arena count.
  static std::vector<Tensor> first_arenas(const OptimizerStep& s, const Tensor& state1, const Tensor& state2) {
    std::vector<Tensor> v{state1, state2};
    if (optimizer_info(s.kind).num_arenas() < 2) v.resize(static_cast<size_t>(optimizer_info(s.kind).num_arenas()));
    return v;
  }
  virtual void loss_scale_update_state_impl(const Tensor& state, const LossScaleRule& rule, const Tensor& loss_sum,
                                            const Tensor& correct, int64_t n) = 0;
  virtual void* staging_impl(int slot, size_t bytes) = 0;
  virtual void upload_staged_impl(int slot, void* dst, size_t offset, size_t bytes) = 0;
  virtual void release_staged_impl(int slot) = 0;
  virtual bool graph_begin_capture_impl() { return false; }
  virtual int graph_end_capture_impl() { return -1; }
  virtual void graph_abort_capture_impl() noexcept {}
  virtual void graph_launch_impl(int /*id*/) {}

  MemoryStats mem_;
};

/// @brief Creates a backend from a device string: "cpu", "cuda", "cuda:N".
/// ("auto" is resolved by the caller with cuda_device_count().) Throws ConfigError
/// for an unknown name and Error("mpx was built without CUDA") where applicable.
std::unique_ptr<Backend> create_backend(const std::string& device, const BackendOptions& options = {});

/// Number of usable CUDA devices; 0 without CUDA support or without a GPU.
int cuda_device_count();
/// Descriptions of every CUDA device (empty without CUDA or GPU).
std::vector<DeviceInfo> cuda_devices();

}  // namespace mpx
