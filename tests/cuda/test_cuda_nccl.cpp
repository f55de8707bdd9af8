// SPDX-License-Identifier: MIT
// The NCCL communicator (lib/dist) on a GPU: a one-rank NCCL job (bootstrapped over
// the single-process communicator) all-reduces device buffers to themselves, bit
// for bit, as the single-process run does. Multi-rank NCCL runs need mpirun and
// one GPU per rank: README "More than one machine".
#include <catch2/catch.hpp>
#include <cuda_runtime.h>
#include <mpx/config.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dist/communicator.h"
#include "support/skip.h"

TEST_CASE("nccl: a one-rank NCCL all-reduce leaves device buffers unchanged (cuda:0)") {
#if MPX_WITH_NCCL
  auto single = mpx::make_single_communicator();
  auto nccl = mpx::make_nccl_communicator(*single, 0);
  CHECK(nccl->kind() == "nccl");
  CHECK(nccl->world_size() == 1);
  CHECK(nccl->rank() == 0);
  const size_t n = 1 << 20;  // about the arena of a small CNN
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = std::sin(static_cast<float>(i)) * 1e-3f;
  host[7] = INFINITY;  // non-finite values travel as they are (the finiteness verdict is shared)
  float* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  nccl->all_reduce_sum(dev, n);
  std::vector<float> back(n);
  REQUIRE(cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(dev);
  CHECK(back == host);
  double d[2] = {1.5, 2.5};
  nccl->all_reduce_sum(d, 2);  // host doubles go over the bootstrap
  CHECK(d[0] == 1.5);
  CHECK(d[1] == 2.5);
#else
  CHECK_THROWS(mpx::make_nccl_communicator(*mpx::make_single_communicator(), 0));
#endif
}

TEST_CASE("nccl: asynchronous bucketed all-reduce is ordered after and before the compute stream (one rank)",
          "[nccl][async]") {
#if MPX_WITH_NCCL
  auto single = mpx::make_single_communicator();
  auto nccl = mpx::make_nccl_communicator(*single, 0);
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  nccl->set_compute_stream(compute);
  const size_t n = 3 << 18;
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i % 977) * 0.25f, b[i] = -a[i] - 1.0f;
  float* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, n * sizeof(float)) == cudaSuccess);
  float *pa = nullptr, *pb = nullptr;
  REQUIRE(cudaMallocHost(&pa, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMallocHost(&pb, n * sizeof(float)) == cudaSuccess);
  std::copy(a.begin(), a.end(), pa);
  std::copy(b.begin(), b.end(), pb);
  // The compute stream writes a, then b (as two layers' gradients becoming final); each bucket's
  // all-reduce must start after its writer and the read back must wait for every all-reduce.
  for (int round = 0; round < 3; ++round) {
    std::vector<mpx::Communicator::Handle> hs;
    for (size_t k = 0; k < 3; ++k) {
      const size_t off = k * (n / 3), cnt = n / 3;
      const float* src = (round % 2 ? pb : pa) + off;
      REQUIRE(cudaMemcpyAsync(dev + off, src, cnt * sizeof(float), cudaMemcpyHostToDevice, compute) == cudaSuccess);
      hs.push_back(nccl->start_all_reduce_sum(dev + off, cnt));
    }
    for (auto it = hs.rbegin(); it != hs.rend(); ++it) nccl->wait(*it);
    std::vector<float> back(n);
    REQUIRE(cudaMemcpyAsync(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost, compute) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
    CHECK(back == (round % 2 ? b : a));
  }
  cudaFree(dev);
  cudaFreeHost(pa);
  cudaFreeHost(pb);
  nccl->set_compute_stream(nullptr);
  cudaStreamDestroy(compute);
#else
  MPX_SKIP("built without NCCL");
#endif
}

TEST_CASE("nccl: start_all_reduce_sum before set_compute_stream is refused (one rank)", "[nccl][async]") {
#if MPX_WITH_NCCL
  auto single = mpx::make_single_communicator();
  auto nccl = mpx::make_nccl_communicator(*single, 0);
  float* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, 64 * sizeof(float)) == cudaSuccess);
  CHECK_THROWS_WITH(nccl->start_all_reduce_sum(dev, 64), Catch::Contains("before set_compute_stream"));
  nccl->set_compute_stream(nullptr);  // the legacy default stream, set explicitly: accepted
  nccl->wait(nccl->start_all_reduce_sum(dev, 64));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  cudaFree(dev);
#else
  MPX_SKIP("built without NCCL");
#endif
}
