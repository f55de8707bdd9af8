// SPDX-License-Identifier: MIT
// The Context of the CUDA backend: device, stream, cuDNN/cuBLASLt handles, the
// pinned flag word, the grow-once scratch slots and the plan cache (context.h).
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

Context::Context(int device, std::function<void(size_t)> on_alloc, std::function<void(size_t)> on_free)
    : device_(device), on_alloc_(std::move(on_alloc)), on_free_(std::move(on_free)) {
  MPX_CUDA_CHECK(cudaSetDevice(device));
  MPX_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device));
  MPX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MPX_CUDNN_CHECK(cudnnCreate(&cudnn_));
  MPX_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
  MPX_CUBLAS_CHECK(cublasLtCreate(&cublaslt_));
  MPX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_flag_), sizeof(int)));
  MPX_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_flag_), sizeof(int)));
  size_t mb = 512;
  if (const char* e = std::getenv("MPX_CUDA_WORKSPACE_MB")) {
    try {
      mb = static_cast<size_t>(std::stoul(e));
    } catch (...) {
      spdlog::warn("MPX_CUDA_WORKSPACE_MB='{}' is not a number; using 512", e);
    }
  }
  workspace_budget_ = mb << 20;
}

Context::~Context() {
  log_failure("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
  plans_.clear();
  for (Block& b : slots_) {
    if (b.p) {
      log_failure("cudaFree (scratch)", cudaFree(b.p));
      on_free_(b.bytes);
    }
  }
  log_failure("cudaFree (flag)", cudaFree(device_flag_));
  log_failure("cudaFreeHost (flag)", cudaFreeHost(host_flag_));
  if (cublaslt_) {
    const cublasStatus_t s = cublasLtDestroy(cublaslt_);
    if (s != CUBLAS_STATUS_SUCCESS) spdlog::error("cuBLASLt: cublasLtDestroy failed: {}", cublasGetStatusString(s));
  }
  if (cudnn_) {
    const cudnnStatus_t s = cudnnDestroy(cudnn_);
    if (s != CUDNN_STATUS_SUCCESS) spdlog::error("cuDNN: cudnnDestroy failed: {}", cudnnGetErrorString(s));
  }
  log_failure("cudaStreamDestroy", cudaStreamDestroy(stream_));
}

void* Context::scratch(Slot slot, size_t bytes) {
  Block& b = slots_[static_cast<size_t>(slot)];
  if (bytes <= b.bytes && b.p) return b.p;
  if (b.p) {
    // Queued work may still read the old buffer.
    MPX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    MPX_CUDA_CHECK(cudaFree(b.p));
    on_free_(b.bytes);
    b.p = nullptr;
    b.bytes = 0;
  }
  const size_t cap = std::max<size_t>((bytes + 255) / 256 * 256, 256);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, cap);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    static const char* names[] = {"padded convolution input", "padded input gradient", "16-bit weight gradient",
                                  "reduction partials", "batch-norm coefficients", "per-row results",
                                  "cuDNN/cuBLASLt workspace"};
    throw OutOfMemoryError("out of device memory allocating " + std::to_string(cap) + " bytes (" +
                           std::to_string(cap >> 20) + " MiB) of CUDA scratch for the " + names[slot] +
                           " on cuda:" + std::to_string(device_) + "; try a smaller batch_size");
  }
  MPX_CUDA_CHECK(e);
  b.p = p;
  b.bytes = cap;
  on_alloc_(cap);
  return p;
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
