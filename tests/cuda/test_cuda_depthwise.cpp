// SPDX-License-Identifier: MIT
// Depthwise convolution on the CUDA backend (cuDNN's grouped convolution) against the
// CPU backend (oneDNN's), for float32, float16 and bfloat16: forward with and without
// bias and activation, backward data, backward filter (dw and db in float32 and in the
// compute dtype), depth multipliers 1 to 3, symmetric and asymmetric padding.
// Tolerances as test_cuda_ops.cpp's convolutions (cuda_compare.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "cuda/cuda_compare.h"

using namespace cudatest;

namespace {

// Keras 'same' padding of one dimension.
void same_pad_1d(int in, int k, int stride, int& lo, int& hi) {
  const int out = (in + stride - 1) / stride;
  const int total = std::max((out - 1) * stride + k - in, 0);
  lo = total / 2;
  hi = total - lo;
}

struct DwCase {
  const char* name;
  int N, H, W, C, M, R, S, stride;
  bool same;
};

}  // namespace

TEST_CASE("cuda: depthwise conv2d forward, backward data, backward filter", "[cuda][conv][depthwise]") {
  const std::vector<DwCase> cases = {
      {"3x3 same stride 1, M=1, C=32", 4, 10, 9, 32, 1, 3, 3, 1, true},
      {"3x3 same stride 2 (asymmetric), M=1, C=16", 3, 9, 10, 16, 1, 3, 3, 2, true},
      {"5x5 same stride 1, M=2, C=8", 2, 8, 8, 8, 2, 5, 5, 1, true},
      {"3x2 valid stride 1, M=3, C=3", 2, 7, 6, 3, 3, 3, 2, 1, false},
      {"2x2 same stride 1 (asymmetric), M=1, C=24", 2, 6, 7, 24, 1, 2, 2, 1, true},
  };
  Rng rng(31);
  for (const DwCase& cc : cases)
    for (DType t : float_dtypes()) {
      if (!be().gpu->supports(Op::Conv2d, t)) continue;
      Conv2dParams p;
      p.R = cc.R, p.S = cc.S, p.stride_h = p.stride_w = cc.stride;
      if (cc.same) {
        same_pad_1d(cc.H, cc.R, cc.stride, p.pad_top, p.pad_bottom);
        same_pad_1d(cc.W, cc.S, cc.stride, p.pad_left, p.pad_right);
      }
      const int P = p.out_h(cc.H), Q = p.out_w(cc.W), K = cc.C * cc.M;
      const std::string what = std::string(cc.name) + " " + dtype_name(t);
      INFO(what);
      const double tol = tolerance(t, true);
      Dual x = random_dual(rng, t, Shape{cc.N, cc.H, cc.W, cc.C});
      Dual w = random_dual(rng, t, Shape{K, cc.R, cc.S, 1}, -0.5f, 0.5f);
      Dual b = random_dual(rng, t, Shape{K});
      for (Activation act : {Activation::None, Activation::Relu, Activation{ActKind::Silu}}) {
        Dual y = poisoned(t, Shape{cc.N, P, Q, K});
        Dual pre = poisoned(t, Shape{cc.N, P, Q, K});
        const bool keep_pre = act.backward_reads() == ActSaved::Input;
        be().cpu->depthwise_conv2d_forward(p, x.c, w.c, b.c, y.c, act, keep_pre ? pre.c : Tensor());
        be().gpu->depthwise_conv2d_forward(p, x.g, w.g, b.g, y.g, act, keep_pre ? pre.g : Tensor());
        expect_close(y, tol, what + " forward bias + " + activation_name(act.kind));
        if (keep_pre) expect_close(pre, tol, what + " forward pre-activation");
      }
      {
        Dual y = poisoned(t, Shape{cc.N, P, Q, K});
        be().cpu->depthwise_conv2d_forward(p, x.c, w.c, Tensor(), y.c, Activation::None);
        be().gpu->depthwise_conv2d_forward(p, x.g, w.g, Tensor(), y.g, Activation::None);
        expect_close(y, tol, what + " forward, no bias");
      }
      Dual dy = random_dual(rng, t, Shape{cc.N, P, Q, K});
      {
        Dual dx = poisoned(t, Shape{cc.N, cc.H, cc.W, cc.C});
        be().cpu->depthwise_conv2d_backward_data(p, dy.c, w.c, dx.c);
        be().gpu->depthwise_conv2d_backward_data(p, dy.g, w.g, dx.g);
        expect_close(dx, tol, what + " backward data");
      }
      for (DType gt : {t, DType::F32}) {
        Dual dw = poisoned(gt, Shape{K, cc.R, cc.S, 1});
        Dual db = poisoned(gt, Shape{K});
        be().cpu->depthwise_conv2d_backward_filter(p, x.c, dy.c, dw.c, db.c);
        be().gpu->depthwise_conv2d_backward_filter(p, x.g, dy.g, dw.g, db.g);
        // A float32 dw of 16-bit operands is rounded to 16 bits on the GPU first (cuDNN).
        expect_close(dw, tolerance(t, true), what + " backward filter dw as " + dtype_name(gt));
        expect_close(db, tolerance(t), what + " backward filter db as " + dtype_name(gt));
      }
    }
}
