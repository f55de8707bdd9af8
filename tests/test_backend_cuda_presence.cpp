// SPDX-License-Identifier: MIT
// When mpx_cuda_tests runs, skips or fails (support/cuda_presence.h, docs/testing.md):
// skipped only without a GPU; a driver older than the runtime fails naming both versions.
#include <catch2/catch.hpp>

#include "support/cuda_presence.h"

using support::CudaPresence;
using support::decide_cuda_presence;
using R = support::DeviceCountResult;

TEST_CASE("cuda presence: a device runs the tests", "[cuda_presence]") {
  const CudaPresence p = decide_cuda_presence(R::Ok, 1, 13000, 13000, "");
  CHECK(p.verdict == CudaPresence::Run);
  CHECK(p.message.empty());
}

TEST_CASE("cuda presence: no device or no driver skips", "[cuda_presence]") {
  CHECK(decide_cuda_presence(R::Ok, 0, 13000, 13000, "").verdict == CudaPresence::Skip);
  const CudaPresence nodev = decide_cuda_presence(R::NoDevice, 0, 13000, 13000, "no CUDA-capable device is detected");
  CHECK(nodev.verdict == CudaPresence::Skip);
  CHECK(nodev.message.find("no CUDA-capable device is detected") != std::string::npos);
  // No driver installed: the runtime reports an insufficient driver, cudaDriverGetVersion 0.
  const CudaPresence nodriver = decide_cuda_presence(R::InsufficientDriver, 0, 0, 13000, "insufficient");
  CHECK(nodriver.verdict == CudaPresence::Skip);
  CHECK(nodriver.message.find("no NVIDIA driver") != std::string::npos);
}

TEST_CASE("cuda presence: a driver older than the runtime fails with both versions", "[cuda_presence]") {
  const CudaPresence p = decide_cuda_presence(R::InsufficientDriver, 0, 12040, 13000,
                                              "CUDA driver version is insufficient for CUDA runtime version");
  REQUIRE(p.verdict == CudaPresence::Fail);
  CHECK(p.message.find("driver supports CUDA 12.4") != std::string::npos);
  CHECK(p.message.find("runtime is CUDA 13.0") != std::string::npos);
  CHECK(p.message.find("insufficient") != std::string::npos);
}

TEST_CASE("cuda presence: other start-up errors with a driver fail", "[cuda_presence]") {
  const CudaPresence p = decide_cuda_presence(R::OtherError, 0, 13000, 13000, "initialization error");
  REQUIRE(p.verdict == CudaPresence::Fail);
  CHECK(p.message.find("initialization error") != std::string::npos);
  CHECK(p.message.find("driver supports CUDA 13.0") != std::string::npos);
}

TEST_CASE("cuda presence: version strings", "[cuda_presence]") {
  CHECK(support::cuda_version_string(13000) == "13.0");
  CHECK(support::cuda_version_string(12080) == "12.8");
  CHECK(support::cuda_version_string(0) == "none");
}
