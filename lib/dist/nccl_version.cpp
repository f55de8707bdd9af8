// SPDX-License-Identifier: MIT
// NCCL's versions for the start-up log and `mpx devices` (backend/versions.h): the one
// in the header mpx was built with and the one the loaded library reports.
#include <mpx/config.hpp>

#include "dist/communicator.h"
#if MPX_WITH_NCCL
#include <nccl.h>
#endif

namespace mpx {

void add_nccl_versions(CudaLibraryVersions& v) {
#if MPX_WITH_NCCL
  v.nccl_built = NCCL_VERSION_CODE;
  int loaded = 0;
  v.nccl = ncclGetVersion(&loaded) == ncclSuccess ? loaded : 0;
#else
  v.nccl_built = 0;
  v.nccl = 0;
#endif
}

}  // namespace mpx
