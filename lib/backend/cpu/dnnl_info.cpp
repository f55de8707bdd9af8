// SPDX-License-Identifier: MIT
// Which oneDNN this process runs: the version the loaded library reports and the file it
// was loaded from (docs/cpu-performance.md, "Which oneDNN").
#include <dlfcn.h>

#include <dnnl.hpp>

#include <fmt/format.h>

#include <string>

#include "backend/cpu/context.h"

namespace mpx::cpu {

std::string dnnl_description() {
  const dnnl_version_t* v = dnnl_version();
  std::string path = "unknown path";
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&dnnl_version), &info) != 0 && info.dli_fname) path = info.dli_fname;
  const std::string hash = v->hash ? v->hash : "N/A";
  std::string mismatch;
  if (v->major != DNNL_VERSION_MAJOR || v->minor != DNNL_VERSION_MINOR)
    mismatch = fmt::format("; NOT the {}.{}.{} this mpx was compiled against", DNNL_VERSION_MAJOR,
                           DNNL_VERSION_MINOR, DNNL_VERSION_PATCH);
  return fmt::format("oneDNN {}.{}.{} (commit {}; {}{})", v->major, v->minor, v->patch, hash, path, mismatch);
}

}  // namespace mpx::cpu
