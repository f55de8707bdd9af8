// SPDX-License-Identifier: MIT
// Whether mpx_cuda_tests may run, skip or must fail (docs/testing.md "The CUDA tests and the GPU check"):
// the decision from what cudaGetDeviceCount, cudaDriverGetVersion and
// cudaRuntimeGetVersion said, without CUDA types, so it is tested on any machine
// (test_backend_cuda_presence.cpp). Skipped only where there is no GPU: no driver
// installed at all, or a driver that finds no device. A driver older than the
// runtime, or any other error, is a failure that names both versions.
#pragma once

#include <string>

namespace support {

/// What cudaGetDeviceCount returned, reduced to the cases the decision tells apart.
enum class DeviceCountResult { Ok, NoDevice, InsufficientDriver, OtherError };

struct CudaPresence {
  enum Verdict { Run, Skip, Fail } verdict = Fail;
  std::string message;  // why it skips or fails ("" to run)
};

/// "13.0" from CUDA's 1000 * major + 10 * minor encoding; "none" for 0 (no driver).
inline std::string cuda_version_string(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

/// `driver`: cudaDriverGetVersion (0 when no driver is installed); `runtime`:
/// cudaRuntimeGetVersion; `error`: the error string of cudaGetDeviceCount.
inline CudaPresence decide_cuda_presence(DeviceCountResult r, int count, int driver, int runtime,
                                         const std::string& error) {
  const std::string versions =
      "driver supports CUDA " + cuda_version_string(driver) + ", runtime is CUDA " + cuda_version_string(runtime);
  if (r == DeviceCountResult::Ok && count > 0) return {CudaPresence::Run, ""};
  if (r == DeviceCountResult::Ok) return {CudaPresence::Skip, "no CUDA device (0 devices; " + versions + ")"};
  if (r == DeviceCountResult::NoDevice) return {CudaPresence::Skip, "no CUDA device (" + error + "; " + versions + ")"};
  if (driver <= 0) return {CudaPresence::Skip, "no CUDA device (no NVIDIA driver installed: " + error + ")"};
  if (r == DeviceCountResult::InsufficientDriver || driver < runtime)
    return {CudaPresence::Fail, "the NVIDIA driver is too old for this build: " + versions + " (" + error +
                                    "); install a driver for CUDA " + cuda_version_string(runtime) +
                                    " or newer, or build with the CUDA toolkit the driver supports"};
  return {CudaPresence::Fail, "cudaGetDeviceCount failed on a machine with an NVIDIA driver: " + error + " (" +
                                  versions + "); the GPU is there but unusable, check nvidia-smi"};
}

}  // namespace support
