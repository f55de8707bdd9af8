// SPDX-License-Identifier: MIT
// Every Backend op on the CUDA backend against the CPU backend, for float32,
// float16 and bfloat16, on fresh random inputs (never zeros), outputs poisoned
// with NaN. Tolerances (whole-tensor relative error): float32 1e-5 (convolutions
// 1e-4; TF32 is off), float16 1e-3, bfloat16 8e-3. The fused passes, casts,
// dropout and the elementwise ops must agree bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "cuda/cuda_compare.h"

using namespace cudatest;

namespace {

std::string dt_name(DType t) { return dtype_name(t); }

// Keras 'same' padding of one dimension.
void same_pad(int in, int k, int stride, int& lo, int& hi) {
  const int out = (in + stride - 1) / stride;
  const int total = std::max((out - 1) * stride + k - in, 0);
  lo = total / 2;
  hi = total - lo;
}

struct ConvCase {
  const char* name;
  int N, H, W, C, K, R, S, stride;
  bool same;
};

}  // namespace

TEST_CASE("cuda: device info, supports, memory statistics", "[cuda]") {
  Backend& g = *be().gpu;
  const DeviceInfo d = g.info();
  CHECK(d.name.rfind("cuda:", 0) == 0);
  CHECK(d.compute_capability >= 50);
  CHECK(g.supports(Op::Conv2d, DType::F16));
  CHECK(g.supports(Op::OptimizerStep, DType::F32));
  CHECK_FALSE(g.supports(Op::SoftmaxCrossEntropy, DType::F16));
  CHECK(g.supports(Op::Dense, DType::BF16) == (d.compute_capability >= 80));
  Buffer b = g.alloc(1 << 20, "test buffer");
  const MemoryStats m = g.memory_stats();
  CHECK(m.current_bytes >= (1u << 20));
  CHECK(m.device_total_bytes > 0);
  CHECK(m.device_free_bytes > 0);
  CHECK_THROWS_AS(g.alloc(size_t{1} << 52, "an impossible buffer"), OutOfMemoryError);
}

TEST_CASE("cuda: fill and copy", "[cuda]") {
  Rng rng(1);
  for (DType t : float_dtypes()) {
    Dual a = poisoned(t, Shape{3, 5, 7});
    be().cpu->fill(a.c, 0.3f);
    be().gpu->fill(a.g, 0.3f);
    expect_bits(a, "fill");
    Dual src = random_dual(rng, t, Shape{3, 5, 7});
    Dual dst = poisoned(t, Shape{3, 5, 7});
    be().cpu->copy(dst.c, src.c);
    be().gpu->copy(dst.g, src.g);
    expect_bits(dst, "copy");
  }
}

TEST_CASE("cuda: casts between every pair of float dtypes, bit for bit", "[cuda][cast]") {
  Rng rng(2);
  // Values across the float16 range, including ones that round, overflow and go subnormal.
  std::vector<float> v = random_floats(rng, 4099, -4.0f, 4.0f);
  v[0] = 70000.0f;
  v[1] = -1e-6f;
  v[2] = 3e-8f;
  v[3] = 1.0009765625f + 1e-7f;
  v[4] = std::numeric_limits<float>::infinity();
  for (DType from : float_dtypes())
    for (DType to : float_dtypes()) {
      Dual src = from_floats(from, Shape{4099}, v);
      Dual dst = poisoned(to, Shape{4099});
      be().cpu->cast(src.c, dst.c);
      be().gpu->cast(src.g, dst.g);
      expect_bits(dst, std::string("cast from ") + dt_name(from));
    }
}

TEST_CASE("cuda: normalize_input, bit for bit", "[cuda][cast]") {
  Rng rng(3);
  std::vector<uint8_t> px(4 * 9 * 7 * 3);
  for (auto& p : px) p = static_cast<uint8_t>(rng.uniform_int(256));
  Dual x = from_bytes(DType::U8, Shape{4, 9, 7, 3}, px.data());
  Dual mean = from_floats(DType::F32, Shape{3}, {0.4914f, 0.4822f, 0.4465f});
  Dual stdv = from_floats(DType::F32, Shape{3}, {0.2470f, 0.2435f, 0.2616f});
  for (DType t : float_dtypes()) {
    Dual y = poisoned(t, Shape{4, 9, 7, 3});
    be().cpu->normalize_input(x.c, mean.c, stdv.c, y.c);
    be().gpu->normalize_input(x.g, mean.g, stdv.g, y.g);
    expect_bits(y, "normalize_input");
  }
}

TEST_CASE("cuda: conv2d forward, backward data, backward filter", "[cuda][conv]") {
  const std::vector<ConvCase> cases = {
      {"3x3 same stride 1 (symmetric)", 4, 10, 9, 8, 16, 3, 3, 1, true},
      {"2x2 same stride 1 (asymmetric)", 3, 8, 8, 8, 8, 2, 2, 1, true},
      {"3x3 same stride 2 (asymmetric)", 4, 8, 10, 16, 8, 3, 3, 2, true},
      {"5x5 valid stride 2", 2, 13, 11, 3, 8, 5, 5, 2, false},
      {"1x1 valid", 5, 6, 6, 16, 24, 1, 1, 1, false},
      {"3x3 valid C=1 (first layer)", 8, 12, 12, 1, 8, 3, 3, 1, false},
      // 16-bit: channels zero-padded to 8 for cuDNN (conv_geometry.h), with and without spatial padding
      {"3x3 same stride 1 C=3 (CIFAR first layer)", 4, 12, 12, 3, 16, 3, 3, 1, true},
      {"3x3 same stride 2 C=3 (asymmetric + channel padding)", 3, 9, 10, 3, 8, 3, 3, 2, true},
      {"2x2 valid C=12", 2, 7, 7, 12, 8, 2, 2, 1, false},
  };
  Rng rng(4);
  for (const ConvCase& cc : cases)
    for (DType t : float_dtypes()) {
      if (!be().gpu->supports(Op::Conv2d, t)) continue;
      Conv2dParams p;
      p.R = cc.R, p.S = cc.S, p.stride_h = p.stride_w = cc.stride;
      if (cc.same) {
        same_pad(cc.H, cc.R, cc.stride, p.pad_top, p.pad_bottom);
        same_pad(cc.W, cc.S, cc.stride, p.pad_left, p.pad_right);
      }
      const int P = p.out_h(cc.H), Q = p.out_w(cc.W);
      const std::string what = std::string(cc.name) + " " + dt_name(t);
      INFO(what);
      const double tol = tolerance(t, true);
      Dual x = random_dual(rng, t, Shape{cc.N, cc.H, cc.W, cc.C});
      Dual w = random_dual(rng, t, Shape{cc.K, cc.R, cc.S, cc.C}, -0.5f, 0.5f);
      Dual b = random_dual(rng, t, Shape{cc.K});
      for (Activation act : {Activation::None, Activation::Relu}) {
        Dual y = poisoned(t, Shape{cc.N, P, Q, cc.K});
        be().cpu->conv2d_forward(p, x.c, w.c, b.c, y.c, act);
        be().gpu->conv2d_forward(p, x.g, w.g, b.g, y.g, act);
        expect_close(y, tol, what + (act == Activation::Relu ? " forward bias+relu" : " forward bias"));
      }
      {
        Dual y = poisoned(t, Shape{cc.N, P, Q, cc.K});
        be().cpu->conv2d_forward(p, x.c, w.c, Tensor(), y.c, Activation::None);
        be().gpu->conv2d_forward(p, x.g, w.g, Tensor(), y.g, Activation::None);
        expect_close(y, tol, what + " forward, no bias");
      }
      Dual dy = random_dual(rng, t, Shape{cc.N, P, Q, cc.K});
      {
        Dual dx = poisoned(t, Shape{cc.N, cc.H, cc.W, cc.C});
        be().cpu->conv2d_backward_data(p, dy.c, w.c, dx.c);
        be().gpu->conv2d_backward_data(p, dy.g, w.g, dx.g);
        expect_close(dx, tol, what + " backward data");
      }
      for (DType gt : {t, DType::F32}) {
        Dual dw = poisoned(gt, Shape{cc.K, cc.R, cc.S, cc.C});
        Dual db = poisoned(gt, Shape{cc.K});
        be().cpu->conv2d_backward_filter(p, x.c, dy.c, dw.c, db.c);
        be().gpu->conv2d_backward_filter(p, x.g, dy.g, dw.g, db.g);
        // A float32 dw of 16-bit operands is rounded to 16 bits on the GPU first (cuDNN).
        expect_close(dw, tolerance(t, true), what + " backward filter dw as " + dt_name(gt));
        expect_close(db, tolerance(t), what + " backward filter db as " + dt_name(gt));
      }
    }
}

TEST_CASE("cuda: dense forward (bias epilogue, relu kernel), backward data, backward weights", "[cuda][dense]") {
  Rng rng(5);
  struct D {
    int N, Ci, Co;
  };
  for (const D& dd : {D{32, 64, 10}, D{7, 33, 17}, D{128, 256, 128}})
    for (DType t : float_dtypes()) {
      if (!be().gpu->supports(Op::Dense, t)) continue;
      const std::string what = "dense " + std::to_string(dd.N) + "x" + std::to_string(dd.Ci) + "->" +
                               std::to_string(dd.Co) + " " + dt_name(t);
      INFO(what);
      const double tol = tolerance(t);
      Dual x = random_dual(rng, t, Shape{dd.N, dd.Ci});
      Dual w = random_dual(rng, t, Shape{dd.Co, dd.Ci}, -0.3f, 0.3f);
      Dual b16 = random_dual(rng, t, Shape{dd.Co});
      Dual b32 = random_dual(rng, DType::F32, Shape{dd.Co});
      for (Activation act : {Activation::None, Activation::Relu})
        for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {
          const Tensor bc = bias_kind == 0 ? Tensor() : bias_kind == 1 ? b16.c : b32.c;
          const Tensor bg = bias_kind == 0 ? Tensor() : bias_kind == 1 ? b16.g : b32.g;
          Dual y = poisoned(t, Shape{dd.N, dd.Co});
          be().cpu->dense_forward(x.c, w.c, bc, y.c, act);
          be().gpu->dense_forward(x.g, w.g, bg, y.g, act);
          expect_close(y, tol,
                       what + " forward bias " + std::to_string(bias_kind) + (act == Activation::Relu ? " relu" : ""));
        }
      Dual dy = random_dual(rng, t, Shape{dd.N, dd.Co});
      Dual dx = poisoned(t, Shape{dd.N, dd.Ci});
      be().cpu->dense_backward_data(dy.c, w.c, dx.c);
      be().gpu->dense_backward_data(dy.g, w.g, dx.g);
      expect_close(dx, tol, what + " backward data");
      for (DType gt : {t, DType::F32}) {
        Dual dw = poisoned(gt, Shape{dd.Co, dd.Ci});
        Dual db = poisoned(gt, Shape{dd.Co});
        be().cpu->dense_backward_weights(x.c, dy.c, dw.c, db.c);
        be().gpu->dense_backward_weights(x.g, dy.g, dw.g, db.g);
        expect_close(dw, tol, what + " backward weights dw as " + dt_name(gt));
        expect_close(db, tol, what + " backward weights db as " + dt_name(gt));
      }
    }
}

TEST_CASE("cuda: a float32 dense layer's 16-bit input x and input gradient dx, as on the CPU", "[cuda][dense]") {
  Rng rng(15);
  for (DType t : {DType::F16, DType::BF16}) {
    const std::string what = std::string("dense 16x300->10, x and dx ") + dt_name(t);
    INFO(what);
    Dual x = random_dual(rng, t, Shape{16, 300});
    Dual w = random_dual(rng, DType::F32, Shape{10, 300}, -0.3f, 0.3f);
    Dual b = random_dual(rng, DType::F32, Shape{10});
    Dual y = poisoned(DType::F32, Shape{16, 10});
    be().cpu->dense_forward(x.c, w.c, b.c, y.c, Activation::None);
    be().gpu->dense_forward(x.g, w.g, b.g, y.g, Activation::None);
    expect_close(y, tolerance(DType::F32), what + " forward");
    Dual dy = random_dual(rng, DType::F32, Shape{16, 10});
    Dual dx = poisoned(t, Shape{16, 300});
    be().cpu->dense_backward_data(dy.c, w.c, dx.c);
    be().gpu->dense_backward_data(dy.g, w.g, dx.g);
    expect_close(dx, tolerance(t), what + " backward data");
    Dual dw = poisoned(DType::F32, Shape{10, 300});
    Dual db = poisoned(DType::F32, Shape{10});
    be().cpu->dense_backward_weights(x.c, dy.c, dw.c, db.c);
    be().gpu->dense_backward_weights(x.g, dy.g, dw.g, db.g);
    expect_close(dw, tolerance(DType::F32), what + " backward weights dw");
    expect_close(db, tolerance(DType::F32), what + " backward weights db");
  }
}

/// The GPU side's bytes.
static std::vector<char> gpu_bytes(const Dual& d) {
  std::vector<char> b(d.g.bytes());
  be().gpu->download(b.data(), d.g);
  return b;
}

TEST_CASE("cuda: dense_relu_backward_data equals dense_backward_data then relu's backward, and the CPU",
          "[cuda][dense][fuse]") {
  // The base implementation composes the two ops on the GPU: the same bits as those two GPU
  // ops; against the CPU's fused op within the dtype's tolerance (dense sums differ in order).
  Rng rng(16);
  struct D {
    DType t, tx;  // the layer's dtype, x's and dx's
  };
  for (const D& dd : {D{DType::F32, DType::F32}, D{DType::BF16, DType::BF16}, D{DType::F16, DType::F16},
                      D{DType::F32, DType::BF16}}) {
    if (!be().gpu->supports(Op::Dense, dd.t)) continue;
    const std::string what = std::string("dense 16x300->10 relu input, layer ") + dt_name(dd.t) + ", x " +
                             dt_name(dd.tx);
    INFO(what);
    Dual x = random_dual(rng, dd.tx, Shape{16, 300});  // about half of it not > 0: masked
    Dual w = random_dual(rng, dd.t, Shape{10, 300}, -0.3f, 0.3f);
    Dual dy = random_dual(rng, dd.t, Shape{16, 10});
    Dual fused = poisoned(dd.tx, Shape{16, 300}), two = poisoned(dd.tx, Shape{16, 300});
    be().cpu->dense_relu_backward_data(dy.c, w.c, x.c, fused.c);
    be().gpu->dense_relu_backward_data(dy.g, w.g, x.g, fused.g);
    expect_close(fused, tolerance(dd.tx), what);
    be().gpu->dense_backward_data(dy.g, w.g, two.g);
    be().gpu->activation_backward(Activation::Relu, x.g, two.g, two.g);
    CHECK(gpu_bytes(fused) == gpu_bytes(two));
  }
}

TEST_CASE("cuda: dense_backward equals the weight gradient and the backward-data pass, and the CPU",
          "[cuda][dense][fuse]") {
  // The base implementation runs the two passes on the GPU: dw, db and dx the bits of those GPU
  // ops; against the CPU within the dtype's tolerance, where a float32 x of 8,200 columns takes
  // the CPU's one walk over x (docs/cpu-performance.md, "Both backward passes in one walk").
  Rng rng(18);
  struct D {
    DType t, tx;  // the layer's dtype, x's and dx's
    int64_t Ci;
  };
  for (const D& dd : {D{DType::F32, DType::F32, 8200}, D{DType::F32, DType::F32, 300}, D{DType::BF16, DType::BF16, 300},
                      D{DType::F16, DType::F16, 300}, D{DType::F32, DType::BF16, 8200}})
    for (bool relu : {true, false}) {
      if (!be().gpu->supports(Op::Dense, dd.t)) continue;
      const std::string what = "dense 16x" + std::to_string(dd.Ci) + "->10, layer " + dt_name(dd.t) + ", x " +
                               dt_name(dd.tx) + (relu ? ", relu input" : "");
      INFO(what);
      const Shape sx{16, dd.Ci}, sw{10, dd.Ci};
      Dual x = random_dual(rng, dd.tx, sx);  // with relu: about half of it not > 0, masked
      Dual w = random_dual(rng, dd.t, sw, -0.3f, 0.3f);
      Dual dy = random_dual(rng, dd.t, Shape{16, 10});
      Dual dw = poisoned(dd.t, sw), db = poisoned(dd.t, Shape{10}), dx = poisoned(dd.tx, sx);
      Dual dw2 = poisoned(dd.t, sw), db2 = poisoned(dd.t, Shape{10}), dx2 = poisoned(dd.tx, sx);
      be().cpu->dense_backward(x.c, dy.c, w.c, dw.c, db.c, dx.c, relu);
      be().gpu->dense_backward(x.g, dy.g, w.g, dw.g, db.g, dx.g, relu);
      expect_close(dw, tolerance(dd.t), what + " dw");
      expect_close(db, tolerance(dd.t), what + " db");
      expect_close(dx, tolerance(dd.tx), what + " dx");
      be().gpu->dense_backward_weights(x.g, dy.g, dw2.g, db2.g);
      if (relu)
        be().gpu->dense_relu_backward_data(dy.g, w.g, x.g, dx2.g);
      else
        be().gpu->dense_backward_data(dy.g, w.g, dx2.g);
      CHECK(gpu_bytes(dw) == gpu_bytes(dw2));
      CHECK(gpu_bytes(db) == gpu_bytes(db2));
      CHECK(gpu_bytes(dx) == gpu_bytes(dx2));
    }
}

TEST_CASE("cuda: global_avg_pool_relu_backward equals the two ops and the CPU, bit for bit", "[cuda][pool][fuse]") {
  Rng rng(17);
  for (DType t : float_dtypes()) {
    const Shape s{4, 5, 6, 7};
    Dual x = random_dual(rng, t, s);  // about half of it not > 0: masked
    Dual dy = random_dual(rng, t, Shape{4, 7});
    Dual fused = poisoned(t, s), two = poisoned(t, s);
    be().cpu->global_avg_pool_relu_backward(x.c, dy.c, fused.c);
    be().gpu->global_avg_pool_relu_backward(x.g, dy.g, fused.g);
    expect_bits(fused, std::string("global_avg_pool_relu_backward ") + dt_name(t));
    be().gpu->global_avg_pool_backward(dy.g, two.g);
    be().gpu->activation_backward(Activation::Relu, x.g, two.g, two.g);
    CHECK(gpu_bytes(fused) == gpu_bytes(two));
  }
}

TEST_CASE("cuda: relu forward/backward and add, bit for bit", "[cuda][elementwise]") {
  Rng rng(6);
  for (DType t : float_dtypes()) {
    const Shape s{4, 5, 6, 7};
    Dual x = random_dual(rng, t, s);
    Dual y = poisoned(t, s);
    be().cpu->activation_forward(Activation::Relu, x.c, y.c);
    be().gpu->activation_forward(Activation::Relu, x.g, y.g);
    expect_bits(y, "relu forward");
    Dual dy = random_dual(rng, t, s);
    Dual dx = poisoned(t, s);
    be().cpu->activation_backward(Activation::Relu, y.c, dy.c, dx.c);
    be().gpu->activation_backward(Activation::Relu, y.g, dy.g, dx.g);
    expect_bits(dx, "relu backward");
    Dual a = random_dual(rng, t, s), b = random_dual(rng, t, s);
    Dual sum = poisoned(t, s);
    be().cpu->add(a.c, b.c, sum.c);
    be().gpu->add(a.g, b.g, sum.g);
    expect_bits(sum, "add");
    // In place (y aliases a).
    be().cpu->add(a.c, b.c, a.c);
    be().gpu->add(a.g, b.g, a.g);
    expect_bits(a, "add in place");
  }
}

// Max pooling and the global pooling's backward (a broadcast of dy / HW) give the same bits on
// both backends. Average pooling is compared with a float64 reference within a stated bound:
// the CPU's default path (oneDNN) sums a window in an order of its own, and its 16-bit global
// pooling sums blocks of 32 rows, so float32 sums of the same values differ in their last bits.
TEST_CASE("cuda: max/avg pooling with padding, global average pooling", "[cuda][pool]") {
  Rng rng(7);
  struct PC {
    PoolKind kind;
    int R, stride, pt, pl, pb, pr;
  };
  const std::vector<PC> cases = {{PoolKind::Max, 2, 2, 0, 0, 0, 0}, {PoolKind::Max, 3, 2, 1, 1, 1, 1},
                                 {PoolKind::Max, 3, 1, 0, 0, 1, 1}, {PoolKind::Avg, 2, 2, 0, 0, 0, 0},
                                 {PoolKind::Avg, 3, 2, 1, 1, 1, 1}, {PoolKind::Avg, 2, 1, 0, 0, 1, 1}};
  for (const PC& pc : cases)
    for (DType t : float_dtypes()) {
      PoolParams p;
      p.kind = pc.kind;
      p.R = p.S = pc.R;
      p.stride_h = p.stride_w = pc.stride;
      p.pad_top = pc.pt, p.pad_left = pc.pl, p.pad_bottom = pc.pb, p.pad_right = pc.pr;
      const Shape xs{3, 9, 8, 5};
      const int P = p.out_h(9), Q = p.out_w(8);
      const std::string what = std::string(pc.kind == PoolKind::Max ? "max" : "avg") + " pool " +
                               std::to_string(pc.R) + "/" + std::to_string(pc.stride) + " pad " +
                               std::to_string(pc.pt) + std::to_string(pc.pb);
      // Few distinct values so that max pooling has ties (first maximum wins).
      std::vector<float> v = random_floats(rng, xs.numel());
      for (auto& e : v) e = std::round(e * 4.0f) / 4.0f + 0.125f;
      Dual x = from_floats(t, xs, v);
      Dual y = poisoned(t, Shape{3, P, Q, 5});
      be().cpu->pool_forward(p, x.c, y.c);
      be().gpu->pool_forward(p, x.g, y.g);
      Dual dy = random_dual(rng, t, Shape{3, P, Q, 5});
      Dual dx = poisoned(t, xs);
      be().cpu->pool_backward(p, x.c, y.c, dy.c, dx.c);
      be().gpu->pool_backward(p, x.g, y.g, dy.g, dx.g);
      if (pc.kind == PoolKind::Max) {
        expect_bits(y, what + " forward");
        expect_bits(dx, what + " backward");
      } else {
        const support::AvgPoolRef r = support::avg_pool_reference(p, t, xs, floats(*be().cpu, x.c), P, Q, floats(*be().cpu, dy.c));
        expect_within(y, r.y, r.y_bound, what + " forward");
        expect_within(dx, r.dx, r.dx_bound, what + " backward");
      }
    }
  for (DType t : float_dtypes()) {
    const Shape xs{4, 7, 6, 33};
    Dual x = random_dual(rng, t, xs);
    Dual y = poisoned(t, Shape{4, 33});
    be().cpu->global_avg_pool_forward(x.c, y.c);
    be().gpu->global_avg_pool_forward(x.g, y.g);
    PoolParams whole;
    whole.kind = PoolKind::Avg;
    whole.R = 7;
    whole.S = 6;
    const std::vector<float> xv = floats(*be().cpu, x.c), none(static_cast<size_t>(4 * 33), 0.0f);
    const support::AvgPoolRef r = support::avg_pool_reference(whole, t, xs, xv, 1, 1, none);
    expect_within(y, r.y, r.y_bound, "global_avg_pool forward");
    Dual dy = random_dual(rng, t, Shape{4, 33});
    Dual dx = poisoned(t, xs);
    be().cpu->global_avg_pool_backward(dy.c, dx.c);
    be().gpu->global_avg_pool_backward(dy.g, dx.g);
    expect_bits(dx, "global_avg_pool backward");
  }
}

TEST_CASE("cuda: batch norm training/inference forward and backward (Keras moving statistics)", "[cuda][bn]") {
  Rng rng(8);
  for (const Shape& xs : {Shape{8, 6, 5, 40}, Shape{64, 20}, Shape{32, 16, 16, 64}})
    for (DType t : float_dtypes()) {
      const int64_t C = xs[xs.rank - 1];
      const std::string what = "batch_norm " + xs.str() + " " + dt_name(t);
      INFO(what);
      const double tol = tolerance(t);
      Dual x = random_dual(rng, t, xs, 0.5f, 3.0f);  // mean far from 0
      Dual gamma = random_dual(rng, DType::F32, Shape{C}, 0.5f, 1.5f);
      Dual beta = random_dual(rng, DType::F32, Shape{C});
      Dual rm = random_dual(rng, DType::F32, Shape{C});
      Dual rv = random_dual(rng, DType::F32, Shape{C}, 0.5f, 2.0f);
      Dual sm = poisoned(DType::F32, Shape{C}), si = poisoned(DType::F32, Shape{C});
      Dual y = poisoned(t, xs);
      be().cpu->batch_norm_forward_training(x.c, gamma.c, beta.c, 0.99f, 1e-3f, rm.c, rv.c, sm.c, si.c, y.c);
      be().gpu->batch_norm_forward_training(x.g, gamma.g, beta.g, 0.99f, 1e-3f, rm.g, rv.g, sm.g, si.g, y.g);
      expect_close(y, tol, what + " y");
      expect_close(sm, 1e-5, what + " saved mean");
      expect_close(si, 1e-5, what + " saved invstd");
      expect_close(rm, 1e-5, what + " running mean");
      expect_close(rv, 1e-5, what + " running variance");
      Dual yi = poisoned(t, xs);
      be().cpu->batch_norm_forward_inference(x.c, gamma.c, beta.c, rm.c, rv.c, 1e-3f, yi.c);
      be().gpu->batch_norm_forward_inference(x.g, gamma.g, beta.g, rm.g, rv.g, 1e-3f, yi.g);
      expect_close(yi, tol, what + " inference y");
      Dual dy = random_dual(rng, t, xs);
      Dual dx = poisoned(t, xs);
      Dual dgamma = poisoned(DType::F32, Shape{C}), dbeta = poisoned(DType::F32, Shape{C});
      be().cpu->batch_norm_backward(x.c, dy.c, gamma.c, sm.c, si.c, dx.c, dgamma.c, dbeta.c);
      be().gpu->batch_norm_backward(x.g, dy.g, gamma.g, sm.g, si.g, dx.g, dgamma.g, dbeta.g);
      // dx is a difference of nearly equal terms: relative error a few times the dtype's.
      expect_close(dx, t == DType::F32 ? 1e-4 : tol * 2, what + " dx");
      expect_close(dgamma, t == DType::F32 ? 1e-5 : 1e-4, what + " dgamma");
      expect_close(dbeta, t == DType::F32 ? 1e-5 : 1e-4, what + " dbeta");
    }
}

TEST_CASE("cuda: batch norm with a fused activation equals batch norm then the activation, and the CPU",
          "[cuda][bn][fuse]") {
  // On the GPU the fused ops give the bits of the two GPU ops (the normalized values rounded to
  // the dtype, then the activation loops' formulas); against the CPU's fused ops within the
  // dtype's tolerance (the sums differ in order).
  Rng rng(18);
  const Shape xs{8, 6, 5, 40};
  const int64_t C = 40;
  for (const Activation act : {Activation(ActKind::Gelu), Activation(ActKind::Silu)})
    for (DType t : float_dtypes()) {
      const std::string what = std::string("batch_norm + ") + activation_name(act.kind) + " " + dt_name(t);
      INFO(what);
      Dual x = random_dual(rng, t, xs, -1.0f, 2.0f);
      Dual gamma = random_dual(rng, DType::F32, Shape{C}, 0.5f, 1.5f), beta = random_dual(rng, DType::F32, Shape{C});
      Dual rm = random_dual(rng, DType::F32, Shape{C}), rv = random_dual(rng, DType::F32, Shape{C}, 0.5f, 2.0f);
      Dual rm2 = poisoned(DType::F32, Shape{C}), rv2 = poisoned(DType::F32, Shape{C});
      be().gpu->copy(rm2.g, rm.g);
      be().gpu->copy(rv2.g, rv.g);
      Dual sm = poisoned(DType::F32, Shape{C}), si = poisoned(DType::F32, Shape{C});
      Dual sm2 = poisoned(DType::F32, Shape{C}), si2 = poisoned(DType::F32, Shape{C});
      Dual y = poisoned(t, xs), z = poisoned(t, xs), y2 = poisoned(t, xs);
      be().cpu->batch_norm_forward_training(x.c, gamma.c, beta.c, 0.6f, 1e-3f, rm.c, rv.c, sm.c, si.c, y.c, act);
      be().gpu->batch_norm_forward_training(x.g, gamma.g, beta.g, 0.6f, 1e-3f, rm.g, rv.g, sm.g, si.g, y.g, act);
      be().gpu->batch_norm_forward_training(x.g, gamma.g, beta.g, 0.6f, 1e-3f, rm2.g, rv2.g, sm2.g, si2.g, z.g);
      be().gpu->activation_forward(act, z.g, y2.g);
      expect_close(y, tolerance(t), what + " y");
      CHECK(gpu_bytes(y) == gpu_bytes(y2));
      Dual dy = random_dual(rng, t, xs), dx = poisoned(t, xs), g = poisoned(t, xs), dx2 = poisoned(t, xs);
      Dual dgamma = poisoned(DType::F32, Shape{C}), dbeta = poisoned(DType::F32, Shape{C});
      Dual dgamma2 = poisoned(DType::F32, Shape{C}), dbeta2 = poisoned(DType::F32, Shape{C});
      be().cpu->batch_norm_backward(x.c, dy.c, gamma.c, sm.c, si.c, dx.c, dgamma.c, dbeta.c, beta.c, act);
      be().gpu->batch_norm_backward(x.g, dy.g, gamma.g, sm.g, si.g, dx.g, dgamma.g, dbeta.g, beta.g, act);
      be().gpu->activation_backward(act, z.g, dy.g, g.g);
      be().gpu->batch_norm_backward(x.g, g.g, gamma.g, sm.g, si.g, dx2.g, dgamma2.g, dbeta2.g);
      expect_close(dx, t == DType::F32 ? 1e-4 : tolerance(t) * 2, what + " dx");
      expect_close(dgamma, t == DType::F32 ? 1e-5 : 1e-4, what + " dgamma");
      CHECK(gpu_bytes(dx) == gpu_bytes(dx2));
      CHECK(gpu_bytes(dgamma) == gpu_bytes(dgamma2));
      CHECK(gpu_bytes(dbeta) == gpu_bytes(dbeta2));
      Dual yi = poisoned(t, xs), zi = poisoned(t, xs), yi2 = poisoned(t, xs);
      be().cpu->batch_norm_forward_inference(x.c, gamma.c, beta.c, rm.c, rv.c, 1e-3f, yi.c, act);
      be().gpu->batch_norm_forward_inference(x.g, gamma.g, beta.g, rm.g, rv.g, 1e-3f, yi.g, act);
      be().gpu->batch_norm_forward_inference(x.g, gamma.g, beta.g, rm.g, rv.g, 1e-3f, zi.g);
      be().gpu->activation_forward(act, zi.g, yi2.g);
      expect_close(yi, tolerance(t), what + " inference y");
      CHECK(gpu_bytes(yi) == gpu_bytes(yi2));
    }
}

TEST_CASE("cuda: softmax cross-entropy (float32 loss sum, correct count, dlogits)", "[cuda][loss]") {
  Rng rng(9);
  for (int K : {10, 100}) {
    const int N = 77;
    Dual z = random_dual(rng, DType::F32, Shape{N, K}, -8.0f, 8.0f);
    std::vector<int32_t> lab(N);
    for (auto& l : lab) l = static_cast<int32_t>(rng.uniform_int(static_cast<uint64_t>(K)));
    Dual labels = from_bytes(DType::I32, Shape{N}, lab.data());
    Dual loss = poisoned(DType::F32, Shape{1}), correct = poisoned(DType::F32, Shape{1});
    Dual dz = poisoned(DType::F32, Shape{N, K});
    be().cpu->softmax_cross_entropy(z.c, labels.c, 1024.0f, loss.c, correct.c, dz.c);
    be().gpu->softmax_cross_entropy(z.g, labels.g, 1024.0f, loss.g, correct.g, dz.g);
    expect_close(loss, 1e-5, "loss sum K=" + std::to_string(K));
    expect_bits(correct, "correct count K=" + std::to_string(K));
    expect_close(dz, 1e-5, "dlogits K=" + std::to_string(K));
    // Without dlogits.
    Dual loss2 = poisoned(DType::F32, Shape{1}), correct2 = poisoned(DType::F32, Shape{1});
    be().cpu->softmax_cross_entropy(z.c, labels.c, 1.0f, loss2.c, correct2.c, Tensor());
    be().gpu->softmax_cross_entropy(z.g, labels.g, 1.0f, loss2.g, correct2.g, Tensor());
    expect_close(loss2, 1e-5, "loss sum, no dlogits");
    // Label smoothing (the logits' sum is a warp reduction on the GPU, a loop on the CPU).
    Dual loss3 = poisoned(DType::F32, Shape{1}), correct3 = poisoned(DType::F32, Shape{1});
    Dual dz3 = poisoned(DType::F32, Shape{N, K});
    be().cpu->softmax_cross_entropy(z.c, labels.c, 1024.0f, loss3.c, correct3.c, dz3.c, 0.1f);
    be().gpu->softmax_cross_entropy(z.g, labels.g, 1024.0f, loss3.g, correct3.g, dz3.g, 0.1f);
    expect_close(loss3, 1e-5, "smoothed loss sum K=" + std::to_string(K));
    expect_bits(correct3, "smoothed correct count K=" + std::to_string(K));
    expect_close(dz3, 1e-5, "smoothed dlogits K=" + std::to_string(K));
  }
}

TEST_CASE("cuda: dropout masks and outputs, bit for bit", "[cuda][dropout]") {
  Rng rng(10);
  for (DType t : float_dtypes()) {
    const Shape s{5, 7, 9, 11};
    Dual x = random_dual(rng, t, s);
    Dual mask = poisoned(DType::U8, s);
    Dual y = poisoned(t, s);
    be().cpu->dropout_forward(x.c, 0.3f, 1234, 99991, mask.c, y.c);
    be().gpu->dropout_forward(x.g, 0.3f, 1234, 99991, mask.g, y.g);
    expect_bits(mask, "dropout mask");
    expect_bits(y, "dropout forward");
    Dual dy = random_dual(rng, t, s);
    Dual dx = poisoned(t, s);
    be().cpu->dropout_backward(dy.c, mask.c, 0.3f, dx.c);
    be().gpu->dropout_backward(dy.g, mask.g, 0.3f, dx.g);
    expect_bits(dx, "dropout backward");
  }
}

TEST_CASE("cuda: unscale_and_check, bit for bit, and the non-finite verdict", "[cuda][fused]") {
  Rng rng(11);
  const int64_t n = 1000003;
  std::vector<float> v = random_floats(rng, n, -70000.0f, 70000.0f);
  Dual g = from_floats(DType::F32, Shape{n}, v);
  const bool c_ok = be().cpu->unscale_and_check(g.c, 1.0f / 32768.0f);
  const bool g_ok = be().gpu->unscale_and_check(g.g, 1.0f / 32768.0f);
  CHECK(c_ok);
  CHECK(g_ok);
  expect_bits(g, "unscaled gradients");
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    v[n - 17] = bad;
    Dual h = from_floats(DType::F32, Shape{n}, v);
    CHECK_FALSE(be().cpu->unscale_and_check(h.c, 0.5f));
    CHECK_FALSE(be().gpu->unscale_and_check(h.g, 0.5f));
  }
}

TEST_CASE("cuda: fused optimizer passes (SGD, momentum, Nesterov, Adam, AdamW), bit for bit", "[cuda][fused]") {
  Rng rng(12);
  const int64_t n = 100003;
  struct OC {
    const char* name;
    OptimizerStep s;
  };
  std::vector<OC> cases;
  {
    OptimizerStep s;
    s.kind = OptimizerStep::Kind::Sgd;
    s.lr = 0.05f;
    cases.push_back({"sgd", s});
    s.momentum = 0.9f;
    cases.push_back({"sgd momentum", s});
    s.nesterov = true;
    s.weight_decay = 1e-4f;
    cases.push_back({"sgd nesterov + l2", s});
    OptimizerStep a;
    a.kind = OptimizerStep::Kind::Adam;
    a.lr = 1e-3f;
    a.t = 7;
    cases.push_back({"adam", a});
    a.weight_decay = 1e-4f;
    cases.push_back({"adam + l2", a});
    a.kind = OptimizerStep::Kind::AdamW;
    a.weight_decay = 0.01f;
    a.t = 1;
    cases.push_back({"adamw", a});
  }
  for (const OC& oc : cases)
    for (DType copy_t : {DType::F32, DType::F16, DType::BF16}) {  // F32 here: no compute copy
      const std::string what = std::string(oc.name) + " copy " + dt_name(copy_t);
      INFO(what);
      Dual w = random_dual(rng, DType::F32, Shape{n});
      Dual g = random_dual(rng, DType::F32, Shape{n}, -0.1f, 0.1f);
      Dual m = random_dual(rng, DType::F32, Shape{n}, -0.01f, 0.01f);
      Dual v = random_dual(rng, DType::F32, Shape{n}, 1e-6f, 1e-3f);
      Dual copy = poisoned(copy_t == DType::F32 ? DType::F16 : copy_t, Shape{n});
      const bool has_copy = copy_t != DType::F32;
      const bool sgd = oc.s.kind == OptimizerStep::Kind::Sgd;
      for (int step = 0; step < 3; ++step) {
        be().cpu->optimizer_step(oc.s, w.c, g.c, m.c, sgd ? Tensor() : v.c, has_copy ? copy.c : Tensor());
        be().gpu->optimizer_step(oc.s, w.g, g.g, m.g, sgd ? Tensor() : v.g, has_copy ? copy.g : Tensor());
      }
      expect_bits(w, what + " master");
      expect_bits(m, what + " state1");
      if (!sgd) expect_bits(v, what + " state2");
      if (has_copy) expect_bits(copy, what + " compute copy");
    }
}

TEST_CASE("cuda: stats (min, max, mean|x|, inf/nan/zero counts)", "[cuda]") {
  Rng rng(13);
  for (DType t : float_dtypes()) {
    std::vector<float> v = random_floats(rng, 50001, -3.0f, 5.0f);
    v[10] = 0.0f;
    v[11] = std::numeric_limits<float>::infinity();
    v[12] = -std::numeric_limits<float>::infinity();
    v[13] = std::numeric_limits<float>::quiet_NaN();
    Dual x = from_floats(t, Shape{50001}, v);
    const TensorStats c = be().cpu->stats(x.c), g = be().gpu->stats(x.g);
    INFO(dt_name(t));
    CHECK(g.count == c.count);
    CHECK(g.n_inf == c.n_inf);
    CHECK(g.n_nan == c.n_nan);
    CHECK(g.n_zero == c.n_zero);
    CHECK(g.min == c.min);
    CHECK(g.max == c.max);
    CHECK(g.mean_abs == Approx(c.mean_abs).epsilon(1e-6));
  }
}
