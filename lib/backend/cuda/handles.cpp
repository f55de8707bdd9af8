// SPDX-License-Identifier: MIT
// Owning wrappers of CUDA / cuDNN / cuBLASLt handles (handles.h).
#include "backend/cuda/handles.h"

#include <spdlog/spdlog.h>

#include "backend/cuda/check.h"

namespace mpx::cuda {

void log_release_failure(const char* what, int status, const char* message) {
  spdlog::error("CUDA: {} failed ({}): {}", what, status, message);
}

namespace {
void check_release(const char* what, cudaError_t e) {
  if (e != cudaSuccess) log_release_failure(what, static_cast<int>(e), cudaGetErrorString(e));
}
}  // namespace

void StreamDeleter::operator()(CUstream_st* s) const { check_release("cudaStreamDestroy", cudaStreamDestroy(s)); }
void EventDeleter::operator()(CUevent_st* e) const { check_release("cudaEventDestroy", cudaEventDestroy(e)); }
void CudnnDeleter::operator()(cudnnContext* h) const {
  const cudnnStatus_t s = cudnnDestroy(h);
  if (s != CUDNN_STATUS_SUCCESS) log_release_failure("cudnnDestroy", static_cast<int>(s), cudnnGetErrorString(s));
}
void CublasLtDeleter::operator()(cublasLtContext* h) const {
  const cublasStatus_t s = cublasLtDestroy(h);
  if (s != CUBLAS_STATUS_SUCCESS)
    log_release_failure("cublasLtDestroy", static_cast<int>(s), cublasGetStatusString(s));
}
void DeviceMemoryDeleter::operator()(void* p) const { check_release("cudaFree", cudaFree(p)); }
void HostMemoryDeleter::operator()(void* p) const { check_release("cudaFreeHost", cudaFreeHost(p)); }

UniqueStream make_stream() {
  cudaStream_t s = nullptr;
  MPX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return UniqueStream(s);
}

UniqueEvent make_event() {
  cudaEvent_t e = nullptr;
  MPX_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return UniqueEvent(e);
}

UniqueCudnn make_cudnn(cudaStream_t stream) {
  cudnnHandle_t h = nullptr;
  MPX_CUDNN_CHECK(cudnnCreate(&h));
  UniqueCudnn owned(h);  // owned before the next call can throw
  MPX_CUDNN_CHECK(cudnnSetStream(h, stream));
  return owned;
}

UniqueCublasLt make_cublaslt() {
  cublasLtHandle_t h = nullptr;
  MPX_CUBLAS_CHECK(cublasLtCreate(&h));
  return UniqueCublasLt(h);
}

UniqueDeviceMemory make_device_memory(size_t bytes) {
  void* p = nullptr;
  MPX_CUDA_CHECK(cudaMalloc(&p, bytes));
  return UniqueDeviceMemory(p);
}

UniqueHostMemory make_host_memory(size_t bytes) {
  void* p = nullptr;
  MPX_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return UniqueHostMemory(p);
}

}  // namespace mpx::cuda
