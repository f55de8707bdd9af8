// SPDX-License-Identifier: MIT
// CUDA device discovery for `mpx devices` and `device: auto`, and the error
// thrower of check.h.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/check.h"

namespace mpx {
namespace cuda {

void throw_cuda_error(const char* lib, const char* stmt, const char* file, int line, const std::string& what) {
  throw CudaError(fmt::format("{} call failed on device {}: {} ({}:{}): {}", lib, current_device(), stmt, file,
                              line, what));
}

}  // namespace cuda

int cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::vector<DeviceInfo> cuda_devices_impl() {
  std::vector<DeviceInfo> out;
  const int n = cuda_device_count_impl();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    MPX_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    DeviceInfo d;
    d.name = fmt::format("cuda:{}", i);
    d.compute_capability = prop.major * 10 + prop.minor;
    d.native_f16 = d.compute_capability >= 70;
    d.native_bf16 = d.compute_capability >= 80;
    d.description = fmt::format("{}, compute capability {}.{}, {:.1f} GiB, {} SMs", prop.name, prop.major,
                                prop.minor, static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024 * 1024),
                                prop.multiProcessorCount);
    out.push_back(d);
  }
  return out;
}

// create_cuda_backend() is in backend.cpp, beside CudaBackend.

}  // namespace mpx
