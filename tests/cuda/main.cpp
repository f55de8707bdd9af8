// SPDX-License-Identifier: MIT
// Entry point of mpx_cuda_tests: exits 77 ("skipped", CTest SKIP_RETURN_CODE) with
// "skipped: no CUDA device" and the name of every test case where there is no usable
// GPU, so ctest lists the CUDA tests as skipped by name, never as passed; and 77 too
// when every test case that ran skipped itself (support/skip.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "support/skip.h"

int main(int argc, char* argv[]) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("skipped: no CUDA device (%s); tests not run:\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    for (const Catch::TestCase& t : Catch::getRegistryHub().getTestCaseRegistry().getAllTests())
      std::printf("  %s\n", t.name.c_str());
    return 77;
  }
  spdlog::set_level(spdlog::level::warn);
  return support::exit_code_with_skips(Catch::Session().run(argc, argv));
}
