// SPDX-License-Identifier: MIT
// The CPU kernels' own tests (few-channel convolutions, GEMM weight gradient, few-output dense
// loops): a convolution case (shape, filter, Keras-style padding that may differ before and
// after), the kernels' geometry of it, random values of a dtype, their 16-bit storage, and an
// OpenMP thread count for a scope.
#pragma once

#include <omp.h>

#include <cstdint>
#include <vector>

#include "backend/cpu/conv/conv_loops.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/reference.h"

namespace support {

struct ConvCase {
  const char* name;
  int64_t N, H, W, C, K;
  int R, S, pt, pl, pb, pr;

  mpx::Conv2dParams params() const {
    mpx::Conv2dParams p;
    p.R = R, p.S = S, p.pad_top = pt, p.pad_left = pl, p.pad_bottom = pb, p.pad_right = pr;
    return p;
  }
};

/// The shapes the few-channel kernels' tests run (conv_fwd_small, conv_wgrad_small): 1 to 4
/// channels, 16/32/64 filters, 1x1 to 5x5, every padding, a tall image, a single output column.
inline std::vector<ConvCase> few_channel_cases() {
  return {
      {"MNIST-like 3x3 valid, C=1, K=32", 3, 12, 11, 1, 32, 3, 3, 0, 0, 0, 0},
      {"CIFAR-like 3x3 same, C=3, K=64", 2, 9, 10, 3, 64, 3, 3, 1, 1, 1, 1},
      {"5x5 same, C=2, K=16", 2, 7, 6, 2, 16, 5, 5, 2, 2, 2, 2},
      {"1x1, C=4, K=32", 3, 5, 4, 4, 32, 1, 1, 0, 0, 0, 0},
      {"2x2 same (padding after), C=3, K=16", 2, 5, 7, 3, 16, 2, 2, 0, 0, 1, 1},
      {"3x3, asymmetric padding, C=4, K=64", 1, 6, 9, 4, 64, 3, 3, 2, 0, 1, 2},
      {"a tall image: many rows per thread, C=1, K=16", 1, 70, 5, 1, 16, 3, 3, 1, 1, 1, 1},
      {"a single output column, C=1, K=16", 2, 6, 3, 1, 16, 3, 3, 0, 0, 0, 0},
      {"3x3 same, C=1, K=64: the unrolled one-channel taps, 64 filters", 2, 8, 7, 1, 64, 3, 3, 1, 1, 1, 1},
  };
}

/// The CPU kernels' geometry of a stride-1 case with output dims d.
inline mpx::cpu::conv_detail::Geo stride1_geo(const ConvCase& c, const ref::ConvDims& d) {
  mpx::cpu::conv_detail::Geo g{};
  g.N = c.N, g.H = c.H, g.W = c.W, g.C = c.C, g.K = c.K, g.R = c.R, g.S = c.S, g.P = d.P, g.Q = d.Q;
  g.sh = g.sw = 1, g.pt = c.pt, g.pl = c.pl;
  return g;
}

/// n values uniform in [-1, 1), each a value of dtype t.
inline std::vector<float> uniform_values(mpx::Rng& rng, int64_t n, mpx::DType t = mpx::DType::F32) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = mpx::round_to(t, static_cast<float>(rng.uniform() * 2.0 - 1.0));
  return v;
}

/// The 16-bit storage of float32 values of dtype t (exact: they are values of t).
inline std::vector<uint16_t> to16(const std::vector<float>& v, mpx::DType t) {
  std::vector<uint16_t> r(v.size());
  mpx::convert(v.data(), mpx::DType::F32, r.data(), t, v.size());
  return r;
}

/// Runs the enclosing scope's OpenMP regions on n threads, then restores the count.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(saved_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

}  // namespace support
