// SPDX-License-Identifier: MIT
// Max pooling's backward in the weight gradient of the first convolution before it
// (Backend::max_pool_conv_backward; docs/cpu-performance.md, "Max pooling's backward in the first
// convolution's weight gradient"): the convolution's dw and db the same bits as
// max_pool_relu_backward then conv2d_backward_filter, where the CPU backend routes the pooling's
// gradient into the few-channel weight gradient a row at a time (the pooling's window positions
// kept, 1-4 channels, 16/32/64 filters) and where it runs the two ops (no window positions, other
// filter counts); float32, bfloat16 and float16; 1 to 3 threads; the route named in the kernels
// list exactly where it runs. And its refusals of tensors that do not fit together.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"

#include "support/backend_check.h"
#include "support/conv_case.h"

using namespace mpx;

namespace {

struct PoolConvCase {
  const char* name;
  support::ConvCase conv;
  int pool;  // a pool x pool window, stride pool (the windows the backend keeps positions for)
};

std::vector<char> bytes_of(support::CpuDev& d, const Tensor& t) {
  std::vector<char> b(t.bytes());
  d.be->download(b.data(), t);
  return b;
}

/// The kernels list's entry for the route, or "".
std::string route_of(support::CpuDev& d) {
  for (const KernelChoice& k : d.be->kernels())
    if (k.op.rfind("convolution backward weights with max pooling's backward", 0) == 0) return k.impl;
  return "";
}

}  // namespace

TEST_CASE("max_pool_conv_backward: the weight gradient of max_pool_relu_backward then conv2d_backward_filter, bit for "
          "bit",
          "[backend][pool][fuse]") {
  const PoolConvCase cases[] = {
      {"the MNIST smoke net's shape, C=1, K=32", {"", 5, 28, 28, 1, 32, 3, 3, 0, 0, 0, 0}, 2},
      {"an uncovered last row and column, C=1, K=16", {"", 3, 13, 13, 1, 16, 3, 3, 0, 0, 0, 0}, 2},
      {"3x3 windows on a same convolution, C=3, K=64", {"", 2, 12, 12, 3, 64, 3, 3, 1, 1, 1, 1}, 3},
      {"5x5 same, C=2, K=32, a wide image", {"", 2, 10, 14, 2, 32, 5, 5, 2, 2, 2, 2}, 2},
      {"24 filters: no few-channel weight gradient, the two ops", {"", 2, 10, 10, 3, 24, 3, 3, 0, 0, 0, 0}, 2},
  };
  for (const PoolConvCase& cs : cases)
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      for (int threads : {1, 2, 3})
        for (bool keep : {true, false})
          DYNAMIC_SECTION(cs.name << ", " << dtype_name(t) << ", " << threads << " threads, "
                                  << (keep ? "window positions kept" : "no window positions")) {
            const support::ConvCase& c = cs.conv;
            const Conv2dParams p = c.params();
            const int64_t P = p.out_h(static_cast<int>(c.H)), Q = p.out_w(static_cast<int>(c.W));
            PoolParams pp;
            pp.kind = PoolKind::Max;
            pp.R = pp.S = pp.stride_h = pp.stride_w = cs.pool;
            const int64_t Ph = P / cs.pool, Qh = Q / cs.pool;
            const support::OmpThreads th(threads);
            support::CpuDev d;
            Rng rng(static_cast<uint64_t>(31 + c.C * 7 + c.K + cs.pool));
            std::vector<float> cxv;
            const Tensor cx = d.rand(rng, t, Shape{c.N, c.H, c.W, c.C}, &cxv);
            // The convolution's relu output: zeros where it cut, ties, and a NaN (relu keeps it).
            std::vector<float> xv;
            const Tensor x = d.rand(rng, t, Shape{c.N, P, Q, c.K}, &xv);
            for (float& v : xv) v = std::max(v, 0.0f);
            const size_t K = static_cast<size_t>(c.K), row = static_cast<size_t>(Q) * K;
            xv[1] = xv[1 + K] = xv[1 + row] = 0.5f;
            xv[3 + K] = support::kNaN;
            for (size_t i : {size_t{4}, 4 + K, 4 + row, 4 + row + K}) xv[i] = 0.0f;  // a window of zeros
            d.put(x, xv);
            const Tensor y = d.make(t, Shape{c.N, Ph, Qh, c.K}), am = d.make(DType::U8, y.shape);
            REQUIRE(d.be->max_pool_keeps_argmax(pp, x.shape));
            d.be->pool_forward(pp, x, y, am);
            const Tensor argmax = keep ? am : Tensor();
            std::vector<float> dyv;
            const Tensor dy = d.rand(rng, t, y.shape, &dyv);
            // The gradients in float32, or in the compute dtype (both are allowed).
            const DType gt = threads == 2 ? DType::F32 : t;
            const Tensor dw = d.make(gt, Shape{c.K, c.R, c.S, c.C}), db = d.make(gt, Shape{c.K});
            const Tensor dw2 = d.make(gt, dw.shape), db2 = d.make(gt, db.shape);
            const Tensor dx = d.make(t, x.shape), dx2 = d.make(t, x.shape);
            d.be->max_pool_conv_backward(pp, x, y, dy, dx, argmax, p, cx, dw, db);
            d.be->max_pool_relu_backward(pp, x, y, dy, dx2, argmax);
            d.be->conv2d_backward_filter(p, cx, dx2, dw2, db2);
            CHECK(bytes_of(d, dw) == bytes_of(d, dw2));
            CHECK(bytes_of(d, db) == bytes_of(d, db2));
            // Not vacuous: the gradients are not all zero.
            double mag = 0;
            for (float v : d.get(dw2)) mag += std::fabs(v);
            CHECK(mag > 0);
            // The route runs where the window positions are kept and the few-channel kernel
            // takes the weight gradient (the rule of conv_choose.cpp: 16/32/64 filters, mpx's
            // loops not replaced by the reference loops or a forced weight-gradient switch).
            const char* wgrad = std::getenv("MPX_CONV_WGRAD");
            const bool few = (c.K == 16 || c.K == 32 || c.K == 64) && !std::getenv("MPX_CPU_REFERENCE") &&
                             !(wgrad && std::string(wgrad) != "auto");
            const std::string route = route_of(d);
            INFO("route: '" << route << "'");
            if (keep && few)
              CHECK(route.find("dy taken a row at a time as it is routed, never stored") != std::string::npos);
            else
              CHECK(route.empty());
          }
}

TEST_CASE("max_pool_conv_backward: tensors that do not fit together are refused, naming them",
          "[backend][pool][fuse]") {
  support::CpuDev d;
  Conv2dParams p;
  p.R = p.S = 3;
  PoolParams pp;
  pp.kind = PoolKind::Max;
  pp.R = pp.S = pp.stride_h = pp.stride_w = 2;
  const Tensor cx = d.make(DType::F32, Shape{2, 10, 10, 1}), x = d.make(DType::F32, Shape{2, 8, 8, 16});
  const Tensor y = d.make(DType::F32, Shape{2, 4, 4, 16}), dy = d.make(DType::F32, y.shape);
  const Tensor dx = d.make(DType::F32, x.shape), am = d.make(DType::U8, y.shape);
  const Tensor dw = d.make(DType::F32, Shape{16, 3, 3, 1}), db = d.make(DType::F32, Shape{16});
  CHECK_NOTHROW(d.be->max_pool_conv_backward(pp, x, y, dy, dx, am, p, cx, dw, db));
  // x must be the convolution's output: 8x8 from 10x10 with a 3x3 window, 16 filters.
  const Tensor cx12 = d.make(DType::F32, Shape{2, 12, 12, 1});
  CHECK_THROWS_WITH(d.be->max_pool_conv_backward(pp, x, y, dy, dx, am, p, cx12, dw, db),
                    Catch::Contains("max_pool_conv_backward"));
  const Tensor dw8 = d.make(DType::F32, Shape{8, 3, 3, 1});
  CHECK_THROWS_WITH(d.be->max_pool_conv_backward(pp, x, y, dy, dx, am, p, cx, dw8, db),
                    Catch::Contains("max_pool_conv_backward"));
  // The convolution's input in the pooling's dtype.
  const Tensor cx16 = d.make(DType::BF16, cx.shape);
  CHECK_THROWS_WITH(d.be->max_pool_conv_backward(pp, x, y, dy, dx, am, p, cx16, dw, db),
                    Catch::Contains("conv_x"));
  // A bias gradient of the filters' count, and average pooling refused.
  const Tensor db8 = d.make(DType::F32, Shape{8});
  CHECK_THROWS_WITH(d.be->max_pool_conv_backward(pp, x, y, dy, dx, am, p, cx, dw, db8), Catch::Contains("conv_db"));
  pp.kind = PoolKind::Avg;
  CHECK_THROWS_WITH(d.be->max_pool_conv_backward(pp, x, y, dy, dx, Tensor(), p, cx, dw, db),
                    Catch::Contains("needs max pooling"));
}
