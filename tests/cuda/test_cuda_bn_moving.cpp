// SPDX-License-Identifier: MIT
// The CUDA backend's batch-norm moving variance against a float64 reference computed here
// from the input: tf-keras 2 semantics (docs/keras-parity.md), the unbiased batch variance
// (sum / (M - 1)) on [N,H,W,C] input and the biased one (sum / M) on [N,C]. The comparison
// with the CPU backend in test_cuda_ops.cpp cannot see a rule both backends share.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/cuda_compare.h"

using namespace mpx;
using namespace cudatest;

namespace {

/// Per channel: the biased and the unbiased variance of x [M, C] in float64.
void variances(const std::vector<float>& x, int64_t M, int64_t C, std::vector<double>& biased,
               std::vector<double>& unbiased) {
  std::vector<double> mean(static_cast<size_t>(C), 0.0), sq(static_cast<size_t>(C), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) mean[static_cast<size_t>(c)] += x[static_cast<size_t>(m * C + c)];
  for (double& v : mean) v /= static_cast<double>(M);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const double d = x[static_cast<size_t>(m * C + c)] - mean[static_cast<size_t>(c)];
      sq[static_cast<size_t>(c)] += d * d;
    }
  biased.resize(static_cast<size_t>(C));
  unbiased.resize(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    biased[static_cast<size_t>(c)] = sq[static_cast<size_t>(c)] / static_cast<double>(M);
    unbiased[static_cast<size_t>(c)] = sq[static_cast<size_t>(c)] / static_cast<double>(M - 1);
  }
}

}  // namespace

TEST_CASE("cuda: batch norm moving variance is unbiased on [N,H,W,C] and biased on [N,C] (tf-keras 2)",
          "[cuda][bn]") {
  Rng rng(18);
  // 72 and 24 rows per channel: the two variances are 1.4 % and 4.3 % apart.
  for (const Shape& xs : {Shape{8, 3, 3, 16}, Shape{24, 16}})
    for (DType t : float_dtypes()) {
      const int64_t C = xs[xs.rank - 1], M = xs.numel() / C;
      const std::string what = "batch_norm " + xs.str() + " " + dtype_name(t);
      INFO(what);
      Dual x = random_dual(rng, t, xs, 0.5f, 3.0f);
      Dual gamma = random_dual(rng, DType::F32, Shape{C}, 0.5f, 1.5f);
      Dual beta = random_dual(rng, DType::F32, Shape{C});
      Dual rm = random_dual(rng, DType::F32, Shape{C});
      Dual rv = random_dual(rng, DType::F32, Shape{C}, 0.5f, 2.0f);
      Dual sm = poisoned(DType::F32, Shape{C}), si = poisoned(DType::F32, Shape{C});
      Dual y = poisoned(t, xs);
      const std::vector<float> rv0 = floats(*be().gpu, rv.g);
      const float momentum = 0.9f;
      be().gpu->batch_norm_forward_training(x.g, gamma.g, beta.g, momentum, 1e-3f, rm.g, rv.g, sm.g, si.g, y.g);
      std::vector<double> biased, unbiased;
      variances(floats(*be().gpu, x.g), M, C, biased, unbiased);  // x as the GPU holds it (rounded)
      const std::vector<double>& want_var = xs.rank == 4 ? unbiased : biased;
      const std::vector<float> got = floats(*be().gpu, rv.g);
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = static_cast<size_t>(c);
        const double want = momentum * static_cast<double>(rv0[i]) + (1.0 - momentum) * want_var[i];
        const double other_var = xs.rank == 4 ? biased[i] : unbiased[i];
        const double other = momentum * static_cast<double>(rv0[i]) + (1.0 - momentum) * other_var;
        INFO("channel " << c << ": got " << got[i] << ", want " << want << ", the other rule " << other);
        REQUIRE(std::abs(got[i] - want) <= 2e-6 * std::abs(want));
        REQUIRE(std::abs(other - want) > 100 * 2e-6 * std::abs(want));  // the check tells the rules apart
      }
    }
}
