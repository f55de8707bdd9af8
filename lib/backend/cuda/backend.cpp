// SPDX-License-Identifier: MIT
// CudaBackend: wiring of the op files and the Context; memory through cudaMalloc
// (planned once by the model, never in the step loop), transfers on the compute
// stream, the MPX_CUDA_SYNC_DEBUG switch after every op. Twin of cpu/backend.cpp.
#include "backend/cuda/backend.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"

namespace mpx {
namespace cuda {

CudaBackend::CudaBackend(int device, const BackendOptions& options)
    : ctx_(std::make_unique<Context>(device, options.cuda_workspace_bytes, [this](size_t b) { note_alloc(b); },
                                     [this](size_t b) { note_free(b); })),
      staging_(std::make_unique<Staging>(device)) {
  ctx_->set_conv_algo(options.cuda_conv_search, options.cuda_deterministic);
  refresh_device_memory();
}

CudaBackend::~CudaBackend() {
  // The staging buffers go first (their destructor waits for the copy stream), then the
  // Context (it waits for the compute stream, then frees graphs, plans and scratch).
  staging_.reset();
  ctx_.reset();
}

DeviceInfo CudaBackend::info() const {
  const cudaDeviceProp& prop = ctx_->prop();
  DeviceInfo d;
  d.name = fmt::format("cuda:{}", ctx_->device());
  d.compute_capability = ctx_->compute_capability();
  d.native_f16 = d.compute_capability >= 70;   // Tensor Cores
  d.native_bf16 = d.compute_capability >= 80;  // bf16 Tensor Cores
  d.description = fmt::format("{}, compute capability {}.{}, {:.1f} GiB, {} SMs", prop.name, prop.major, prop.minor,
                              static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024 * 1024),
                              prop.multiProcessorCount);
  return d;
}

bool CudaBackend::supports(Op op, DType t) const {
  switch (op) {
    case Op::SoftmaxCrossEntropy:
    case Op::UnscaleAndCheck:
    case Op::OptimizerStep:
      return t == DType::F32;
    case Op::Conv2d:
    case Op::Dense:
      // cuDNN and cuBLASLt have bfloat16 kernels from Ampere (cc 8.0) on.
      if (t == DType::BF16) return DeviceInfo::with_cc(ctx_->compute_capability()).bf16_tensor_cores();
      return is_float(t);
    default:
      return is_float(t);  // own kernels: float32, float16 and bfloat16 everywhere
  }
}

Support CudaBackend::supports_conv2d(const Conv2dParams& p, const Shape& x, const Shape& w, DType t) {
  if (!supports(Op::Conv2d, t))
    return Support::refused(fmt::format("cuda:{} (compute capability {}.{}) has no {} convolutions (bfloat16 needs 8.0)",
                               ctx_->device(), ctx_->compute_capability() / 10, ctx_->compute_capability() % 10,
                               dtype_name(t)));
  std::vector<int64_t> key{static_cast<int64_t>(t), p.R, p.S, p.stride_h, p.stride_w, p.pad_top, p.pad_left,
                           p.pad_bottom, p.pad_right};
  for (int i = 0; i < x.rank; ++i) key.push_back(x[i]);
  for (int i = 0; i < w.rank; ++i) key.push_back(w[i]);
  auto it = conv_probes_.find(key);
  if (it == conv_probes_.end()) it = conv_probes_.emplace(key, cuda::probe_conv2d(*ctx_, p, x, w, t)).first;
  return it->second;
}

void CudaBackend::synchronize() {
  not_in_capture("synchronize");
  MPX_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream()));
}

bool CudaBackend::supports_graphs() const {
#if MPX_CUDA_SYNC_DEBUG
  return false;
#else
  return true;
#endif
}

void CudaBackend::not_in_capture(const char* what) {
  if (ctx_->capturing()) ctx_->fail_in_capture(std::string(what) + " (it allocates, synchronizes or reads back)");
}

void CudaBackend::refresh_device_memory() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) note_device_memory(total, free);
  cudaGetLastError();
}

void CudaBackend::after_op(const char* op) {
#if MPX_CUDA_SYNC_DEBUG
  const cudaError_t e = cudaStreamSynchronize(ctx_->stream());
  if (e != cudaSuccess)
    throw CudaError(fmt::format("CUDA error on device {} after {}: {}", ctx_->device(), op, cudaGetErrorString(e)));
#else
  (void)op;
#endif
}

void* CudaBackend::alloc_impl(size_t bytes) {
  not_in_capture("alloc");
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it; Backend::alloc throws OutOfMemoryError naming the allocation
    return nullptr;
  }
  MPX_CUDA_CHECK(e);
  refresh_device_memory();
  return p;
}

void CudaBackend::free_impl(void* p) {
  // Called from Buffer's destructor: log, never throw (a free during a capture fails the capture).
  const cudaError_t e = cudaFree(p);
  if (e != cudaSuccess) spdlog::error("CUDA: cudaFree failed on cuda:{}: {}", ctx_->device(), cudaGetErrorString(e));
  refresh_device_memory();
}

void CudaBackend::upload_impl(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  not_in_capture("upload");
  MPX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx_->stream()));
  // From pageable memory the call returns once the source is staged; from pinned memory the
  // copy is truly asynchronous, so wait for it before the caller may reuse its buffer.
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, src) == cudaSuccess && attr.type == cudaMemoryTypeHost)
    MPX_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream()));
  cudaGetLastError();
  after_op("upload");
}

void CudaBackend::download_impl(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  not_in_capture("download");
  MPX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx_->stream()));
  MPX_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream()));
}

// ---- the op table's ops (backend/op_table.inc): each forwards to cuda::NAME ----------

#define MPX_OP(NAME, GROUP, PARAMS, ARGS, ...)    \
  void CudaBackend::NAME##_impl PARAMS {           \
    cuda::NAME(*ctx_, MPX_OP_ARGS ARGS);           \
    after_op(#NAME);                               \
  }
#include "backend/op_table.inc"

void CudaBackend::pool_forward_impl(const PoolParams& p, const Tensor& x, const Tensor& y) {
  cuda::pool_forward(*ctx_, p, x, y);
  after_op("pool_forward");
}
void CudaBackend::pool_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& dx) {
  cuda::pool_backward(*ctx_, p, x, y, dy, dx);
  after_op("pool_backward");
}
bool CudaBackend::unscale_and_check_impl(const Tensor& grads, float inv_scale) {
  not_in_capture("unscale_and_check (use unscale_and_check_state)");
  return cuda::unscale_and_check(*ctx_, grads, inv_scale);  // synchronous (one 4-byte read back)
}
TensorStats CudaBackend::stats_impl(const Tensor& x) {
  not_in_capture("stats");
  return cuda::stats(*ctx_, x);
}

// ---- the step without host synchronisation ------------------------------------------
// No op here reads back or waits for the host; each can be captured into a graph.

void CudaBackend::softmax_cross_entropy_scaled_impl(const Tensor& logits, const Tensor& labels, const Tensor& state,
                                                    double weight, const Tensor& loss_sum_out,
                                                    const Tensor& correct_out, const Tensor& dlogits,
                                                    float label_smoothing) {
  cuda::softmax_cross_entropy_scaled(*ctx_, logits, labels, state, weight, loss_sum_out, correct_out, dlogits,
                                     label_smoothing);
  after_op("softmax_cross_entropy_scaled");
}
void CudaBackend::unscale_and_check_state_impl(const Tensor& grads, const Tensor& loss_sum, const Tensor& state,
                                               int world) {
  cuda::unscale_and_check_state(*ctx_, grads, loss_sum, state, world);
  after_op("unscale_and_check_state");
}
void CudaBackend::optimizer_step_state_impl(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                                            const std::vector<Tensor>& states, const Tensor& compute_copy,
                                            const Tensor& state, const Tensor& lr_dev) {
  cuda::optimizer_step_state(*ctx_, s, master, grads, states, compute_copy, state, lr_dev);
  after_op("optimizer_step_state");
}
void CudaBackend::loss_scale_update_state_impl(const Tensor& state, const LossScaleRule& rule,
                                               const Tensor& loss_sum, const Tensor& correct, int64_t n) {
  cuda::loss_scale_update_state(*ctx_, state, rule, loss_sum, correct, n);
  after_op("loss_scale_update_state");
}

// ---- double-buffered input upload (staging.h) ----------------------------------------

void* CudaBackend::staging_impl(int slot, size_t bytes) {
  not_in_capture("staging");
  return staging_->host(slot, bytes);
}
void CudaBackend::upload_staged_impl(int slot, void* dst, size_t offset, size_t bytes) {
  not_in_capture("upload_staged");
  staging_->upload(slot, dst, offset, bytes, ctx_->stream());
  after_op("upload_staged");
}
void CudaBackend::release_staged_impl(int slot) {
  staging_->release(slot, ctx_->stream(), ctx_->capturing());
}

// ---- graphs (context.cpp) -------------------------------------------------------------

bool CudaBackend::graph_begin_capture_impl() {
  ctx_->begin_capture();
  return true;
}
int CudaBackend::graph_end_capture_impl() { return ctx_->end_capture(); }
void CudaBackend::graph_launch_impl(int id) {
  ctx_->launch_graph(id);
  after_op("graph_launch");
}

}  // namespace cuda

std::unique_ptr<Backend> create_cuda_backend(int device, const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(device, options);
}

}  // namespace mpx
