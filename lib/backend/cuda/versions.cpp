// SPDX-License-Identifier: MIT
// The CUDA library versions (backend/versions.h): those in the headers mpx was built
// with and those the loaded libraries report. On a GPU machine cuDNN and cuBLAS often
// come from elsewhere (a Python wheel's copies on LD_LIBRARY_PATH), so both are shown.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "backend/backend.h"

namespace mpx {

CudaLibraryVersions cuda_library_versions_impl() {
  CudaLibraryVersions v;
  v.runtime_built = CUDART_VERSION;
  v.cudnn_built = CUDNN_VERSION;
  v.cublaslt_built = CUBLAS_VERSION;
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;  // 0: no driver
  if (cudaRuntimeGetVersion(&v.runtime) != cudaSuccess) v.runtime = 0;
  cudaGetLastError();
  v.cudnn = static_cast<int>(cudnnGetVersion());
  v.cublaslt = static_cast<int>(cublasLtGetVersion());
  return v;
}

}  // namespace mpx
