// SPDX-License-Identifier: MIT
// The Context of the CUDA backend: device, stream, cuDNN/cuBLASLt handles, the
// pinned flag word, the grow-once scratch slots, the plan cache and the captured
// CUDA graphs (context.h).
#include "backend/cuda/context.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/check.h"

namespace mpx::cuda {

namespace {
// Destructors only log (STYLE.md 16).
void log_failure(const char* what, cudaError_t e) {
  if (e != cudaSuccess) spdlog::error("CUDA: {} failed: {}", what, cudaGetErrorString(e));
}
}  // namespace

Context::Context(int device, size_t workspace_budget, std::function<void(size_t)> on_alloc,
                 std::function<void(size_t)> on_free)
    : device_(device), on_alloc_(std::move(on_alloc)), on_free_(std::move(on_free)) {
  MPX_CUDA_CHECK(cudaSetDevice(device));
  MPX_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device));
  stream_ = make_stream();
  cudnn_ = make_cudnn(stream_.get());
  cublaslt_ = make_cublaslt();
  device_flag_ = make_device_memory(sizeof(int));
  host_flag_ = make_host_memory(sizeof(int));
  workspace_budget_ = workspace_budget;
}

Context::~Context() {
  abort_capture();
  log_failure("cudaStreamSynchronize", cudaStreamSynchronize(stream_.get()));
  for (cudaGraphExec_t e : graphs_) log_failure("cudaGraphExecDestroy", cudaGraphExecDestroy(e));
  graphs_.clear();
  plans_.clear();
  for (Block& b : slots_) {
    if (b.p) {
      log_failure("cudaFree (scratch)", cudaFree(b.p));
      on_free_(b.bytes);
    }
  }
  for (Block& b : retired_) {
    log_failure("cudaFree (outgrown scratch)", cudaFree(b.p));
    on_free_(b.bytes);
  }
  // The flag word, the handles and the stream are released by their wrappers.
}

namespace {
const char* slot_name(Slot slot) {
  static const char* names[] = {"padded convolution input", "padded input gradient",
                                "channel-padded convolution filter", "channel-padded filter gradient",
                                "16-bit weight gradient",
                                "reduction partials", "batch-norm coefficients", "batch-norm gradient before its activation",
                                "per-row results",
                                "widened dense input", "cuDNN/cuBLASLt workspace"};
  static_assert(sizeof(names) / sizeof(names[0]) == kSlotCount, "one name per scratch slot");
  return names[slot];
}
}  // namespace

void* Context::scratch(Slot slot, size_t bytes) {
  Block& b = slots_[static_cast<size_t>(slot)];
  if (bytes <= b.bytes && b.p) return b.p;
  // A captured graph keeps the addresses it was captured with; allocating (and freeing) here
  // is not capturable anyway.
  if (capturing_)
    fail_in_capture("growing the CUDA scratch for the " + std::string(slot_name(slot)) + " from " +
                    std::to_string(b.bytes) + " to " + std::to_string(bytes) + " bytes");
  if (b.p) {
    if (graphs_.empty()) {
      // Queued work may still read the old buffer.
      MPX_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
      MPX_CUDA_CHECK(cudaFree(b.p));
      on_free_(b.bytes);
    } else {
      retired_.push_back(b);  // a graph may use it at every launch: freed with the Context
    }
    b.p = nullptr;
    b.bytes = 0;
  }
  const size_t cap = std::max<size_t>((bytes + 255) / 256 * 256, 256);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, cap);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    const char* const name = slot_name(slot);
    throw OutOfMemoryError("out of device memory allocating " + std::to_string(cap) + " bytes (" +
                           std::to_string(cap >> 20) + " MiB) of CUDA scratch for the " + name +
                           " on cuda:" + std::to_string(device_) + "; try a smaller batch_size");
  }
  MPX_CUDA_CHECK(e);
  b.p = p;
  b.bytes = cap;
  on_alloc_(cap);
  return p;
}

void Context::begin_capture() {
  MPX_CHECK_MSG(!capturing_, "graph_begin_capture: a capture is already in progress on cuda:" +
                                 std::to_string(device_));
  MPX_CUDA_CHECK(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

int Context::end_capture() {
  MPX_CHECK_MSG(capturing_, "graph_end_capture on cuda:" + std::to_string(device_) +
                                " without a capture in progress (none was begun, or an error ended it)");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  MPX_CUDA_CHECK(cudaStreamEndCapture(stream_.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  log_failure("cudaGraphDestroy", cudaGraphDestroy(graph));  // the executable graph is a copy
  MPX_CUDA_CHECK(e);
  graphs_.push_back(exec);
  return static_cast<int>(graphs_.size()) - 1;
}

void Context::launch_graph(int id) {
  MPX_CHECK_MSG(id >= 0 && static_cast<size_t>(id) < graphs_.size(),
                "graph_launch: no graph " + std::to_string(id) + " on cuda:" + std::to_string(device_) + " (" +
                    std::to_string(graphs_.size()) + " captured)");
  MPX_CHECK_MSG(!capturing_, "graph_launch: not allowed during a graph capture");
  MPX_CUDA_CHECK(cudaGraphLaunch(graphs_[static_cast<size_t>(id)], stream_.get()));
}

void Context::abort_capture() noexcept {
  if (!capturing_) return;
  capturing_ = false;
  // An error inside the capture invalidates it: ending it then fails
  // (cudaErrorStreamCaptureInvalidated) and returns no graph, but it does end it.
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_.get(), &graph);
  if (graph) log_failure("cudaGraphDestroy (abandoned capture)", cudaGraphDestroy(graph));
  if (e != cudaSuccess) spdlog::debug("CUDA: ending the abandoned capture: {}", cudaGetErrorString(e));
  cudaGetLastError();  // the capture's errors are not sticky; clear the last-error slot
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_.get(), &st) == cudaSuccess && st != cudaStreamCaptureStatusNone)
    spdlog::error("CUDA: the stream of cuda:{} is still capturing after the capture was abandoned", device_);
}

void Context::fail_in_capture(const std::string& what) {
  abort_capture();
  throw Error("CUDA graph capture on cuda:" + std::to_string(device_) + ": " + what +
              " is not allowed while capturing; the capture was abandoned. Run the sequence once "
              "uncaptured with the same shapes (the warm-up) before graph_begin_capture.");
}

unsigned Context::grid_for(int64_t n, int threads) const {
  const int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(prop_.multiProcessorCount) * 32;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks, cap)));
}

cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: throw Error(std::string("cuDNN: no data type for ") + dtype_name(t));
  }
}

cudaDataType_t cuda_dtype(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: throw Error(std::string("cuBLAS: no data type for ") + dtype_name(t));
  }
}

}  // namespace mpx::cuda
