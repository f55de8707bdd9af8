// SPDX-License-Identifier: MIT
// Max pooling's backward in the weight gradient of the first convolution before it
// (Backend::max_pool_conv_backward; docs/cpu-performance.md, "Max pooling's backward in the first
// convolution's weight gradient"): the convolution's dw and db the same bits as
// max_pool_relu_backward then conv2d_backward_filter, where the CPU backend routes the pooling's
// gradient into the few-channel weight gradient a row at a time (the pooling's window positions
// kept, 1-4 channels, 16/32/64 filters) and where it runs the two ops (no window positions, other
// filter counts); float32, bfloat16 and float16; 1 to 3 threads; the route named in the kernels
// list exactly where it runs. And its refusals of tensors that do not fit together. The forward the
// same way (Backend::conv_max_pool_forward; "The first convolution's forward with max pooling"):
// the pooling's output and window positions the bits of conv2d_forward with relu then
// pool_forward, where the few-channel kernel pools each window's rows as it computes them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

/// The kernels list's entry for the op whose description starts with `op`, or "".
std::string entry_of(support::CpuDev& d, const char* op) {
  for (const KernelChoice& k : d.be->kernels())
    if (k.op.rfind(op, 0) == 0) return k.impl;
  return "";
}

/// The routed weight gradient's entry, or "".
std::string route_of(support::CpuDev& d) {
  return entry_of(d, "convolution backward weights with max pooling's backward");
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
            // mpx's reference loops (MPX_CPU_REFERENCE=1) keep no window positions: the ops then
            // work from y alone, and the sections that would keep them check that too.
            const bool keeps = d.be->max_pool_keeps_argmax(pp, x.shape);
            REQUIRE(keeps == !std::getenv("MPX_CPU_REFERENCE"));
            const Tensor argmax = keep && keeps ? am : Tensor();
            d.be->pool_forward(pp, x, y, argmax);
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

TEST_CASE("conv_max_pool_forward: the pooling's output and window positions of conv2d_forward then pool_forward, bit "
          "for bit",
          "[backend][pool][fuse][fwd]") {
  // The few-channel kernel pools each window's rows as it computes them where the pooling runs
  // the kernels that keep its window positions, with them (a training step) or without (an
  // evaluation); elsewhere (24 filters: no pooled forward) the two ops run.
  const PoolConvCase cases[] = {
      {"the MNIST smoke net's shape, C=1, K=32", {"", 5, 28, 28, 1, 32, 3, 3, 0, 0, 0, 0}, 2},
      {"an uncovered last row and column, C=1, K=16", {"", 3, 13, 13, 1, 16, 3, 3, 0, 0, 0, 0}, 2},
      {"3x3 windows on a same convolution, C=3, K=64", {"", 2, 12, 12, 3, 64, 3, 3, 1, 1, 1, 1}, 3},
      {"5x5 same, C=2, K=32, a wide image, 3x3 windows, two uncovered rows",
       {"", 2, 11, 14, 2, 32, 5, 5, 2, 2, 2, 2},
       3},
      {"1x1, C=4, K=16, 2x2 windows", {"", 3, 6, 8, 4, 16, 1, 1, 0, 0, 0, 0}, 2},
      {"24 filters: no pooled forward, the two ops", {"", 2, 10, 10, 3, 24, 3, 3, 0, 0, 0, 0}, 2},
  };
  const char* fwd = std::getenv("MPX_CONV_FORWARD");
  const bool own = !std::getenv("MPX_CPU_REFERENCE") && !(fwd && std::string(fwd) != "auto");
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
            const support::OmpThreads th(threads);
            support::CpuDev d;
            Rng rng(static_cast<uint64_t>(57 + c.C * 5 + c.K + cs.pool));
            // The input: random, with a block of zeros in the first image (outputs of the bias
            // alone: ties, and zeros where relu cuts a negative bias), a NaN and a value large
            // enough to overflow float16 in the second.
            std::vector<float> xv;
            const Tensor x = d.rand(rng, t, Shape{c.N, c.H, c.W, c.C}, &xv);
            for (int64_t h = 0; h < std::min<int64_t>(6, c.H); ++h)
              for (int64_t w = 0; w < std::min<int64_t>(6, c.W); ++w)
                for (int64_t ch = 0; ch < c.C; ++ch) xv[static_cast<size_t>((h * c.W + w) * c.C + ch)] = 0.0f;
            const size_t img = static_cast<size_t>(c.H * c.W * c.C);
            xv[img + img / 2] = support::kNaN;
            xv[img + img / 3] = t == DType::BF16 ? 3e38f : 6e4f;
            d.put(x, xv);
            std::vector<float> bv;
            const Tensor w = d.rand(rng, t, Shape{c.K, c.R, c.S, c.C}, nullptr), b = d.rand(rng, t, Shape{c.K}, &bv);
            for (size_t k = 0; k < bv.size(); k += 3) bv[k] = -std::fabs(bv[k]);  // some negative biases
            d.put(b, bv);
            const Tensor cy = d.make(t, Shape{c.N, P, Q, c.K}), cy2 = d.make(t, cy.shape);
            const Tensor y = d.make(t, Shape{c.N, P / cs.pool, Q / cs.pool, c.K}), y2 = d.make(t, y.shape);
            const Tensor am = d.make(DType::U8, y.shape), am2 = d.make(DType::U8, y.shape);
            // mpx's reference loops keep no window positions (as in the test above).
            const bool keeps = d.be->max_pool_keeps_argmax(pp, cy.shape);
            REQUIRE(keeps == !std::getenv("MPX_CPU_REFERENCE"));
            const bool kept = keep && keeps;
            d.be->conv_max_pool_forward(p, x, w, b, cy, pp, y, kept ? am : Tensor());
            const std::string route = entry_of(d, "convolution forward with max pooling");
            d.be->conv2d_forward(p, x, w, b, cy2, Activation::Relu);
            // Where conv2d_forward runs another kernel than the pooled forward's (float32 without
            // AVX-512 runs oneDNN's), the pooled forward with 1x1 windows gives the kernel's own
            // output: the same as conv2d_forward's within float32 rounding (oneDNN's relu turns NaN
            // into 0, mpx's keeps it), and the reference the 2x2 pooling is run on.
            const bool fused = own && c.K != 24;
            // conv2d_forward ran mpx's few-channel kernel
            const bool mpx_conv = entry_of(d, "convolution forward for").rfind("mpx:few-channels", 0) == 0;
            if (fused && !mpx_conv) {
              PoolParams one = pp;
              one.R = one.S = one.stride_h = one.stride_w = 1;
              const Tensor own_y = d.make(t, cy.shape), am1 = d.make(DType::U8, cy.shape);
              d.be->conv_max_pool_forward(p, x, w, b, cy, one, own_y, am1);
              const std::vector<float> a = d.get(own_y), r = d.get(cy2);
              int64_t far = 0;
              for (size_t i = 0; i < a.size(); ++i)
                if (!std::isnan(a[i]) && std::fabs(a[i] - r[i]) > 1e-5f * (1.0f + std::fabs(r[i]))) ++far;
              CHECK(far == 0);
              d.be->copy(cy2, own_y);
            }
            d.be->pool_forward(pp, cy2, y2, kept ? am2 : Tensor());
            CHECK(bytes_of(d, y) == bytes_of(d, y2));
            if (kept) CHECK(bytes_of(d, am) == bytes_of(d, am2));
            // Not vacuous: positive outputs, the NaN carried (mpx's kernel keeps it through relu),
            // and windows won past their first position.
            int64_t positive = 0, nan = 0, moved = 0;
            for (float v : d.get(y2)) positive += v > 0, nan += std::isnan(v);
            std::vector<uint8_t> pos(static_cast<size_t>(am2.numel()));
            if (kept) d.be->download(pos.data(), am2);
            for (uint8_t a : pos) moved += a != 0;
            CHECK(positive > 0);
            if (fused || mpx_conv) CHECK(nan > 0);
            if (kept) CHECK(moved > 0);
            // The route: where the few-channel kernel takes the pooled forward (16/32/64 filters,
            // mpx's loops not switched off), with the window positions or without, as the query says.
            CHECK(d.be->conv_max_pool_forward_fuses(p, x.shape, w.shape, t, pp) == fused);
            INFO("route: '" << route << "'");
            if (fused)
              CHECK(route.find("each pooling window's rows pooled in cache, the output never stored") !=
                    std::string::npos);
            else
              CHECK(route.empty());
          }
}

TEST_CASE("conv_max_pool_forward: tensors that do not fit together are refused, naming them",
          "[backend][pool][fuse][fwd]") {
  support::CpuDev d;
  Conv2dParams p;
  p.R = p.S = 3;
  PoolParams pp;
  pp.kind = PoolKind::Max;
  pp.R = pp.S = pp.stride_h = pp.stride_w = 2;
  const Tensor x = d.make(DType::F32, Shape{2, 10, 10, 1}), w = d.make(DType::F32, Shape{16, 3, 3, 1});
  const Tensor b = d.make(DType::F32, Shape{16}), cy = d.make(DType::F32, Shape{2, 8, 8, 16});
  const Tensor y = d.make(DType::F32, Shape{2, 4, 4, 16}), u8 = d.make(DType::U8, y.shape);
  // mpx's reference loops (MPX_CPU_REFERENCE=1) keep no window positions: an argmax is refused
  // there, and the checks below run without one.
  const bool keeps = d.be->max_pool_keeps_argmax(pp, cy.shape);
  const Tensor am = keeps ? u8 : Tensor();
  if (!keeps)
    CHECK_THROWS_WITH(d.be->conv_max_pool_forward(p, x, w, b, cy, pp, y, u8), Catch::Contains("keeps no argmax"));
  CHECK_NOTHROW(d.be->conv_max_pool_forward(p, x, w, b, cy, pp, y, am));
  // conv_y must be the convolution's output, y the pooling's.
  const Tensor cy9 = d.make(DType::F32, Shape{2, 9, 9, 16});
  CHECK_THROWS_WITH(d.be->conv_max_pool_forward(p, x, w, b, cy9, pp, y, am), Catch::Contains("conv_y"));
  const Tensor y3 = d.make(DType::F32, Shape{2, 3, 3, 16});
  CHECK_THROWS_WITH(d.be->conv_max_pool_forward(p, x, w, b, cy, pp, y3, am),
                    Catch::Contains("conv_max_pool_forward"));
  // One dtype for x, w, conv_y and y; a bias of the filters' count; argmax uint8 of y's shape.
  const Tensor w16 = d.make(DType::BF16, w.shape), y16 = d.make(DType::BF16, y.shape);
  CHECK_THROWS_WITH(d.be->conv_max_pool_forward(p, x, w16, b, cy, pp, y, am), Catch::Contains("w"));
  CHECK_THROWS_WITH(d.be->conv_max_pool_forward(p, x, w, b, cy, pp, y16, am), Catch::Contains("y"));
  const Tensor b8 = d.make(DType::F32, Shape{8});
  CHECK_THROWS_WITH(d.be->conv_max_pool_forward(p, x, w, b8, cy, pp, y, am), Catch::Contains("bias"));
  const Tensor am32 = d.make(DType::F32, y.shape);
  CHECK_THROWS_WITH(d.be->conv_max_pool_forward(p, x, w, b, cy, pp, y, am32), Catch::Contains("argmax"));
  pp.kind = PoolKind::Avg;
  CHECK_THROWS_WITH(d.be->conv_max_pool_forward(p, x, w, b, cy, pp, y, Tensor()), Catch::Contains("needs max pooling"));
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
  const Tensor dx = d.make(DType::F32, x.shape), u8 = d.make(DType::U8, y.shape);
  // Without window positions under mpx's reference loops (as above).
  const Tensor am = d.be->max_pool_keeps_argmax(pp, x.shape) ? u8 : Tensor();
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
