// SPDX-License-Identifier: MIT
// create_backend(): the one place that knows which backends this build has
// (explicit registration, no static registrars).
#include <mpx/config.hpp>

#include "backend/backend.h"
#include "core/error.h"

namespace mpx {

std::unique_ptr<Backend> create_cpu_backend(const BackendOptions& options);
#if MPX_WITH_CUDA
std::unique_ptr<Backend> create_cuda_backend(int device, const BackendOptions& options);
int cuda_device_count_impl();
std::vector<DeviceInfo> cuda_devices_impl();
CudaLibraryVersions cuda_library_versions_impl();
#endif

std::unique_ptr<Backend> create_backend(const std::string& device, [[maybe_unused]] const BackendOptions& options) {
  if (device == "cpu") return create_cpu_backend(options);
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
#if MPX_WITH_CUDA
    int index = 0;
    if (device.size() > 5) {
      try {
        index = std::stoi(device.substr(5));
      } catch (...) {
        throw ConfigError("device '" + device + "': expected cuda:N with N a GPU index");
      }
    }
    const int n = cuda_device_count_impl();
    if (n == 0) throw ConfigError("device '" + device + "': no CUDA device is present (use device: cpu or auto)");
    if (index < 0 || index >= n)
      throw ConfigError("device '" + device + "': there are " + std::to_string(n) + " CUDA devices (0.." +
                        std::to_string(n - 1) + ")");
    return create_cuda_backend(index, options);
#else
    throw ConfigError("device '" + device + "': mpx was built without CUDA (rebuild with -DMPX_CUDA=ON, or use device: cpu)");
#endif
  }
  throw ConfigError("unknown device '" + device + "' (expected auto, cpu, cuda or cuda:N)");
}

int cuda_device_count() {
#if MPX_WITH_CUDA
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

std::vector<DeviceInfo> cuda_devices() {
#if MPX_WITH_CUDA
  return cuda_devices_impl();
#else
  return {};
#endif
}

CudaLibraryVersions cuda_library_versions() {
#if MPX_WITH_CUDA
  return cuda_library_versions_impl();
#else
  return {};
#endif
}

}  // namespace mpx
