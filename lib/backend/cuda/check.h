// SPDX-License-Identifier: MIT
// Error checks at the CUDA / cuDNN / cuBLAS boundary: one generic macro, three
// derived ones. A failure throws mpx::CudaError carrying the statement, file:line,
// the library's own error string and the device id.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace mpx::cuda {

[[noreturn]] void throw_cuda_error(const char* lib, const char* stmt, const char* file, int line,
                                   const std::string& what);

inline int current_device() {
  int d = -1;
  cudaGetDevice(&d);
  return d;
}

}  // namespace mpx::cuda

#define MPX_CHECK_GEN(lib, stmt, ok, errstr)                                                   \
  do {                                                                                         \
    auto mpx_status_ = (stmt);                                                                 \
    if (mpx_status_ != (ok)) ::mpx::cuda::throw_cuda_error(lib, #stmt, __FILE__, __LINE__,     \
                                                           errstr(mpx_status_));               \
  } while (0)

#define MPX_CUDA_CHECK(stmt) MPX_CHECK_GEN("CUDA", stmt, cudaSuccess, cudaGetErrorString)
#define MPX_CUDNN_CHECK(stmt) MPX_CHECK_GEN("cuDNN", stmt, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)
#define MPX_CUBLAS_CHECK(stmt) MPX_CHECK_GEN("cuBLAS", stmt, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)

/// After every kernel launch (llm.c, Caffe's CUDA_POST_KERNEL_CHECK): the launch error now, and with
/// MPX_CUDA_SYNC_DEBUG (CMake option) the execution error too, so a fault points at its launch.
#if MPX_CUDA_SYNC_DEBUG
#define MPX_CUDA_LAUNCH_CHECK(stream)               \
  do {                                              \
    MPX_CUDA_CHECK(cudaGetLastError());             \
    MPX_CUDA_CHECK(cudaStreamSynchronize(stream));  \
  } while (0)
#else
#define MPX_CUDA_LAUNCH_CHECK(stream)   \
  do {                                  \
    (void)(stream);                     \
    MPX_CUDA_CHECK(cudaGetLastError()); \
  } while (0)
#endif
