// SPDX-License-Identifier: MIT
// Formatting and comparison of CUDA library versions (CudaLibraryVersions, backend.h):
// the start-up log line, `mpx devices`, and the warning when the cuDNN loaded at run time
// is older than the one mpx was built against (docs/gpu.md, "Library versions").
#pragma once

#include <string>

#include "backend/backend.h"

namespace mpx {

/// cuDNN's version number as "9.19.0": major*10000+minor*100+patch from cuDNN 9 on,
/// major*1000+minor*100+patch before; "unknown" for 0.
inline std::string format_cudnn_version(int v) {
  if (v <= 0) return "unknown";
  const int major = v >= 90000 ? v / 10000 : v / 1000;
  const int minor = v >= 90000 ? (v % 10000) / 100 : (v % 1000) / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

/// cuBLASLt's (from cuBLAS 11.0: major*10000+minor*100+patch) or NCCL's (from 2.9: the same
/// encoding) version as "13.1.0"; "unknown" for 0.
inline std::string format_library_version(int v) {
  if (v <= 0) return "unknown";
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

/// The CUDA driver or runtime version (1000*major + 10*minor) as "13.0"; "none" for 0.
inline std::string format_cuda_version(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

/// The warning to log when the loaded cuDNN is older than the one built against; "" when
/// it is not (or either is unknown).
inline std::string cudnn_version_warning(int built, int loaded) {
  if (built <= 0 || loaded <= 0 || loaded >= built) return "";
  return "cuDNN " + format_cudnn_version(loaded) + " is loaded, older than the cuDNN " + format_cudnn_version(built) +
         " mpx was built against: algorithms or fixes of the newer version may be missing and results may "
         "differ. Put cuDNN " + format_cudnn_version(built) +
         " or newer first on the library path (LD_LIBRARY_PATH), or rebuild mpx against the loaded one.";
}

/// One line: "driver 13.0, runtime 13.0 (built 13.0), cuDNN 9.19.0 (built 9.19.0), ...".
inline std::string describe_versions(const CudaLibraryVersions& v) {
  return "CUDA driver " + format_cuda_version(v.driver) + ", runtime " + format_cuda_version(v.runtime) +
         " (built with " + format_cuda_version(v.runtime_built) + "), cuDNN " + format_cudnn_version(v.cudnn) +
         " (built with " + format_cudnn_version(v.cudnn_built) + "), cuBLASLt " +
         format_library_version(v.cublaslt) + " (built with " + format_library_version(v.cublaslt_built) +
         "), NCCL " + (v.nccl_built > 0 ? format_library_version(v.nccl) + " (built with " +
                                              format_library_version(v.nccl_built) + ")"
                                        : std::string("not built in"));
}

}  // namespace mpx
