// SPDX-License-Identifier: MIT
// The CPU backend's dense, elementwise and pooling ops on their oneDNN paths:
// shapes the other backend tests leave out (odd sizes, no bias, batch 1, the smoke and
// CIFAR shapes, padded windows with stride != size, global pooling over 1x1 and large
// windows), all three float dtypes, in-place aliasing, plan reuse across calls and shapes,
// the NaN rules the backend promises, and no memory growth once a shape's plan exists.
// Each result is checked against the float64 reference of tests/support/reference.h.
// Under MPX_CPU_REFERENCE=1 the same cases check the plain loops.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "backend/backend.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;

namespace {

using support::check_close;
using support::check_exact;
using support::dtype_eps;
using support::kInf;
using support::kNaN;
using support::widen;
using Dev = support::CpuDev;

}  // namespace

// ---- dense ----------------------------------------------------------------------------------

TEST_CASE("dnnl dense: forward with/without bias and relu, backward data/weights, odd and net shapes",
          "[backend][cpu][dnnl]") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  struct S {
    int64_t N, Ci, Co;
  };
  // batch 1, 1x1, odd sizes, the smoke head (5408 -> 10), the CIFAR head (256 -> 256 -> 10).
  for (S s : {S{1, 1, 1}, S{1, 9, 3}, S{5, 3, 7}, S{13, 129, 17}, S{128, 5408, 10}, S{64, 256, 256},
              S{64, 256, 10}, S{300, 37, 11}}) {
    DYNAMIC_SECTION(dtype_name(t) << " N=" << s.N << " Cin=" << s.Ci << " Cout=" << s.Co) {
      Dev d;
      Rng rng(static_cast<uint64_t>(100 + s.N * 7 + s.Ci * 3 + s.Co));
      std::vector<float> xv, wv, bv, dyv;
      Tensor x = d.rand(rng, t, Shape{s.N, s.Ci}, &xv);
      Tensor w = d.rand(rng, t, Shape{s.Co, s.Ci}, &wv);
      Tensor b = d.rand(rng, DType::F32, Shape{s.Co}, &bv);
      Tensor dy = d.rand(rng, t, Shape{s.N, s.Co}, &dyv);
      const Vec bw = widen(bv);
      for (bool bias : {true, false})
        for (Activation act : {Activation::None, Activation::Relu}) {
          Tensor y = d.make(t, Shape{s.N, s.Co});
          d.be->dense_forward(x, w, bias ? b : Tensor(), y, act);
          check_close(std::string("dense_forward") + (bias ? " bias" : "") + (act == Activation::Relu ? " relu" : ""),
                      d.get(y), ref::dense_forward(s.N, s.Ci, s.Co, widen(xv), widen(wv), bias ? &bw : nullptr, act),
                      t);
        }
      Tensor dx = d.make(t, Shape{s.N, s.Ci});
      d.be->dense_backward_data(dy, w, dx);
      check_close("dense_backward_data", d.get(dx), ref::dense_backward_data(s.N, s.Ci, s.Co, widen(dyv), widen(wv)),
                  t);
      Vec rdb;
      const Vec rdw = ref::dense_backward_weights(s.N, s.Ci, s.Co, widen(xv), widen(dyv), &rdb);
      for (DType gt : {DType::F32, t})
        for (bool with_db : {true, false}) {
          Tensor dw = d.make(gt, Shape{s.Co, s.Ci});
          Tensor db = with_db ? d.make(gt, Shape{s.Co}) : Tensor();
          d.be->dense_backward_weights(x, dy, dw, db);
          check_close("dense_backward_weights dw", d.get(dw), rdw, gt);
          if (with_db) check_close("dense_backward_weights db", d.get(db), rdb, gt);
        }
    }
  }
}

TEST_CASE("dnnl dense: a cached plan is reused with new data, a partial batch gets its own", "[backend][cpu][dnnl]") {
  Dev d;
  Rng rng(7);
  const int64_t Ci = 19, Co = 6;
  std::vector<float> wv, bv;
  Tensor w = d.rand(rng, DType::F32, Shape{Co, Ci}, &wv);
  Tensor b = d.rand(rng, DType::F32, Shape{Co}, &bv);
  const Vec bw = widen(bv);
  for (int64_t N : {8, 8, 3, 8}) {
    std::vector<float> xv;
    Tensor x = d.rand(rng, DType::F32, Shape{N, Ci}, &xv);
    Tensor y = d.make(DType::F32, Shape{N, Co});
    d.be->dense_forward(x, w, b, y, Activation::Relu);
    check_close("dense_forward N=" + std::to_string(N), d.get(y),
                ref::dense_forward(N, Ci, Co, widen(xv), widen(wv), &bw, Activation::Relu), DType::F32);
  }
}

TEST_CASE("dnnl dense: a row's result does not depend on the batch size (partial last batch)",
          "[backend][cpu][dnnl]") {
  // The model runs a partial batch as a row slice and expects the same rows, bit for bit
  // (test_nn "a partial batch uses row slices and gives the same rows").
  auto t = GENERATE(DType::F32, DType::BF16);
  struct S {
    int64_t Ci, Co;
  };
  auto N = GENERATE(as<int64_t>(), 5, 300);  // within one row chunk of the oneDNN path, and across three
  for (S s : {S{32, 16}, S{16, 10}, S{72, 16}, S{5408, 10}, S{256, 256}}) {
    DYNAMIC_SECTION(dtype_name(t) << " N=" << N << " Cin=" << s.Ci << " Cout=" << s.Co) {
      Dev d;
      Rng rng(static_cast<uint64_t>(s.Ci + s.Co));
      Tensor x = d.rand(rng, t, Shape{N, s.Ci}, nullptr), w = d.rand(rng, t, Shape{s.Co, s.Ci}, nullptr);
      Tensor b = d.rand(rng, DType::F32, Shape{s.Co}, nullptr), dy = d.rand(rng, t, Shape{N, s.Co}, nullptr);
      Tensor y = d.make(t, Shape{N, s.Co}), dx = d.make(t, Shape{N, s.Ci});
      d.be->dense_forward(x, w, b, y, Activation::Relu);
      d.be->dense_backward_data(dy, w, dx);
      const auto yf = d.get(y), dxf = d.get(dx);
      for (int64_t n : {1, 2, 3, 4, 17, 127, 128, 129, 256, 299}) {
        if (n >= N) continue;
        Tensor yp = d.make(t, Shape{n, s.Co}), dxp = d.make(t, Shape{n, s.Ci});
        d.be->dense_forward(x.slice_rows(0, n), w, b, yp, Activation::Relu);
        d.be->dense_backward_data(dy.slice_rows(0, n), w, dxp);
        check_exact("dense_forward rows of a batch of " + std::to_string(n), d.get(yp),
                    std::vector<float>(yf.begin(), yf.begin() + n * s.Co));
        check_exact("dense_backward_data rows of a batch of " + std::to_string(n), d.get(dxp),
                    std::vector<float>(dxf.begin(), dxf.begin() + n * s.Ci));
      }
    }
  }
}

TEST_CASE("dnnl dense: relu keeps NaN (a NaN input row gives a NaN output row)", "[backend][cpu][dnnl]") {
  auto t = GENERATE(DType::F32, DType::BF16);
  Dev d;
  const int64_t N = 3, Ci = 4, Co = 2;
  Tensor x = d.make(t, Shape{N, Ci});
  d.put(x, {1, 1, 1, 1, kNaN, 1, 1, 1, -1, -1, -1, -1});
  Tensor w = d.make(t, Shape{Co, Ci});
  d.put(w, {1, 1, 1, 1, -1, -1, -1, -1});
  Tensor y = d.make(t, Shape{N, Co});
  d.be->dense_forward(x, w, Tensor(), y, Activation::Relu);
  check_exact("dense relu NaN", d.get(y), {4, 0, kNaN, kNaN, 0, 4});
}

// ---- elementwise ----------------------------------------------------------------------------

TEST_CASE("dnnl relu backward and add: exact values, sizes around vector and block edges, aliasing",
          "[backend][cpu][dnnl]") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  for (int64_t n : {1, 7, 8, 4096, 10007, 300001}) {
    DYNAMIC_SECTION(dtype_name(t) << " n=" << n) {
      Dev d;
      Rng rng(static_cast<uint64_t>(n));
      std::vector<float> xv, dyv, bv;
      Tensor x = d.rand(rng, t, Shape{n}, &xv);
      // Exact zeros and negative zeros among the inputs: relu(-0) = -0, and y = +-0 is a dead unit.
      for (size_t i = 0; i < xv.size(); i += 5) xv[i] = (i % 10 == 0) ? 0.0f : -0.0f;
      d.put(x, xv);
      Tensor dy = d.rand(rng, t, Shape{n}, &dyv);
      Tensor b = d.rand(rng, t, Shape{n}, &bv);
      std::vector<float> yw(xv.size()), dxw(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {
        yw[i] = xv[i] < 0.0f ? 0.0f : xv[i];
        dxw[i] = yw[i] > 0.0f ? dyv[i] : 0.0f;
      }
      Tensor y = d.make(t, Shape{n});
      d.be->activation_forward(Activation::Relu, x, y);
      check_exact("relu forward", d.get(y), yw);
      Tensor dx = d.make(t, Shape{n});
      d.be->activation_backward(Activation::Relu, y, dy, dx);
      check_exact("relu backward", d.get(dx), dxw);
      d.be->activation_backward(Activation::Relu, y, dy, dx);  // the cached plan again
      check_exact("relu backward, second call", d.get(dx), dxw);

      // add: y separate, y == a, y == b, y == a == b; the exact float32 sum rounded once.
      std::vector<float> sum(xv.size()), sum2(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) sum[i] = round_to(t, yw[i] + bv[i]);
      Tensor s = d.make(t, Shape{n});
      d.be->add(y, b, s);
      check_exact("add", d.get(s), sum);
      d.be->add(s, b, s);  // y aliases a
      for (size_t i = 0; i < xv.size(); ++i) sum2[i] = round_to(t, sum[i] + bv[i]);
      check_exact("add, y is a", d.get(s), sum2);
      d.put(s, sum);
      d.be->add(b, s, s);  // y aliases b
      check_exact("add, y is b", d.get(s), sum2);
      d.put(s, sum);
      d.be->add(s, s, s);  // all three the same
      for (size_t i = 0; i < xv.size(); ++i) sum2[i] = round_to(t, sum[i] + sum[i]);
      check_exact("add, y is a is b", d.get(s), sum2);

      d.be->activation_backward(Activation::Relu, y, dy, dy);  // dx aliases dy
      check_exact("relu backward in place", d.get(dy), dxw);
      d.be->activation_forward(Activation::Relu, x, x);  // y aliases x
      check_exact("relu forward in place", d.get(x), yw);
    }
  }
}

TEST_CASE("dnnl relu: NaN stays NaN forward at every vector lane; a live unit passes NaN/inf dy back",
          "[backend][cpu][dnnl]") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  Dev d;
  const int64_t n = 67;
  std::vector<float> xv(static_cast<size_t>(n));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = (i % 3 == 0) ? kNaN : (i % 3 == 1 ? -1.0f : 2.0f);
  Tensor x = d.make(t, Shape{n});
  d.put(x, xv);
  Tensor y = d.make(t, Shape{n});
  d.be->activation_forward(Activation::Relu, x, y);
  std::vector<float> yw(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) yw[i] = (i % 3 == 0) ? kNaN : (i % 3 == 1 ? 0.0f : 2.0f);
  check_exact("relu forward NaN", d.get(y), yw);
  // Backward at live units (y = 2) passes dy through, non-finite too.
  std::vector<float> yl(xv.size(), 2.0f), dyv(xv.size());
  for (size_t i = 0; i < dyv.size(); ++i) dyv[i] = (i % 3 == 0) ? kNaN : (i % 3 == 1 ? kInf : -3.0f);
  Tensor ylive = d.make(t, Shape{n}), dy = d.make(t, Shape{n}), dx = d.make(t, Shape{n});
  d.put(ylive, yl);
  d.put(dy, dyv);
  d.be->activation_backward(Activation::Relu, ylive, dy, dx);
  check_exact("relu backward, live units", d.get(dx), dyv);
}

// ---- pooling --------------------------------------------------------------------------------

TEST_CASE("dnnl pooling: padded windows, stride != window, odd sizes, both kinds, all dtypes",
          "[backend][cpu][dnnl]") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  auto kind = GENERATE(PoolKind::Avg, PoolKind::Max);
  struct Case {
    const char* name;
    int R, S, sh, sw, pt, pl, pb, pr;
    int64_t N, H, W, C;
  };
  const Case cases[] = {
      {"2x2/2 even", 2, 2, 2, 2, 0, 0, 0, 0, 2, 8, 8, 16},
      {"2x2/2 odd image (uncovered last row/col)", 2, 2, 2, 2, 0, 0, 0, 0, 3, 7, 9, 5},
      {"2x2/2 same (pad bottom/right)", 2, 2, 2, 2, 0, 0, 1, 1, 2, 7, 7, 8},
      {"3x3/1 same", 3, 3, 1, 1, 1, 1, 1, 1, 2, 6, 5, 3},
      {"3x3/2 same asymmetric", 3, 3, 2, 2, 0, 0, 1, 1, 2, 8, 8, 24},
      {"3x3/2 pad all sides, odd", 3, 3, 2, 2, 1, 1, 1, 1, 1, 9, 11, 7},
      {"2x3/(1,2) rectangular", 2, 3, 1, 2, 1, 0, 0, 2, 2, 5, 8, 4},
      {"1x1/1", 1, 1, 1, 1, 0, 0, 0, 0, 2, 3, 3, 33},
      {"4x4/3 overlapping-free with gaps", 4, 4, 3, 3, 1, 2, 1, 0, 2, 10, 9, 9},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name << " " << dtype_name(t) << (kind == PoolKind::Max ? " max" : " avg")) {
      Dev d;
      Rng rng(static_cast<uint64_t>(c.H * 100 + c.W * 10 + c.C));
      PoolParams p;
      p.kind = kind;
      p.R = c.R, p.S = c.S, p.stride_h = c.sh, p.stride_w = c.sw;
      p.pad_top = c.pt, p.pad_left = c.pl, p.pad_bottom = c.pb, p.pad_right = c.pr;
      const int64_t P = p.out_h(static_cast<int>(c.H)), Q = p.out_w(static_cast<int>(c.W));
      std::vector<float> xv, dyv;
      Tensor x = d.rand(rng, t, Shape{c.N, c.H, c.W, c.C}, &xv);
      Tensor dy = d.rand(rng, t, Shape{c.N, P, Q, c.C}, &dyv);
      Tensor y = d.make(t, Shape{c.N, P, Q, c.C});
      for (int rep = 0; rep < 2; ++rep) {  // the second call reuses the plans
        d.be->pool_forward(p, x, y);
        check_close("pool_forward", d.get(y), ref::pool_forward(p, c.N, c.H, c.W, c.C, widen(xv)), t);
        Tensor dx = d.make(t, Shape{c.N, c.H, c.W, c.C});
        d.be->pool_backward(p, x, y, dy, dx);
        check_close("pool_backward", d.get(dx), ref::pool_backward(p, c.N, c.H, c.W, c.C, widen(xv), widen(dyv)),
                    t);
      }
    }
  }
}

TEST_CASE("dnnl global average pooling: 1x1, odd and net-sized windows, all dtypes", "[backend][cpu][dnnl]") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  struct S {
    int64_t N, H, W, C;
  };
  for (S s : {S{2, 1, 1, 3}, S{3, 5, 6, 7}, S{1, 13, 13, 129}, S{4, 32, 32, 128}}) {
    DYNAMIC_SECTION(dtype_name(t) << " " << s.N << "x" << s.H << "x" << s.W << "x" << s.C) {
      Dev d;
      Rng rng(static_cast<uint64_t>(s.H * 31 + s.C));
      std::vector<float> xv, dyv;
      Tensor x = d.rand(rng, t, Shape{s.N, s.H, s.W, s.C}, &xv);
      Tensor y = d.make(t, Shape{s.N, s.C});
      d.be->global_avg_pool_forward(x, y);
      check_close("gap forward", d.get(y), ref::global_avg_pool_forward(s.N, s.H * s.W, s.C, widen(xv)), t);
      Tensor dy = d.rand(rng, t, Shape{s.N, s.C}, &dyv);
      Tensor dx = d.make(t, Shape{s.N, s.H, s.W, s.C});
      d.be->global_avg_pool_backward(dy, dx);
      check_close("gap backward", d.get(dx), ref::global_avg_pool_backward(s.N, s.H * s.W, s.C, widen(dyv)), t);
      // 16-bit: exactly the float32 broadcast dy/HW rounded once.
      Tensor dy32 = d.make(DType::F32, dy.shape), dx32 = d.make(DType::F32, dx.shape);
      d.put(dy32, dyv);
      d.be->global_avg_pool_backward(dy32, dx32);
      std::vector<float> want = d.get(dx32);
      for (float& v : want) v = round_to(t, v);
      support::check_exact("gap backward vs rounded float32", d.get(dx), want);
    }
  }
}

TEST_CASE("dnnl max pooling keeps the backend's rules: first maximum of a tie, NaN wins, -inf stays",
          "[backend][cpu][dnnl]") {
  // 3x3 windows, stride 1, padding 1 (the generic path), 2 channels.
  Dev d;
  PoolParams p;
  p.R = p.S = 3;
  p.stride_h = p.stride_w = 1;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = 1;
  Tensor x = d.make(DType::F32, Shape{1, 1, 3, 2});
  // channel 0: a tie of 5s; channel 1: -inf everywhere but a NaN in the middle
  d.put(x, {5, -kInf, 1, kNaN, 5, -kInf});
  Tensor y = d.make(DType::F32, Shape{1, 1, 3, 2});
  d.be->pool_forward(p, x, y);
  check_exact("max forward", d.get(y), {5, kNaN, 5, kNaN, 5, kNaN});
  Tensor dy = d.make(DType::F32, Shape{1, 1, 3, 2});
  d.put(dy, {1, 10, 2, 20, 4, 40});
  Tensor dx = d.make(DType::F32, Shape{1, 1, 3, 2});
  d.be->pool_backward(p, x, y, dy, dx);
  // channel 0: windows 0 and 1 take the first 5 (column 0); window 2 (columns 1-2) takes column 2.
  check_exact("max backward", d.get(dx), {3, 0, 0, 70, 4, 0});

  Tensor xi = d.make(DType::F32, Shape{1, 2, 2, 1});
  d.put(xi, {-kInf, -kInf, -kInf, -kInf});
  Tensor yi = d.make(DType::F32, Shape{1, 1, 1, 1});
  PoolParams two;
  d.be->pool_forward(two, xi, yi);
  check_exact("max of -inf", d.get(yi), {-kInf});
}

TEST_CASE("dnnl ops: no memory growth after the first call of a shape", "[backend][cpu][dnnl]") {
  auto t = GENERATE(DType::F32, DType::BF16);
  Dev d;
  Rng rng(5);
  Tensor x = d.rand(rng, t, Shape{16, 6, 6, 8}, nullptr);
  Tensor w = d.rand(rng, t, Shape{10, 288}, nullptr);
  Tensor b = d.rand(rng, DType::F32, Shape{10}, nullptr);
  Tensor y = d.make(t, Shape{16, 10}), dy = d.rand(rng, t, Shape{16, 10}, nullptr);
  Tensor dx = d.make(t, Shape{16, 6, 6, 8});
  Tensor dw = d.make(DType::F32, Shape{10, 288}), db = d.make(DType::F32, Shape{10});
  PoolParams avg;
  avg.kind = PoolKind::Avg;
  avg.R = avg.S = 3, avg.stride_h = avg.stride_w = 2, avg.pad_bottom = avg.pad_right = 1;
  Tensor py = d.make(t, Shape{16, 3, 3, 8});
  Tensor gy = d.make(t, Shape{16, 8});
  auto step = [&] {
    d.be->dense_forward(x, w, b, y, Activation::Relu);
    d.be->dense_backward_data(dy, w, dx);
    d.be->dense_backward_weights(x, dy, dw, db);
    d.be->activation_backward(Activation::Relu, y, dy, dy);
    d.be->add(y, dy, y);
    d.be->pool_forward(avg, x, py);
    d.be->pool_backward(avg, x, py, py, dx);
    d.be->global_avg_pool_forward(x, gy);
    d.be->global_avg_pool_backward(gy, dx);
  };
  step();
  const size_t after_first = d.be->memory_stats().current_bytes;
  for (int i = 0; i < 3; ++i) step();
  REQUIRE(d.be->memory_stats().current_bytes == after_first);
}
