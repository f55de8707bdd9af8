// SPDX-License-Identifier: MIT
// What a device is and can do, the settings a backend starts with, and what a backend
// reports about itself (memory, the kernels and plans it chose, library versions):
// plain data shared by the backends, the trainer and the CLI (docs/design.md, "The
// backend interface").
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace mpx {

struct MemoryStats {
  size_t current_bytes = 0;  // our own accounting: live Buffers
  size_t peak_bytes = 0;
  size_t device_total_bytes = 0;  // 0 where unknown (CPU)
  size_t device_free_bytes = 0;
};

struct DeviceInfo {
  std::string name;         // "cpu" / "cuda:0"
  std::string description;  // "AMD EPYC (2 threads, avx2 f16c)" / "NVIDIA H200, cc 9.0, 141 GiB"
  bool native_bf16 = false;     // bf16 math faster than f32 (AMX-BF16 CPU, cc >= 8.0 GPU)
  bool native_f16 = false;      // f16 math faster than f32 (Tensor Cores, cc >= 7.0)
  int compute_capability = 0;   // GPUs: 10*major+minor; 0 on the CPU (or a GPU not visible here)
  /// CPU: the path of 16-bit convolutions and dense layers, per dtype: "native bf16
  /// (avx512_core_amx)" or "widened to float32 (...)" (docs/precision.md); empty on GPUs.
  std::string math_bf16, math_f16;

  /// The one statement of what a GPU can do, read by policy `auto`, `mpx validate`'s
  /// Tensor Core warnings and the CUDA backend's supports(): float16 Tensor Cores from
  /// compute capability 7.0, bfloat16 ones (and cuDNN/cuBLASLt bfloat16 kernels) from 8.0.
  static DeviceInfo with_cc(int cc) {
    DeviceInfo d;
    d.compute_capability = cc;
    return d;
  }
  bool known_gpu() const { return compute_capability > 0; }
  bool f16_tensor_cores() const { return compute_capability >= 70; }
  bool bf16_tensor_cores() const { return compute_capability >= 80; }
};

/// The library kernel a backend chose for one op and shape (CPU: oneDNN's implementation).
struct KernelChoice {
  std::string op;    // "convolution backward weights for x [256, 32, 32, 64], w [128, 3, 3, 64]"
  std::string impl;  // the library's name for it, e.g. "brgconv:avx2"
};

/// How the convolutions and dense layers of one 16-bit dtype ran (CPU backend; `mpx bench`).
struct Math16Report {
  std::string dtype;    // "bfloat16" / "float16"
  std::string path;     // "native", "widened" or "mixed" (some ops native, the others widened)
  std::string detail;   // "native bf16 (avx512_core_amx)" / "widened to float32 (...)"
  int native_ops = 0;   // distinct ops (op and shape) on native 16-bit math: oneDNN's kernels, mpx's AMX kernel
  int widened_ops = 0;  // distinct ops widened to float32
};

/// Whether a backend can run an op with given shapes, and why not (supports_conv2d).
struct Support {
  bool ok = true;
  std::string reason;  // empty when ok
  /// Convolutions: whether the backward data op (the input gradient) runs too, and why not.
  /// A first layer never computes its input gradient, so only a layer that does needs it.
  bool input_grad = true;
  std::string input_grad_reason;  // empty when input_grad

  /// Not supported, and why.
  static Support refused(std::string why) {
    Support s;
    s.ok = false;
    s.reason = std::move(why);
    return s;
  }
};

/// One cuDNN / cuBLASLt plan as the CUDA backend chose it (`mpx bench --json`; docs/gpu.md).
struct PlanReport {
  std::string library;  // "cudnn" or "cublaslt"
  std::string op;       // the op, its dtype and shapes
  std::string algo;     // the algorithm
  std::string math;     // the math type
  size_t workspace_bytes = 0;
};

/// Start-up settings of a backend that come from the config (`cuda.*` keys).
/// cpu.winograd (docs/cpu-performance.md, "Winograd convolution").
enum class WinogradMode { Auto, Off, F4, F2 };

struct BackendOptions {
  /// Budget of the cuDNN/cuBLASLt workspace on a GPU (cuda.workspace_mb); unused on the CPU.
  size_t cuda_workspace_bytes = size_t{512} << 20;
  /// cuda.conv_algo: measure the convolution algorithms (search) instead of taking cuDNN's
  /// heuristic ranking (the default, repeatable from run to run).
  bool cuda_conv_search = false;
  /// cuda.deterministic: deterministic convolution algorithms only.
  bool cuda_deterministic = false;
  /// cpu.winograd; MPX_CONV_WINOGRAD, when set, takes its place.
  WinogradMode cpu_winograd = WinogradMode::Auto;
};

/// Versions of the CUDA libraries: those this mpx was built against and those loaded at run
/// time (cuDNN, cuBLASLt and NCCL encode major*10000 + minor*100 + patch from cuDNN 9 and
/// cuBLAS 12 on; the driver and runtime 1000*major + 10*minor). 0 = unknown / not present.
struct CudaLibraryVersions {
  int driver = 0, runtime = 0, runtime_built = 0;
  int cudnn = 0, cudnn_built = 0;
  int cublaslt = 0, cublaslt_built = 0;
  int nccl = 0, nccl_built = 0;  // filled by lib/dist (nccl_versions())
};

/// The versions on this machine (all zero without CUDA; runtime versions zero without a driver).
CudaLibraryVersions cuda_library_versions();

}  // namespace mpx
