// SPDX-License-Identifier: MIT
// Entry point of mpx_cuda_tests: exits 77 ("skipped", CTest SKIP_RETURN_CODE) with
// "skipped: no CUDA device" and the name of every test case only where there is no
// GPU (no driver, or a driver that finds no device); a driver too old for the
// runtime, or any other CUDA start-up error, fails (exit 1) with both versions
// printed (support/cuda_presence.h). Also 77 when every test case that ran skipped
// itself (support/skip.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>

#include "support/cuda_presence.h"
#include "support/skip.h"

namespace {

support::CudaPresence probe() {
  int n = 0, driver = 0, runtime = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  cudaRuntimeGetVersion(&runtime);
  using R = support::DeviceCountResult;
  const R r = e == cudaSuccess                  ? R::Ok
              : e == cudaErrorNoDevice          ? R::NoDevice
              : e == cudaErrorInsufficientDriver ? R::InsufficientDriver
                                                : R::OtherError;
  return support::decide_cuda_presence(r, n, driver, runtime, e == cudaSuccess ? "" : cudaGetErrorString(e));
}

}  // namespace

int main(int argc, char* argv[]) {
  // Listing the test cases needs no GPU (scripts/gpu_check.sh runs them one per process).
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--list", 6) == 0) return Catch::Session().run(argc, argv);
  const support::CudaPresence p = probe();
  if (p.verdict == support::CudaPresence::Skip) {
    std::printf("skipped: %s; tests not run:\n", p.message.c_str());
    for (const Catch::TestCase& t : Catch::getRegistryHub().getTestCaseRegistry().getAllTests())
      std::printf("  %s\n", t.name.c_str());
    return 77;
  }
  if (p.verdict == support::CudaPresence::Fail) {
    std::fprintf(stderr, "mpx_cuda_tests: FAILED before any test: %s\n", p.message.c_str());
    return 1;
  }
  spdlog::set_level(spdlog::level::warn);
  return support::exit_code_with_skips(Catch::Session().run(argc, argv));
}
