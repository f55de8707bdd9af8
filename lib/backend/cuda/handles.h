// SPDX-License-Identifier: MIT
// Owning wrappers of CUDA, cuDNN and cuBLASLt handles (streams, events, library
// handles, device and page-locked memory): each one releases its handle in its
// destructor, so a constructor that throws half-way through (Context, Staging)
// frees what it had already created. Release failures are logged, never thrown
// (destructors may run during unwinding).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <memory>
#include <type_traits>

namespace mpx::cuda {

/// Logs a failed release (handles.cpp); used by the deleters below.
void log_release_failure(const char* what, int status, const char* message);

struct StreamDeleter {
  void operator()(CUstream_st* s) const;
};
struct EventDeleter {
  void operator()(CUevent_st* e) const;
};
struct CudnnDeleter {
  void operator()(cudnnContext* h) const;
};
struct CublasLtDeleter {
  void operator()(cublasLtContext* h) const;
};
struct DeviceMemoryDeleter {
  void operator()(void* p) const;
};
struct HostMemoryDeleter {
  void operator()(void* p) const;
};

using UniqueStream = std::unique_ptr<CUstream_st, StreamDeleter>;
using UniqueEvent = std::unique_ptr<CUevent_st, EventDeleter>;
using UniqueCudnn = std::unique_ptr<cudnnContext, CudnnDeleter>;
using UniqueCublasLt = std::unique_ptr<cublasLtContext, CublasLtDeleter>;
using UniqueDeviceMemory = std::unique_ptr<void, DeviceMemoryDeleter>;
using UniqueHostMemory = std::unique_ptr<void, HostMemoryDeleter>;

static_assert(std::is_same_v<cudaStream_t, CUstream_st*>, "cudaStream_t is a pointer to CUstream_st");
static_assert(std::is_same_v<cudaEvent_t, CUevent_st*>, "cudaEvent_t is a pointer to CUevent_st");
static_assert(std::is_same_v<cudnnHandle_t, cudnnContext*>, "cudnnHandle_t is a pointer to cudnnContext");
static_assert(std::is_same_v<cublasLtHandle_t, cublasLtContext*>, "cublasLtHandle_t is a pointer");

/// Creators: each throws CudaError (check.h) on failure and owns the result from then on.
UniqueStream make_stream();                        // non-blocking
UniqueEvent make_event();                          // timing disabled
UniqueCudnn make_cudnn(cudaStream_t stream);       // bound to `stream`
UniqueCublasLt make_cublaslt();
UniqueDeviceMemory make_device_memory(size_t bytes);
UniqueHostMemory make_host_memory(size_t bytes);  // page-locked, portable

}  // namespace mpx::cuda
