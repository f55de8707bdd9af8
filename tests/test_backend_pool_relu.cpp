// SPDX-License-Identifier: MIT
// Max pooling's backward fused with the backward of the relu that produced its input
// (Backend::max_pool_relu_backward, docs/cpu-performance.md "Max pooling after relu"):
// the same bits as pool_backward followed by activation_backward(relu), in float32,
// bfloat16 and float16, for the tiled kernels (AVX-512, AVX2 and baseline builds) and the general
// loops (overlapping and padded windows), with ties, zeros, negative windows and NaN. And the
// same for global average pooling (Backend::global_avg_pool_relu_backward).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/half.h"
#include "core/rng.h"

#include "support/backend_check.h"

using namespace mpx;

namespace {

struct Baseline {
  explicit Baseline(bool on) { on ? setenv("MPX_CPU_BASELINE", "1", 1) : unsetenv("MPX_CPU_BASELINE"); }
  ~Baseline() { unsetenv("MPX_CPU_BASELINE"); }
};

struct Case {
  int64_t N, H, W, C;
  int k, stride, pad;  // window k x k, stride, padding top/left (and bottom/right)
  const char* what;
};

std::vector<char> bytes_of(support::CpuDev& d, const Tensor& t) {
  std::vector<char> b(t.bytes());
  d.be->download(b.data(), t);
  return b;
}

}  // namespace

TEST_CASE("max_pool_relu_backward: the bits of pool_backward then relu's backward", "[backend][pool][fuse]") {
  const std::vector<Case> cases = {
      {4, 26, 26, 32, 2, 2, 0, "tiled 2x2/2 (the MNIST shape)"},
      {2, 7, 6, 300, 2, 2, 0, "tiled, uncovered last row/column, channels over a chunk"},
      {3, 9, 11, 48, 2, 2, 0, "tiled, uncovered last row/column, 48 channels (whole float32 vectors only)"},
      {2, 7, 10, 64, 3, 3, 0, "tiled 3x3/3, uncovered last row/column, 64 channels"},
      {3, 9, 9, 5, 3, 2, 0, "overlapping 3x3/2 (general loops)"},
      {2, 7, 7, 6, 2, 2, 1, "padded 2x2/2 (general loops)"},
  };
  for (const DType t : {DType::F32, DType::BF16, DType::F16})
    for (const Case& cs : cases)
      for (int base = 0; base < 2; ++base) {
        INFO(dtype_name(t) << ", " << cs.what << (base ? ", baseline build" : ", the CPU's build"));
        Baseline b(base == 1);
        support::CpuDev d;
        Rng rng(17 + static_cast<uint64_t>(cs.C));
        PoolParams p;
        p.kind = PoolKind::Max;
        p.R = p.S = cs.k;
        p.stride_h = p.stride_w = cs.stride;
        p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = cs.pad;
        const int64_t P = p.out_h(static_cast<int>(cs.H)), Q = p.out_w(static_cast<int>(cs.W));
        std::vector<float> xv, dyv;
        const Tensor x = d.rand(rng, t, Shape{cs.N, cs.H, cs.W, cs.C}, &xv);
        // A relu's output would be >= 0; the op must also follow the two-op rule for any x:
        // ties (the first takes dy), exact zeros of both signs, NaN (wins the window, x > 0
        // false), and a window that is all negative.
        const size_t C = static_cast<size_t>(cs.C), row = static_cast<size_t>(cs.W) * C;
        xv[1] = xv[1 + C] = xv[1 + row] = 0.5f;
        xv[2] = 0.0f, xv[2 + C] = -0.0f, xv[2 + row] = 0.0f, xv[2 + row + C] = -0.0f;
        xv[3 + C] = support::kNaN;
        for (size_t i : {size_t{4}, 4 + C, 4 + row, 4 + row + C}) xv[i] = -0.25f - 0.01f * static_cast<float>(i % 7);
        for (size_t i = 5 * C; i < xv.size(); i += 11) xv[i] = std::fabs(xv[i]);  // more positive hits
        d.put(x, xv);
        const Tensor y = d.make(t, Shape{cs.N, P, Q, cs.C});
        d.be->pool_forward(p, x, y);
        const Tensor dy = d.rand(rng, t, Shape{cs.N, P, Q, cs.C}, &dyv);
        dyv[7] = support::kNaN;
        d.put(dy, dyv);

        const Tensor two = d.make(t, x.shape), fused = d.make(t, x.shape);
        d.be->pool_backward(p, x, y, dy, two);
        const std::vector<float> pooled = d.get(two);
        d.be->activation_backward(Activation::Relu, x, two, two);
        d.be->max_pool_relu_backward(p, x, y, dy, fused);
        const std::vector<char> want = bytes_of(d, two), got = bytes_of(d, fused);
        REQUIRE(want.size() == got.size());
        CHECK(std::memcmp(want.data(), got.data(), want.size()) == 0);
        support::check_exact("fused vs two ops", d.get(fused), d.get(two));
        // Not a vacuous comparison: the relu zeroed some gradients the pool had routed, and
        // some routed gradients survive.
        const std::vector<float> out = d.get(fused);
        int zeroed = 0, kept = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          if (pooled[i] != 0.0f && !(xv[i] > 0.0f)) ++zeroed;
          if (out[i] != 0.0f) ++kept;
        }
        CHECK(zeroed > 0);
        CHECK(kept > 0);

        // With the forward's window positions kept (the tiled geometries): the same y, and
        // both backward ops the same bits as without them.
        const bool tiled = cs.stride == cs.k && cs.pad == 0;
        REQUIRE(d.be->max_pool_keeps_argmax(p, x.shape) == tiled);
        if (!tiled) continue;
        const Tensor am = d.make(DType::U8, y.shape), ya = d.make(t, y.shape);
        d.be->pool_forward(p, x, ya, am);
        CHECK(bytes_of(d, ya) == bytes_of(d, y));
        for (char k : bytes_of(d, am)) REQUIRE(static_cast<unsigned char>(k) < cs.k * cs.k);
        const Tensor two_a = d.make(t, x.shape), fused_a = d.make(t, x.shape);
        d.be->pool_backward(p, x, y, dy, two_a, am);
        support::check_exact("pool_backward from argmax", d.get(two_a), pooled);
        d.be->max_pool_relu_backward(p, x, y, dy, fused_a, am);
        CHECK(bytes_of(d, fused_a) == want);
      }
}

TEST_CASE("max_pool_relu_backward: average pooling and mismatched tensors are refused", "[backend][pool][fuse]") {
  support::CpuDev d;
  PoolParams p;
  p.kind = PoolKind::Avg;
  p.R = p.S = p.stride_h = p.stride_w = 2;
  const Tensor x = d.make(DType::F32, Shape{1, 4, 4, 3}), y = d.make(DType::F32, Shape{1, 2, 2, 3});
  const Tensor dx = d.make(DType::F32, Shape{1, 4, 4, 3});
  CHECK_THROWS_WITH(d.be->max_pool_relu_backward(p, x, y, y, dx), Catch::Contains("needs max pooling"));
  p.kind = PoolKind::Max;
  const Tensor dx16 = d.make(DType::BF16, Shape{1, 4, 4, 3});
  CHECK_THROWS(d.be->max_pool_relu_backward(p, x, y, y, dx16));
  // An argmax must be uint8 of y's shape, for a geometry whose positions the backend keeps.
  const Tensor am = d.make(DType::U8, y.shape), am_f32 = d.make(DType::F32, y.shape);
  const Tensor am_big = d.make(DType::U8, x.shape);
  CHECK_NOTHROW(d.be->pool_forward(p, x, y, am));
  CHECK_THROWS_WITH(d.be->pool_forward(p, x, y, am_f32), Catch::Contains("argmax must be uint8"));
  CHECK_THROWS(d.be->pool_backward(p, x, y, y, dx, am_big));
  p.stride_h = p.stride_w = 1;  // overlapping windows: the general loops, no argmax kept
  const Tensor y3 = d.make(DType::F32, Shape{1, 3, 3, 3}), am3 = d.make(DType::U8, y3.shape);
  CHECK_FALSE(d.be->max_pool_keeps_argmax(p, x.shape));
  CHECK_THROWS_WITH(d.be->pool_forward(p, x, y3, am3), Catch::Contains("keeps no argmax"));
}

TEST_CASE("global_avg_pool_relu_backward: the bits of global_avg_pool_backward then relu's backward",
          "[backend][pool][fuse]") {
  // x, the relu's output: zeros of both signs, negatives, NaN and +inf; dy with a NaN and
  // values whose quotient by H W rounds in 16 bits. Channel counts that leave vector tails.
  for (const DType t : {DType::F32, DType::BF16, DType::F16})
    for (const int64_t C : {int64_t{128}, int64_t{13}, int64_t{3}})
      DYNAMIC_SECTION(dtype_name(t) << ", " << C << " channels") {
        support::CpuDev d;
        Rng rng(static_cast<uint64_t>(61 + C));
        const int64_t N = 3, H = 5, W = 7;
        std::vector<float> xv, dyv;
        Tensor x = d.rand(rng, t, Shape{N, H, W, C}, &xv);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        for (size_t i = 0; i < xv.size(); ++i) {
          if (xv[i] < 0) xv[i] = (i % 3 == 0) ? -0.0f : 0.0f;
          if (i % 41 == 3) xv[i] = -0.5f;
          if (i % 37 == 5) xv[i] = nan;
          if (i % 53 == 9) xv[i] = std::numeric_limits<float>::infinity();
        }
        d.put(x, xv);
        Tensor dy = d.rand(rng, t, Shape{N, C}, &dyv, -3, 3);
        dyv[1] = nan;
        d.put(dy, dyv);
        Tensor fused = d.make(t, Shape{N, H, W, C}), two = d.make(t, Shape{N, H, W, C});
        d.be->global_avg_pool_relu_backward(x, dy, fused);
        d.be->global_avg_pool_backward(dy, two);
        d.be->activation_backward(Activation::Relu, x, two, two);
        CHECK(bytes_of(d, fused) == bytes_of(d, two));
        const std::vector<float> got = d.get(fused);
        // Against the definition, written out: dy times 1 / (H W) in float32, rounded once to
        // t, where x > 0, else 0.
        const float inv = 1.0f / static_cast<float>(H * W);
        int64_t active = 0;
        for (int64_t i = 0; i < N * H * W * C; ++i) {
          const size_t j = static_cast<size_t>(i);
          const float want =
              xv[j] > 0.0f ? round_to(t, dyv[static_cast<size_t>(i / (H * W * C) * C + i % C)] * inv) : 0.0f;
          active += xv[j] > 0.0f;
          INFO("element " << i);
          if (std::isnan(want))
            CHECK(std::isnan(got[j]));
          else
            CHECK(got[j] == want);
        }
        CHECK(active > 0);
        CHECK(active < N * H * W * C);
      }
}

TEST_CASE("global_avg_pool_relu_backward: an x of another shape or dtype than dx is refused", "[backend][pool][fuse]") {
  support::CpuDev d;
  Rng rng(67);
  Tensor dy = d.rand(rng, DType::F32, Shape{2, 4}, nullptr), dx = d.make(DType::F32, Shape{2, 3, 3, 4});
  Tensor x16 = d.rand(rng, DType::BF16, Shape{2, 3, 3, 4}, nullptr);
  Tensor x_small = d.rand(rng, DType::F32, Shape{2, 3, 2, 4}, nullptr);
  REQUIRE_THROWS_WITH(d.be->global_avg_pool_relu_backward(x16, dy, dx),
                      Catch::Contains("global_avg_pool_relu_backward: x bfloat16[2, 3, 3, 4] and dx float32"));
  REQUIRE_THROWS_WITH(d.be->global_avg_pool_relu_backward(x_small, dy, dx),
                      Catch::Contains("global_avg_pool_relu_backward: x float32[2, 3, 2, 4] and dx float32"));
}
