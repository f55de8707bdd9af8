// SPDX-License-Identifier: MIT
// The CPU kernels built for the baseline x86-64 ISA, AVX2 and AVX-512 (chosen at run time
// by cpuid; MPX_CPU_BASELINE=1 forces the baseline build, MPX_CPU_POOL_ISA=avx2 caps max
// pooling at AVX2, as CTest's test_backend_isa_pool_avx2 does): the chosen build and the
// baseline give the same bits, and both match the float64 reference, including the "first
// maximum, NaN wins" rule.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "support/backend_check.h"

using namespace mpx;

namespace {

struct Baseline {
  explicit Baseline(bool on) { on ? setenv("MPX_CPU_BASELINE", "1", 1) : unsetenv("MPX_CPU_BASELINE"); }
  ~Baseline() { unsetenv("MPX_CPU_BASELINE"); }
};

}  // namespace

TEST_CASE("tiled max pooling: the chosen and the baseline builds give the same bits", "[backend][pool][isa]") {
  support::CpuDev d;
  Rng rng(31);
  const DType t = DType::F32;
  for (const auto& dims : std::vector<std::array<int64_t, 5>>{
           {4, 26, 26, 32, 2}, {2, 9, 7, 64, 2}, {3, 9, 9, 300, 3}, {2, 8, 8, 5, 2}, {1, 7, 6, 17, 2}}) {
    const int64_t N = dims[0], H = dims[1], W = dims[2], C = dims[3], k = dims[4];
    INFO("x [" << N << "," << H << "," << W << "," << C << "], window " << k);
    PoolParams p;
    p.kind = PoolKind::Max;
    p.R = p.S = static_cast<int>(k);
    p.stride_h = p.stride_w = static_cast<int>(k);
    const int64_t P = p.out_h(static_cast<int>(H)), Q = p.out_w(static_cast<int>(W));
    std::vector<float> xv, dyv;
    const Tensor x = d.rand(rng, t, Shape{N, H, W, C}, &xv);
    // Ties and NaN in a few windows: the first maximum takes dy, a NaN wins.
    xv[1] = xv[0];
    xv[static_cast<size_t>(C + 3)] = support::kNaN;
    d.put(x, xv);
    const Tensor dy = d.rand(rng, t, Shape{N, P, Q, C}, &dyv);
    std::vector<float> y[2], dx[2];
    for (int base = 0; base < 2; ++base) {
      Baseline b(base == 1);
      const Tensor yt = d.make(t, Shape{N, P, Q, C});
      const Tensor dxt = d.make(t, Shape{N, H, W, C});
      d.be->pool_forward(p, x, yt);
      d.be->pool_backward(p, x, yt, dy, dxt);
      y[base] = d.get(yt);
      dx[base] = d.get(dxt);
    }
    support::check_exact("pool forward, AVX2 vs baseline", y[0], y[1]);
    support::check_exact("pool backward, AVX2 vs baseline", dx[0], dx[1]);
    // And the maxima against the reference, except the one window holding the NaN (x at
    // h 0, w 1, channel 3: output 3), where the backend's rule makes the output NaN.
    const ref::Vec want = ref::pool_forward(p, N, H, W, C, support::widen(xv));
    REQUIRE(want.size() == y[0].size());
    CHECK(std::isnan(y[0][3]));
    int mismatches = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (i != 3 && y[0][i] != static_cast<float>(want[i])) ++mismatches;
    CHECK(mismatches == 0);
  }
}
