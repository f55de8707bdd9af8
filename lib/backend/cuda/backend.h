// SPDX-License-Identifier: MIT
// CudaBackend: the Backend of one NVIDIA GPU. Each *_impl forwards to the op
// group in its own file (memory.cu, conv.cpp, dense.cpp, ...), exactly as
// cpu/backend.cpp does; this class only wires them and owns the Context.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/context.h"
#include "backend/cuda/staging.h"

namespace mpx::cuda {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const BackendOptions& options);
  ~CudaBackend() override;

  DeviceInfo info() const override;
  bool supports(Op op, DType t) const override;
  /// From a probe of cuDNN's heuristic (conv.cpp), once per shape and dtype.
  Support supports_conv2d(const Conv2dParams& p, const Shape& x, const Shape& w, DType t) override;
  std::vector<PlanReport> plans() const override { return ctx_->plan_reports(); }
  void synchronize() override;
  /// CUDA graphs, except with MPX_CUDA_SYNC_DEBUG (it synchronizes after every op).
  bool supports_graphs() const override;
  void* native_stream() const override { return static_cast<void*>(ctx_->stream()); }

 private:
  /// Refreshes cudaMemGetInfo into memory_stats() (after allocations, not in the step loop).
  void refresh_device_memory();
  /// MPX_CUDA_SYNC_DEBUG: waits for the op just queued so a fault names it.
  void after_op(const char* op);
  /// Throws (ending the capture) when `what`, which synchronizes or allocates, is called during a capture.
  void not_in_capture(const char* what);

  void* alloc_impl(size_t bytes) override;
  void free_impl(void* p) override;
  void upload_impl(void* dst, const void* src, size_t bytes) override;
  void download_impl(void* dst, const void* src, size_t bytes) override;
  // The op table's ops (backend/op_table.inc), defined in backend.cpp.
#define MPX_OP(NAME, GROUP, PARAMS, ARGS, ...) void NAME##_impl PARAMS override;
#include "backend/op_table.inc"
  void pool_forward_impl(const PoolParams& p, const Tensor& x, const Tensor& y) override;
  void pool_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                          const Tensor& dx) override;
  bool unscale_and_check_impl(const Tensor& grads, float inv_scale) override;
  TensorStats stats_impl(const Tensor& x) override;
  void softmax_cross_entropy_scaled_impl(const Tensor& logits, const Tensor& labels, const Tensor& state,
                                         double weight, const Tensor& loss_sum_out, const Tensor& correct_out,
                                         const Tensor& dlogits, float label_smoothing) override;
  void unscale_and_check_state_impl(const Tensor& grads, const Tensor& loss_sum, const Tensor& state,
                                    int world) override;
  void optimizer_step_state_impl(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                                 const std::vector<Tensor>& states, const Tensor& compute_copy, const Tensor& state,
                                 const Tensor& lr_dev) override;
  void loss_scale_update_state_impl(const Tensor& state, const LossScaleRule& rule, const Tensor& loss_sum,
                                    const Tensor& correct, int64_t n) override;
  void* staging_impl(int slot, size_t bytes) override;
  void upload_staged_impl(int slot, void* dst, size_t offset, size_t bytes) override;
  void release_staged_impl(int slot) override;
  bool graph_begin_capture_impl() override;
  int graph_end_capture_impl() override;
  void graph_abort_capture_impl() noexcept override { ctx_->abort_capture(); }
  void graph_launch_impl(int id) override;

  std::unique_ptr<Context> ctx_;
  std::map<std::vector<int64_t>, Support> conv_probes_;  // supports_conv2d's answers by shape
  std::unique_ptr<Staging> staging_;  // after ctx_: destroyed first
};

}  // namespace mpx::cuda
