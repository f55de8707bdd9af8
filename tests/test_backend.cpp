// SPDX-License-Identifier: MIT
// Tests of the Backend interface on the CPU backend: every op against the
// float64 reference of tests/support/reference.h on random inputs (outputs
// poisoned with NaN first), float32 tight and float16/bfloat16 within their
// rounding; optimizer steps against hand-computed values; validation errors.
#include <array>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/pool_bound.h"
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

std::vector<float> rounded(const std::vector<float>& v, DType t) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to(t, v[i]);
  return r;
}

}  // namespace

// ---- memory ------------------------------------------------------------------------------

TEST_CASE("backend memory: fill, copy, upload/download round trip, accounting") {
  Dev d;
  const MemoryStats m0 = d.be->memory_stats();
  {
    Buffer a = d.be->alloc(1000, "a");
    Buffer b = d.be->alloc(3000, "b");
    REQUIRE(reinterpret_cast<uintptr_t>(a.data()) % 64 == 0);
    REQUIRE(d.be->memory_stats().current_bytes == m0.current_bytes + 4000);
    Buffer c = std::move(a);  // moving does not count twice
    REQUIRE(d.be->memory_stats().current_bytes == m0.current_bytes + 4000);
    { Buffer tmp = std::move(b); }
    REQUIRE(d.be->memory_stats().current_bytes == m0.current_bytes + 1000);
    REQUIRE(d.be->memory_stats().peak_bytes >= m0.current_bytes + 4000);
  }
  REQUIRE(d.be->memory_stats().current_bytes == m0.current_bytes);
  REQUIRE(d.be->memory_stats().peak_bytes >= m0.current_bytes + 4000);

  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    Tensor x = d.make(t, Shape{3, 5});
    d.be->fill(x, 0.1f);
    check_exact("fill", d.get(x), std::vector<float>(15, round_to(t, 0.1f)));
    Rng rng(1);
    std::vector<float> v;
    Tensor y = d.rand(rng, t, Shape{15}, &v);
    d.be->copy(x, y);
    check_exact("copy", d.get(x), v);
  }
  Tensor i = d.make(DType::I32, Shape{4});
  d.be->fill(i, 7.0f);
  std::vector<int32_t> iv(4);
  d.be->download(iv.data(), i);
  REQUIRE(iv == std::vector<int32_t>{7, 7, 7, 7});
}

TEST_CASE("backend alloc: a view larger than its buffer is an error") {
  Dev d;
  Buffer b = d.be->alloc(64, "small");
  REQUIRE_THROWS_AS(b.view(DType::F32, Shape{17}), Error);
}

// ---- casts -------------------------------------------------------------------------------

TEST_CASE("backend cast rounds to nearest-even once, between every pair of float dtypes") {
  Dev d;
  Rng rng(2);
  const std::vector<DType> types{DType::F32, DType::F16, DType::BF16};
  for (DType from : types)
    for (DType to : types) {
      std::vector<float> v;
      Tensor x = d.rand(rng, from, Shape{1000}, &v, -300, 300);
      Tensor y = d.make(to, Shape{10, 100});
      d.be->cast(x, y);
      check_exact(std::string("cast ") + dtype_name(from) + "->" + dtype_name(to), d.get(y), rounded(v, to));
    }
  // float16 overflow to inf and underflow to zero, as on the GPU.
  Tensor big = d.make(DType::F32, Shape{3});
  d.put(big, {70000.0f, 1e-9f, -65504.0f});
  Tensor h = d.make(DType::F16, Shape{3});
  d.be->cast(big, h);
  check_exact("cast f16 range", d.get(h), {kInf, 0.0f, -65504.0f});
}

TEST_CASE("backend normalize_input: (x/255 - mean)/std per channel") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  // 3 channels and one (MNIST); the larger shapes span several of the CPU's blocks, whose
  // ends fall inside a row's 16 repeats of the channels' constants.
  const auto shape = GENERATE(std::array<int64_t, 4>{3, 5, 4, 3}, std::array<int64_t, 4>{7, 33, 31, 3},
                              std::array<int64_t, 4>{3, 5, 7, 1}, std::array<int64_t, 4>{9, 28, 29, 1});
  Dev d;
  Rng rng(3);
  const int64_t N = shape[0], H = shape[1], W = shape[2], C = shape[3];
  std::vector<uint8_t> px(static_cast<size_t>(N * H * W * C));
  for (auto& p : px) p = static_cast<uint8_t>(rng.uniform_int(256));
  Tensor x = d.make(DType::U8, Shape{N, H, W, C});
  d.be->upload(x, px.data());
  Tensor mean = d.make(DType::F32, Shape{C}), sd = d.make(DType::F32, Shape{C});
  std::vector<float> mv{0.4914f, 0.4822f, 0.4465f}, sv{0.2470f, 0.2435f, 0.2616f};
  mv.resize(static_cast<size_t>(C));
  sv.resize(static_cast<size_t>(C));
  d.put(mean, mv);
  d.put(sd, sv);
  Tensor y = d.make(t, Shape{N, H, W, C});
  d.be->normalize_input(x, mean, sd, y);
  Vec want(px.size());
  for (size_t i = 0; i < px.size(); ++i) want[i] = (px[i] / 255.0 - mv[i % C]) / sv[i % C];
  check_close("normalize_input", d.get(y), want, t);
}

// ---- convolution ---------------------------------------------------------------------------

namespace {
struct ConvCase {
  const char* name;
  int64_t N, H, W, C, K;
  Conv2dParams p;
  bool bias;
  Activation act;
};
std::vector<ConvCase> conv_cases() {
  std::vector<ConvCase> cs;
  Conv2dParams same3;
  same3.R = same3.S = 3;
  same3.pad_top = same3.pad_left = same3.pad_bottom = same3.pad_right = 1;
  cs.push_back({"3x3 same + bias + relu", 3, 7, 6, 3, 4, same3, true, Activation::Relu});
  // 16+ channels and 8+ pixels: Winograd's shapes by default (MPX_CONV_WINOGRAD, docs/cpu-performance.md).
  cs.push_back({"3x3 same, 16 -> 24 channels + bias + relu", 2, 9, 10, 16, 24, same3, true, Activation::Relu});
  Conv2dParams asym;
  asym.R = 3, asym.S = 2, asym.stride_h = asym.stride_w = 2;
  asym.pad_top = 0, asym.pad_left = 1, asym.pad_bottom = 1, asym.pad_right = 0;
  cs.push_back({"3x2 stride 2 asymmetric padding", 2, 8, 9, 5, 6, asym, false, Activation::None});
  Conv2dParams even;
  even.R = even.S = 2;
  even.pad_bottom = even.pad_right = 1;  // Keras "same" with an even kernel
  cs.push_back({"2x2 same (pad bottom/right) + bias, blocked layout", 2, 5, 5, 16, 16, even, true, Activation::None});
  Conv2dParams one;
  cs.push_back({"1x1", 1, 4, 3, 16, 8, one, true, Activation::Relu});
  return cs;
}
}  // namespace

TEST_CASE("backend conv2d forward / backward data / backward filter match the float64 reference") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  for (const ConvCase& cc : conv_cases()) {
    DYNAMIC_SECTION(cc.name << " " << dtype_name(t)) {
      Dev d;
      Rng rng(11);
      const Conv2dParams& p = cc.p;
      const int64_t P = p.out_h(static_cast<int>(cc.H)), Q = p.out_w(static_cast<int>(cc.W));
      std::vector<float> xv, wv, bv, dyv;
      Tensor x = d.rand(rng, t, Shape{cc.N, cc.H, cc.W, cc.C}, &xv);
      Tensor w = d.rand(rng, t, Shape{cc.K, p.R, p.S, cc.C}, &wv);
      // The bias is float32 for one dtype pattern and the compute dtype for the others.
      const DType bt = t == DType::BF16 ? DType::F32 : t;
      Tensor b = cc.bias ? d.rand(rng, bt, Shape{cc.K}, &bv) : Tensor();
      Tensor y = d.make(t, Shape{cc.N, P, Q, cc.K});
      Tensor dy = d.rand(rng, t, Shape{cc.N, P, Q, cc.K}, &dyv);
      const ref::ConvDims rd = ref::conv_dims(p, cc.N, cc.H, cc.W, cc.C, cc.K);
      const Vec bw = widen(bv);

      d.be->conv2d_forward(p, x, w, b, y, cc.act);
      check_close("conv2d_forward", d.get(y),
                  ref::conv2d_forward(p, rd, widen(xv), widen(wv), cc.bias ? &bw : nullptr, cc.act), t);

      Tensor dx = d.make(t, Shape{cc.N, cc.H, cc.W, cc.C});
      d.be->conv2d_backward_data(p, dy, w, dx);
      check_close("conv2d_backward_data", d.get(dx), ref::conv2d_backward_data(p, rd, widen(dyv), widen(wv)), t);

      for (DType gt : {DType::F32, t}) {
        Tensor dw = d.make(gt, Shape{cc.K, p.R, p.S, cc.C});
        Tensor db = d.make(gt, Shape{cc.K});
        d.be->conv2d_backward_filter(p, x, dy, dw, cc.bias ? db : Tensor());
        Vec rdb;
        const Vec rdw = ref::conv2d_backward_filter(p, rd, widen(xv), widen(dyv), &rdb);
        check_close("conv2d_backward_filter dw", d.get(dw), rdw, gt);
        if (cc.bias) check_close("conv2d_backward_filter db", d.get(db), rdb, gt);
      }
    }
  }
}

TEST_CASE("backend conv2d: 16-bit output is the float32 result rounded once") {
  auto t = GENERATE(DType::F16, DType::BF16);
  Dev d;
  Rng rng(12);
  Conv2dParams p;
  p.R = p.S = 3;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = 1;
  std::vector<float> xv, wv;
  Tensor x = d.rand(rng, t, Shape{2, 6, 6, 4}, &xv);
  Tensor w = d.rand(rng, t, Shape{8, 3, 3, 4}, &wv);
  Tensor x32 = d.make(DType::F32, x.shape), w32 = d.make(DType::F32, w.shape);
  d.put(x32, xv);
  d.put(w32, wv);
  Tensor y = d.make(t, Shape{2, 6, 6, 8}), y32 = d.make(DType::F32, Shape{2, 6, 6, 8});
  d.be->conv2d_forward(p, x, w, Tensor(), y, Activation::Relu);
  d.be->conv2d_forward(p, x32, w32, Tensor(), y32, Activation::Relu);
  check_exact("conv2d_forward 16-bit vs rounded float32", d.get(y), rounded(d.get(y32), t));
}

TEST_CASE("backend conv2d: a partial last batch is just another shape") {
  Dev d;
  Rng rng(13);
  Conv2dParams p;
  p.R = p.S = 3;
  std::vector<float> xv, wv;
  Tensor x = d.rand(rng, DType::F32, Shape{5, 6, 6, 3}, &xv);
  Tensor w = d.rand(rng, DType::F32, Shape{4, 3, 3, 3}, &wv);
  Tensor y = d.make(DType::F32, Shape{5, 4, 4, 4});
  d.be->conv2d_forward(p, x, w, Tensor(), y, Activation::None);
  const ref::ConvDims full = ref::conv_dims(p, 5, 6, 6, 3, 4);
  const Vec want = ref::conv2d_forward(p, full, widen(xv), widen(wv), nullptr, Activation::None);
  check_close("conv full batch", d.get(y), want, DType::F32);
  d.be->fill(y, kNaN);
  Tensor xs = x.slice_rows(0, 2), ys = y.slice_rows(0, 2);
  d.be->conv2d_forward(p, xs, w, Tensor(), ys, Activation::None);
  const std::vector<float> got = d.get(y);
  check_close("conv partial batch", std::vector<float>(got.begin(), got.begin() + 2 * 64),
              Vec(want.begin(), want.begin() + 2 * 64), DType::F32);
  for (size_t i = 2 * 64; i < got.size(); ++i) REQUIRE(std::isnan(got[i]));  // rows past the slice untouched
}

// ---- dense ---------------------------------------------------------------------------------

TEST_CASE("backend dense forward / backward match the float64 reference") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  Dev d;
  Rng rng(21);
  const int64_t N = 7, Ci = 37, Co = 11;
  std::vector<float> xv, wv, bv, dyv;
  Tensor x = d.rand(rng, t, Shape{N, Ci}, &xv);
  Tensor w = d.rand(rng, t, Shape{Co, Ci}, &wv);
  Tensor b = d.rand(rng, DType::F32, Shape{Co}, &bv);
  Tensor dy = d.rand(rng, t, Shape{N, Co}, &dyv);
  const Vec bw = widen(bv);
  for (Activation act : {Activation::None, Activation::Relu}) {
    Tensor y = d.make(t, Shape{N, Co});
    d.be->dense_forward(x, w, b, y, act);
    check_close("dense_forward", d.get(y), ref::dense_forward(N, Ci, Co, widen(xv), widen(wv), &bw, act), t);
  }
  Tensor y = d.make(t, Shape{N, Co});
  d.be->dense_forward(x, w, Tensor(), y, Activation::None);
  check_close("dense_forward no bias", d.get(y), ref::dense_forward(N, Ci, Co, widen(xv), widen(wv), nullptr,
                                                                    Activation::None), t);
  Tensor dx = d.make(t, Shape{N, Ci});
  d.be->dense_backward_data(dy, w, dx);
  check_close("dense_backward_data", d.get(dx), ref::dense_backward_data(N, Ci, Co, widen(dyv), widen(wv)), t);
  for (DType gt : {DType::F32, t}) {
    Tensor dw = d.make(gt, Shape{Co, Ci});
    Tensor db = d.make(gt, Shape{Co});
    d.be->dense_backward_weights(x, dy, dw, db);
    Vec rdb;
    const Vec rdw = ref::dense_backward_weights(N, Ci, Co, widen(xv), widen(dyv), &rdb);
    check_close("dense_backward_weights dw", d.get(dw), rdw, gt);
    check_close("dense_backward_weights db", d.get(db), rdb, gt);
  }
}

TEST_CASE("backend dense takes an NHWC input as [N, H*W*C]") {
  Dev d;
  Rng rng(22);
  std::vector<float> xv, wv;
  Tensor x = d.rand(rng, DType::F32, Shape{3, 4, 4, 2}, &xv);
  Tensor w = d.rand(rng, DType::F32, Shape{5, 32}, &wv);
  Tensor y = d.make(DType::F32, Shape{3, 5});
  d.be->dense_forward(x, w, Tensor(), y, Activation::None);
  check_close("dense nhwc", d.get(y), ref::dense_forward(3, 32, 5, widen(xv), widen(wv), nullptr, Activation::None),
              DType::F32);
}

// ---- elementwise ------------------------------------------------------------------------------

TEST_CASE("backend relu forward/backward (from y), add, in place") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  Dev d;
  Rng rng(31);
  const int64_t n = 10007;  // more than two blocks, not a multiple
  std::vector<float> xv, dyv, bv;
  Tensor x = d.rand(rng, t, Shape{n}, &xv);
  Tensor dy = d.rand(rng, t, Shape{n}, &dyv);
  Tensor b = d.rand(rng, t, Shape{n}, &bv);
  Tensor y = d.make(t, Shape{n});
  d.be->activation_forward(Activation::Relu, x, y);
  std::vector<float> want(xv.size()), dwant(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    want[i] = xv[i] < 0 ? 0.0f : xv[i];
    dwant[i] = want[i] > 0 ? dyv[i] : 0.0f;
  }
  check_exact("relu forward", d.get(y), want);
  Tensor dx = d.make(t, Shape{n});
  d.be->activation_backward(Activation::Relu, y, dy, dx);
  check_exact("relu backward", d.get(dx), dwant);
  d.be->activation_backward(Activation::Relu, y, dy, dy);  // dx aliases dy
  check_exact("relu backward in place", d.get(dy), dwant);
  d.be->activation_forward(Activation::Relu, x, x);  // y aliases x
  check_exact("relu forward in place", d.get(x), want);

  Tensor s = d.make(t, Shape{n});
  d.be->add(x, b, s);
  Vec swant(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) swant[i] = static_cast<double>(want[i]) + bv[i];
  check_close("add", d.get(s), swant, t);
  d.be->add(s, b, s);
  for (size_t i = 0; i < xv.size(); ++i) swant[i] = static_cast<double>(round_to(t, static_cast<float>(swant[i]))) + bv[i];
  check_close("add in place", d.get(s), swant, t);
}

TEST_CASE("backend relu keeps NaN so that check_numerics sees it") {
  Dev d;
  Tensor x = d.make(DType::F32, Shape{3});
  d.put(x, {kNaN, -1.0f, 2.0f});
  Tensor y = d.make(DType::F32, Shape{3});
  d.be->activation_forward(Activation::Relu, x, y);
  const auto v = d.get(y);
  REQUIRE(std::isnan(v[0]));
  REQUIRE(v[1] == 0.0f);
  REQUIRE(v[2] == 2.0f);
}

// ---- pooling ------------------------------------------------------------------------------------

TEST_CASE("backend pooling forward/backward match the float64 reference") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  auto kind = GENERATE(PoolKind::Max, PoolKind::Avg);
  struct Case {
    const char* name;
    PoolParams p;
  };
  std::vector<Case> cases;
  PoolParams two;  // 2x2 stride 2
  cases.push_back({"2x2/2", two});
  PoolParams three;
  three.R = three.S = 3;
  three.pad_top = 1, three.pad_left = 0, three.pad_bottom = 2, three.pad_right = 1;  // asymmetric, overlapping
  cases.push_back({"3x3/2 asymmetric padding", three});
  for (auto& c : cases) {
    DYNAMIC_SECTION(c.name << " " << dtype_name(t) << (kind == PoolKind::Max ? " max" : " avg")) {
      Dev d;
      Rng rng(41);
      PoolParams p = c.p;
      p.kind = kind;
      const int64_t N = 3, H = 7, W = 8, C = 5;
      const int64_t P = p.out_h(H), Q = p.out_w(W);
      std::vector<float> xv, dyv;
      Tensor x = d.rand(rng, t, Shape{N, H, W, C}, &xv);
      Tensor dy = d.rand(rng, t, Shape{N, P, Q, C}, &dyv);
      Tensor y = d.make(t, Shape{N, P, Q, C});
      d.be->pool_forward(p, x, y);
      check_close("pool_forward", d.get(y), ref::pool_forward(p, N, H, W, C, widen(xv)), t);
      Tensor dx = d.make(t, Shape{N, H, W, C});
      d.be->pool_backward(p, x, y, dy, dx);
      check_close("pool_backward", d.get(dx), ref::pool_backward(p, N, H, W, C, widen(xv), widen(dyv)), t);
    }
  }
}

TEST_CASE("backend max pooling routes the gradient to the first maximum of a tie") {
  Dev d;
  PoolParams p;  // 2x2 stride 2
  Tensor x = d.make(DType::F32, Shape{1, 2, 2, 1});
  d.put(x, {1.0f, 3.0f, 3.0f, 2.0f});
  Tensor y = d.make(DType::F32, Shape{1, 1, 1, 1});
  d.be->pool_forward(p, x, y);
  REQUIRE(d.get(y)[0] == 3.0f);
  Tensor dy = d.make(DType::F32, Shape{1, 1, 1, 1});
  d.put(dy, {5.0f});
  Tensor dx = d.make(DType::F32, Shape{1, 2, 2, 1});
  d.be->pool_backward(p, x, y, dy, dx);
  check_exact("first max", d.get(dx), {0.0f, 5.0f, 0.0f, 0.0f});
}

// The bound that the CUDA agreement tests hold both backends to (tests/support/pool_bound.h):
// every element of the CPU's average pooling within the float32 summation bound of float64.
TEST_CASE("backend average pooling is within the float32 summation bound of the float64 reference") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  Dev d;
  Rng rng(43);
  PoolParams p;
  p.kind = PoolKind::Avg;
  p.R = p.S = 3;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = 1;
  const Shape xs{3, 9, 8, 5};
  const int P = p.out_h(9), Q = p.out_w(8);
  std::vector<float> xv, dyv;
  Tensor x = d.rand(rng, t, xs, &xv);
  Tensor dy = d.rand(rng, t, Shape{3, P, Q, 5}, &dyv);
  Tensor y = d.make(t, Shape{3, P, Q, 5}), dx = d.make(t, xs);
  d.be->pool_forward(p, x, y);
  d.be->pool_backward(p, x, y, dy, dx);
  const support::AvgPoolRef r = support::avg_pool_reference(p, t, xs, xv, P, Q, dyv);
  auto within = [](const char* what, const std::vector<float>& got, const std::vector<double>& ref,
                   const std::vector<double>& bound) {
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO(what << " element " << i << ": " << got[i] << " against " << ref[i] << ", bound " << bound[i]);
      REQUIRE(std::fabs(got[i] - ref[i]) <= bound[i]);
    }
  };
  within("avg forward", d.get(y), r.y, r.y_bound);
  within("avg backward", d.get(dx), r.dx, r.dx_bound);

  const Shape gs{4, 7, 6, 33};
  std::vector<float> gv;
  Tensor gx = d.rand(rng, t, gs, &gv);
  Tensor gy = d.make(t, Shape{4, 33});
  d.be->global_avg_pool_forward(gx, gy);
  PoolParams whole;
  whole.kind = PoolKind::Avg;
  whole.R = 7;
  whole.S = 6;
  const support::AvgPoolRef g =
      support::avg_pool_reference(whole, t, gs, gv, 1, 1, std::vector<float>(static_cast<size_t>(4 * 33), 0.0f));
  within("global avg forward", d.get(gy), g.y, g.y_bound);
}

TEST_CASE("backend global average pooling") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  Dev d;
  Rng rng(42);
  const int64_t N = 3, H = 5, W = 6, C = 7;
  std::vector<float> xv, dyv;
  Tensor x = d.rand(rng, t, Shape{N, H, W, C}, &xv);
  Tensor y = d.make(t, Shape{N, C});
  d.be->global_avg_pool_forward(x, y);
  check_close("gap forward", d.get(y), ref::global_avg_pool_forward(N, H * W, C, widen(xv)), t);
  Tensor dy = d.rand(rng, t, Shape{N, C}, &dyv);
  Tensor dx = d.make(t, Shape{N, H, W, C});
  d.be->global_avg_pool_backward(dy, dx);
  check_close("gap backward", d.get(dx), ref::global_avg_pool_backward(N, H * W, C, widen(dyv)), t);
}

// ---- batch normalization --------------------------------------------------------------------------

TEST_CASE("backend batch norm training/inference/backward match the float64 reference") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  auto rank = GENERATE(2, 4);
  Dev d;
  Rng rng(51);
  const int64_t C = 6;
  const Shape s = rank == 4 ? Shape{3, 5, 4, C} : Shape{37, C};
  const int64_t M = s.numel() / C;
  std::vector<float> xv, gv, bv, dyv, rmv, rvv;
  Tensor x = d.rand(rng, t, s, &xv, 1.0, 4.0);  // offset mean: tests the centered computation
  Tensor gamma = d.rand(rng, DType::F32, Shape{C}, &gv, 0.5, 1.5);
  Tensor beta = d.rand(rng, DType::F32, Shape{C}, &bv);
  Tensor rm = d.rand(rng, DType::F32, Shape{C}, &rmv);
  Tensor rv = d.rand(rng, DType::F32, Shape{C}, &rvv, 0.5, 2.0);
  Tensor sm = d.make(DType::F32, Shape{C}), si = d.make(DType::F32, Shape{C});
  Tensor y = d.make(t, s);
  const float momentum = 0.99f, eps = 1e-3f;
  d.be->batch_norm_forward_training(x, gamma, beta, momentum, eps, rm, rv, sm, si, y);
  const ref::BnForward r = ref::batch_norm_forward_training(M, C, widen(xv), widen(gv), widen(bv), eps);
  check_close("bn y", d.get(y), r.y, t, t == DType::F32 ? 1.0 : 2.0);
  check_close("bn saved mean", d.get(sm), r.mean, DType::F32);
  check_close("bn saved invstd", d.get(si), r.invstd, DType::F32);
  Vec want_rm(C), want_rv(C);
  for (size_t c = 0; c < static_cast<size_t>(C); ++c) {
    want_rm[c] = momentum * rmv[c] + (1 - momentum) * r.mean[c];
    // tf-keras 2: unbiased batch variance on 4-D input, biased on 2-D (docs/keras-parity.md).
    want_rv[c] = momentum * rvv[c] + (1 - momentum) * (rank == 4 ? r.var_unbiased : r.var)[c];
  }
  check_close("bn running mean", d.get(rm), want_rm, DType::F32);
  check_close("bn running var", d.get(rv), want_rv, DType::F32);

  Tensor yi = d.make(t, s);
  const std::vector<float> rm_now = d.get(rm), rv_now = d.get(rv);
  d.be->batch_norm_forward_inference(x, gamma, beta, rm, rv, eps, yi);
  check_close("bn inference", d.get(yi),
              ref::batch_norm_forward_inference(M, C, widen(xv), widen(gv), widen(bv), widen(rm_now), widen(rv_now),
                                                eps),
              t, t == DType::F32 ? 1.0 : 2.0);

  Tensor dy = d.rand(rng, t, s, &dyv);
  Tensor dx = d.make(t, s);
  Tensor dg = d.make(DType::F32, Shape{C}), dbt = d.make(DType::F32, Shape{C});
  d.be->batch_norm_backward(x, dy, gamma, sm, si, dx, dg, dbt);
  const ref::BnBackward rb =
      ref::batch_norm_backward(M, C, widen(xv), widen(dyv), widen(gv), widen(d.get(sm)), widen(d.get(si)));
  check_close("bn dgamma", d.get(dg), rb.dgamma, DType::F32, 10.0);
  check_close("bn dbeta", d.get(dbt), rb.dbeta, DType::F32);
  check_close("bn dx", d.get(dx), rb.dx, t, t == DType::F32 ? 10.0 : 2.0);
}

// ---- loss ------------------------------------------------------------------------------------------

TEST_CASE("backend softmax cross-entropy: loss sum, correct count, scaled gradient") {
  Dev d;
  Rng rng(61);
  const int64_t N = 33, K = 10;
  std::vector<float> zv;
  Tensor z = d.rand(rng, DType::F32, Shape{N, K}, &zv, -5, 5);
  std::vector<int32_t> lab(static_cast<size_t>(N));
  for (auto& l : lab) l = static_cast<int32_t>(rng.uniform_int(K));
  Tensor labels = d.make(DType::I32, Shape{N});
  d.be->upload(labels, lab.data());
  Tensor loss = d.make(DType::F32, Shape{1}), correct = d.make(DType::F32, Shape{1});
  Tensor dz = d.make(DType::F32, Shape{N, K});
  const float scale = 1024.0f;
  d.be->softmax_cross_entropy(z, labels, scale, loss, correct, dz);
  const ref::SoftmaxCe r = ref::softmax_cross_entropy(N, K, widen(zv), lab, scale);
  check_close("loss sum", d.get(loss), {r.loss_sum}, DType::F32);
  REQUIRE(d.get(correct)[0] == static_cast<float>(r.correct));
  check_close("dlogits", d.get(dz), r.dlogits, DType::F32);
  // dlogits may be omitted (evaluation).
  d.be->fill(loss, kNaN);
  d.be->softmax_cross_entropy(z, labels, 1.0f, loss, correct, Tensor());
  check_close("loss sum without gradient", d.get(loss), {r.loss_sum}, DType::F32);
}

namespace {

/// Sum over rows of -sum_k t_k log softmax(z)_k with t = (1 - e) onehot + e / K, in float64
/// from the log-softmax itself (not the backend's rearranged formula).
double smoothed_loss_sum(int64_t N, int64_t K, const std::vector<double>& z, const std::vector<int32_t>& lab,
                         double e) {
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double* zi = z.data() + n * K;
    double m = zi[0];
    for (int64_t k = 1; k < K; ++k) m = std::max(m, zi[k]);
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += std::exp(zi[k] - m);
    for (int64_t k = 0; k < K; ++k) {
      const double t = (k == lab[static_cast<size_t>(n)] ? 1.0 - e : 0.0) + e / static_cast<double>(K);
      total -= t * (zi[k] - m - std::log(s));
    }
  }
  return total;
}

}  // namespace

TEST_CASE("backend softmax cross-entropy with label smoothing: float64 target, finite differences, e = 0") {
  Dev d;
  Rng rng(62);
  const int64_t N = 17, K = 10;
  std::vector<float> zv;
  Tensor z = d.rand(rng, DType::F32, Shape{N, K}, &zv, -4, 4);
  std::vector<int32_t> lab(static_cast<size_t>(N));
  for (auto& l : lab) l = static_cast<int32_t>(rng.uniform_int(K));
  Tensor labels = d.make(DType::I32, Shape{N});
  d.be->upload(labels, lab.data());
  Tensor loss = d.make(DType::F32, Shape{1}), correct = d.make(DType::F32, Shape{1});
  Tensor dz = d.make(DType::F32, Shape{N, K});
  const std::vector<double> z64 = widen(zv);
  const float scale = 8.0f, e = 0.2f;
  d.be->softmax_cross_entropy(z, labels, scale, loss, correct, dz, e);
  check_close("smoothed loss sum", d.get(loss), {smoothed_loss_sum(N, K, z64, lab, e)}, DType::F32);
  const ref::SoftmaxCe plain = ref::softmax_cross_entropy(N, K, z64, lab, scale);
  REQUIRE(d.get(correct)[0] == static_cast<float>(plain.correct));  // accuracy ignores smoothing
  // The gradient of scale * mean loss, by central differences of the float64 loss.
  const std::vector<float> g = d.get(dz);
  std::vector<double> fd(z64.size());
  for (size_t i = 0; i < z64.size(); ++i) {
    std::vector<double> zp = z64, zm = z64;
    const double h = 1e-5;
    zp[i] += h;
    zm[i] -= h;
    fd[i] = scale * (smoothed_loss_sum(N, K, zp, lab, e) - smoothed_loss_sum(N, K, zm, lab, e)) / (2 * h) /
            static_cast<double>(N);
  }
  check_close("smoothed dlogits against finite differences", g, fd, DType::F32, 10.0);
  // Each row's smoothed gradient sums to zero (the target sums to one).
  for (int64_t n = 0; n < N; ++n) {
    double row = 0;
    for (int64_t k = 0; k < K; ++k) row += g[static_cast<size_t>(n * K + k)];
    REQUIRE(std::fabs(row) < 1e-6);
  }
  // e = 0: the plain op's bits.
  Tensor loss0 = d.make(DType::F32, Shape{1}), dz0 = d.make(DType::F32, Shape{N, K});
  d.be->softmax_cross_entropy(z, labels, scale, loss, correct, dz);
  d.be->softmax_cross_entropy(z, labels, scale, loss0, correct, dz0, 0.0f);
  check_exact("e = 0 loss", d.get(loss0), d.get(loss));
  check_exact("e = 0 dlogits", d.get(dz0), d.get(dz));
  REQUIRE_THROWS_WITH(d.be->softmax_cross_entropy(z, labels, scale, loss, correct, dz, 1.0f),
                      Catch::Contains("label_smoothing 1 must be in [0, 1)"));
  REQUIRE_THROWS_WITH(d.be->softmax_cross_entropy(z, labels, scale, loss, correct, dz, -0.1f),
                      Catch::Contains("must be in [0, 1)"));
}

TEST_CASE("backend softmax cross-entropy is stable for huge logits and rejects bad labels") {
  Dev d;
  Tensor z = d.make(DType::F32, Shape{2, 3});
  d.put(z, {1000.0f, -1000.0f, 999.0f, 88.0f, 89.0f, 90.0f});
  Tensor labels = d.make(DType::I32, Shape{2});
  const int32_t lab[2] = {2, 2};
  d.be->upload(labels, lab);
  Tensor loss = d.make(DType::F32, Shape{1}), correct = d.make(DType::F32, Shape{1});
  Tensor dz = d.make(DType::F32, Shape{2, 3});
  d.be->softmax_cross_entropy(z, labels, 1.0f, loss, correct, dz);
  const double l0 = std::log(1 + std::exp(-1.0) + std::exp(-2000.0)) + 1.0;
  const double l1 = std::log(std::exp(-2.0) + std::exp(-1.0) + 1.0);
  REQUIRE(d.get(loss)[0] == Approx(l0 + l1).epsilon(1e-6));
  REQUIRE(d.get(correct)[0] == 1.0f);
  for (float v : d.get(dz)) REQUIRE(std::isfinite(v));
  const int32_t bad[2] = {0, 3};
  d.be->upload(labels, bad);
  REQUIRE_THROWS_AS(d.be->softmax_cross_entropy(z, labels, 1.0f, loss, correct, dz), DataError);
}

// ---- dropout -------------------------------------------------------------------------------------

TEST_CASE("backend dropout: mask from hash_uniform(seed, offset + i), inverted scaling") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  Dev d;
  Rng rng(71);
  const int64_t n = 9000;
  const float rate = 0.3f;
  const uint64_t seed = 99, offset = 12345;
  std::vector<float> xv, dyv;
  Tensor x = d.rand(rng, t, Shape{n}, &xv);
  Tensor dy = d.rand(rng, t, Shape{n}, &dyv);
  Tensor mask = d.make(DType::U8, Shape{n});
  Tensor y = d.make(t, Shape{n});
  d.be->dropout_forward(x, rate, seed, offset, mask, y);
  std::vector<uint8_t> mk(static_cast<size_t>(n));
  d.be->download(mk.data(), mask);
  const float scale = 1.0f / (1.0f - rate);
  std::vector<float> want(xv.size()), dwant(xv.size());
  int64_t kept = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const bool keep = !(hash_uniform(seed, offset + i) < rate);
    REQUIRE(mk[i] == (keep ? 1 : 0));
    kept += keep;
    want[i] = keep ? round_to(t, xv[i] * scale) : 0.0f;
    dwant[i] = keep ? round_to(t, dyv[i] * scale) : 0.0f;
  }
  REQUIRE(static_cast<double>(kept) / n == Approx(0.7).margin(0.02));
  check_exact("dropout forward", d.get(y), want);
  Tensor dx = d.make(t, Shape{n});
  d.be->dropout_backward(dy, mask, rate, dx);
  check_exact("dropout backward", d.get(dx), dwant);
}

// ---- unscale and check -------------------------------------------------------------------------

TEST_CASE("backend unscale_and_check multiplies every value and finds one inf or NaN at the end") {
  Dev d;
  Rng rng(81);
  const int64_t n = 100003;
  std::vector<float> gv;
  Tensor g = d.rand(rng, DType::F32, Shape{n}, &gv, -1000, 1000);
  const float inv = 1.0f / 1024.0f;
  REQUIRE(d.be->unscale_and_check(g, inv));
  std::vector<float> want(gv.size());
  for (size_t i = 0; i < gv.size(); ++i) want[i] = gv[i] * inv;
  check_exact("unscaled", d.get(g), want);
  for (float bad : {kInf, -kInf, kNaN}) {
    d.put(g, gv);
    Tensor last = g.flat_view(n - 1, Shape{1});
    d.put(last, {bad});
    REQUIRE_FALSE(d.be->unscale_and_check(g, inv));
    const auto got = d.get(g);
    REQUIRE(got[0] == gv[0] * inv);  // still multiplied
    REQUIRE(got[static_cast<size_t>(n) - 2] == gv[static_cast<size_t>(n) - 2] * inv);
  }
}

// ---- optimizer ------------------------------------------------------------------------------------

namespace {
struct Arena {
  Tensor w, g, s1, s2, copy;
};
Arena arena(Dev& d, const std::vector<float>& w, const std::vector<float>& g, const std::vector<float>& s1,
            const std::vector<float>& s2, DType copy_t = DType::F32) {
  const int64_t n = static_cast<int64_t>(w.size());
  Arena a;
  a.w = d.make(DType::F32, Shape{n});
  a.g = d.make(DType::F32, Shape{n});
  a.s1 = d.make(DType::F32, Shape{n});
  a.s2 = d.make(DType::F32, Shape{n});
  d.put(a.w, w);
  d.put(a.g, g);
  d.put(a.s1, s1);
  d.put(a.s2, s2);
  if (copy_t != DType::F32) a.copy = d.make(copy_t, Shape{n});
  return a;
}
void check_values(const char* what, const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << " element " << i);
    REQUIRE(got[i] == Approx(want[i]).epsilon(1e-6).margin(1e-7));
  }
}
const std::vector<float> kW{1.0f, -2.0f, 0.5f}, kG{0.1f, -0.2f, 0.4f}, kM{0.01f, 0.02f, -0.03f};
}  // namespace

TEST_CASE("backend optimizer: SGD, momentum, Nesterov, L2 weight decay (hand-computed)") {
  Dev d;
  OptimizerStep s;
  s.kind = OptimizerStep::Kind::Sgd;
  s.lr = 0.1f;
  SECTION("plain SGD, no state") {
    Arena a = arena(d, kW, kG, kM, kM, DType::F16);
    d.be->optimizer_step(s, a.w, a.g, Tensor(), Tensor(), a.copy);
    check_values("w", d.get(a.w), {0.99, -1.98, 0.46});
    check_exact("compute copy", d.get(a.copy), rounded(d.get(a.w), DType::F16));
  }
  SECTION("momentum 0.9") {
    s.momentum = 0.9f;
    Arena a = arena(d, kW, kG, kM, kM);
    d.be->optimizer_step(s, a.w, a.g, a.s1, Tensor(), Tensor());
    // v = 0.9 m - 0.1 g; w += v
    check_values("v", d.get(a.s1), {-0.001, 0.038, -0.067});
    check_values("w", d.get(a.w), {0.999, -1.962, 0.433});
  }
  SECTION("Nesterov") {
    s.momentum = 0.9f;
    s.nesterov = true;
    Arena a = arena(d, kW, kG, kM, kM, DType::BF16);
    d.be->optimizer_step(s, a.w, a.g, a.s1, Tensor(), a.copy);
    // w += 0.9 v - 0.1 g
    check_values("v", d.get(a.s1), {-0.001, 0.038, -0.067});
    check_values("w", d.get(a.w), {0.9891, -1.9458, 0.3997});
    check_exact("compute copy", d.get(a.copy), rounded(d.get(a.w), DType::BF16));
  }
  SECTION("L2 weight decay") {
    s.weight_decay = 0.01f;
    Arena a = arena(d, kW, kG, kM, kM);
    d.be->optimizer_step(s, a.w, a.g, Tensor(), Tensor(), Tensor());
    check_values("w", d.get(a.w), {0.989, -1.978, 0.4595});  // g += 0.01 w
  }
}

TEST_CASE("backend optimizer: Adam t=1 and t=2, AdamW, Adam with L2 (hand-computed)") {
  Dev d;
  OptimizerStep s;
  s.kind = OptimizerStep::Kind::Adam;
  s.lr = 0.01f;
  const std::vector<float> zero(3, 0.0f);
  // Keras Adam in double, from m = v = 0.
  auto adam = [&](std::vector<double> w, const std::vector<std::vector<double>>& grads, double wd, bool decoupled) {
    std::vector<double> m(3, 0.0), v(3, 0.0);
    for (size_t t = 1; t <= grads.size(); ++t) {
      const double lr_t = 0.01 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
      for (size_t i = 0; i < 3; ++i) {
        double g = grads[t - 1][i];
        if (decoupled)
          w[i] -= 0.01 * wd * w[i];
        else
          g += wd * w[i];
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + 1e-7);
      }
    }
    return w;
  };
  const std::vector<double> w0(kW.begin(), kW.end()), g1(kG.begin(), kG.end()), g2{-0.3, 0.05, 0.2};
  SECTION("t = 1: one step of size ~lr against the gradient sign") {
    Arena a = arena(d, kW, kG, zero, zero, DType::F16);
    d.be->optimizer_step(s, a.w, a.g, a.s1, a.s2, a.copy);
    check_values("m", d.get(a.s1), {0.01, -0.02, 0.04});
    check_values("v", d.get(a.s2), {1e-5, 4e-5, 1.6e-4});
    const auto w = d.get(a.w);
    REQUIRE(w[0] == Approx(0.99).epsilon(1e-4));
    REQUIRE(w[1] == Approx(-1.99).epsilon(1e-4));
    REQUIRE(w[2] == Approx(0.49).epsilon(1e-4));
    check_values("w", w, adam(w0, {g1}, 0, false));
    check_exact("compute copy", d.get(a.copy), rounded(w, DType::F16));
  }
  SECTION("t = 2") {
    Arena a = arena(d, kW, kG, zero, zero);
    d.be->optimizer_step(s, a.w, a.g, a.s1, a.s2, Tensor());
    d.put(a.g, {-0.3f, 0.05f, 0.2f});
    s.t = 2;
    d.be->optimizer_step(s, a.w, a.g, a.s1, a.s2, Tensor());
    check_values("w", d.get(a.w), adam(w0, {g1, g2}, 0, false));
  }
  SECTION("AdamW decoupled decay") {
    s.kind = OptimizerStep::Kind::AdamW;
    s.weight_decay = 0.1f;
    Arena a = arena(d, kW, kG, zero, zero);
    d.be->optimizer_step(s, a.w, a.g, a.s1, a.s2, Tensor());
    check_values("w", d.get(a.w), adam(w0, {g1}, 0.1, true));
  }
  SECTION("Adam with L2 decay") {
    s.weight_decay = 0.1f;
    Arena a = arena(d, kW, kG, zero, zero);
    d.be->optimizer_step(s, a.w, a.g, a.s1, a.s2, Tensor());
    check_values("w", d.get(a.w), adam(w0, {g1}, 0.1, false));
  }
}

TEST_CASE("backend optimizer: Adam's update on a large arena, bit for bit the float32 formula per weight") {
  // The CPU loop is vectorized; each lane must give the scalar formula's bits (IEEE sqrt and
  // division, no fused multiply-add), including NaN and infinite gradients.
  const auto kind = GENERATE(OptimizerStep::Kind::Adam, OptimizerStep::Kind::AdamW, OptimizerStep::Kind::Amsgrad);
  const float wd = GENERATE(0.0f, 0.01f);
  Dev d;
  Rng rng(97);
  const int64_t n = 20011;
  std::vector<float> wv, gv, mv, vv, hv;
  Tensor w = d.rand(rng, DType::F32, Shape{n}, &wv), g = d.rand(rng, DType::F32, Shape{n}, &gv);
  Tensor m = d.rand(rng, DType::F32, Shape{n}, &mv), v = d.rand(rng, DType::F32, Shape{n}, &vv);
  Tensor h = d.rand(rng, DType::F32, Shape{n}, &hv);
  for (float& x : vv) x = std::fabs(x);
  for (float& x : hv) x = std::fabs(x);
  gv[5] = std::numeric_limits<float>::quiet_NaN();
  gv[6] = std::numeric_limits<float>::infinity();
  gv[n - 1] = -std::numeric_limits<float>::infinity();
  d.put(g, gv);
  d.put(v, vv);
  d.put(h, hv);
  OptimizerStep s;
  s.kind = kind;
  s.lr = 0.003f;
  s.weight_decay = wd;
  s.t = 7;
  const bool ams = kind == OptimizerStep::Kind::Amsgrad;
  std::vector<Tensor> states{m, v};
  if (ams) states.push_back(h);
  d.be->optimizer_step(s, w, g, states, Tensor());
  const double b1t = std::pow(static_cast<double>(s.beta1), 7.0), b2t = std::pow(static_cast<double>(s.beta2), 7.0);
  const float lr_t = static_cast<float>(static_cast<double>(s.lr) * std::sqrt(1.0 - b2t) / (1.0 - b1t));
  for (int64_t i = 0; i < n; ++i) {
    float wi = wv[i], gi = gv[i];
    if (wd != 0.0f) {
      if (kind == OptimizerStep::Kind::AdamW)
        wi -= s.lr * wd * wi;
      else
        gi += wd * wi;
    }
    const float mi = s.beta1 * mv[i] + (1.0f - s.beta1) * gi;
    const float vi = s.beta2 * vv[i] + (1.0f - s.beta2) * gi * gi;
    float vd = vi;
    if (ams) vd = hv[i] >= vi ? hv[i] : vi;
    mv[i] = mi, vv[i] = vi, hv[i] = vd;
    wv[i] = wi - lr_t * mi / (std::sqrt(vd) + s.epsilon);
  }
  check_exact("w", d.get(w), wv);
  check_exact("m", d.get(m), mv);
  check_exact("v", d.get(v), vv);
  if (ams) check_exact("v_hat", d.get(h), hv);
}

TEST_CASE("backend optimizer: SGD's update on a large arena, bit for bit the float32 formula per weight") {
  // As Adam's case above: the vectorized loop against the scalar formula, every variant, with
  // NaN and infinite gradients, over an arena of several blocks and a ragged end.
  const float mom = GENERATE(0.0f, 0.9f);
  const bool nesterov = GENERATE(false, true);
  const float wd = GENERATE(0.0f, 5e-4f);
  Dev d;
  Rng rng(98);
  const int64_t n = 20011;
  std::vector<float> wv, gv, mv;
  Tensor w = d.rand(rng, DType::F32, Shape{n}, &wv), g = d.rand(rng, DType::F32, Shape{n}, &gv);
  Tensor m = d.rand(rng, DType::F32, Shape{n}, &mv);
  gv[5] = std::numeric_limits<float>::quiet_NaN();
  gv[6] = std::numeric_limits<float>::infinity();
  gv[n - 1] = -std::numeric_limits<float>::infinity();
  d.put(g, gv);
  OptimizerStep s;
  s.kind = OptimizerStep::Kind::Sgd;
  s.lr = 0.07f;
  s.momentum = mom;
  s.nesterov = nesterov;
  s.weight_decay = wd;
  Tensor copy = d.make(DType::BF16, Shape{n});
  d.be->optimizer_step(s, w, g, std::vector<Tensor>{m}, copy);
  for (int64_t i = 0; i < n; ++i) {
    float gi = gv[i];
    if (wd != 0.0f) gi += s.weight_decay * wv[i];
    if (mom != 0.0f) {
      const float vi = s.momentum * mv[i] - s.lr * gi;
      mv[i] = vi;
      wv[i] += nesterov ? s.momentum * vi - s.lr * gi : vi;
    } else {
      wv[i] -= s.lr * gi;
    }
  }
  check_exact("w", d.get(w), wv);
  check_exact("momentum", d.get(m), mv);
  check_exact("compute copy", d.get(copy), rounded(wv, DType::BF16));
}

TEST_CASE("backend optimizer over a large arena writes every compute-copy element") {
  Dev d;
  Rng rng(91);
  const int64_t n = 50001;
  std::vector<float> wv, gv;
  Tensor w = d.rand(rng, DType::F32, Shape{n}, &wv);
  Tensor g = d.rand(rng, DType::F32, Shape{n}, &gv);
  Tensor m = d.make(DType::F32, Shape{n}), v = d.make(DType::F32, Shape{n});
  d.be->fill(m, 0.0f);
  d.be->fill(v, 0.0f);
  Tensor c = d.make(DType::BF16, Shape{n});
  OptimizerStep s;
  d.be->optimizer_step(s, w, g, m, v, c);
  check_exact("compute copy", d.get(c), rounded(d.get(w), DType::BF16));
}

// ---- stats ---------------------------------------------------------------------------------------

TEST_CASE("backend stats: min/max/mean|x| over finite values, counts") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  Dev d;
  Tensor x = d.make(t, Shape{7});
  d.put(x, {1.0f, -3.0f, 0.0f, kInf, kNaN, 2.0f, -kInf});
  const TensorStats st = d.be->stats(x);
  REQUIRE(st.count == 7);
  REQUIRE(st.n_inf == 2);
  REQUIRE(st.n_nan == 1);
  REQUIRE(st.n_zero == 1);
  REQUIRE(st.min == -3.0);
  REQUIRE(st.max == 2.0);
  REQUIRE(st.mean_abs == Approx(6.0 / 4));
  REQUIRE_FALSE(st.all_finite());
}

// ---- validation ------------------------------------------------------------------------------------

TEST_CASE("backend validation: shape and dtype mismatches throw mpx::Error naming the tensors") {
  Dev d;
  Conv2dParams p;
  p.R = p.S = 3;
  Tensor x = d.make(DType::F32, Shape{2, 8, 8, 3});
  Tensor w = d.make(DType::F32, Shape{4, 3, 3, 5});  // C = 5, x has 3
  Tensor y = d.make(DType::F32, Shape{2, 6, 6, 4});
  REQUIRE_THROWS_WITH(d.be->conv2d_forward(p, x, w, Tensor(), y, Activation::None),
                      Catch::Contains("float32[2, 8, 8, 3]") && Catch::Contains("float32[4, 3, 3, 5]"));
  Tensor w2 = d.make(DType::F32, Shape{4, 3, 3, 3});
  Tensor ybad = d.make(DType::F32, Shape{2, 8, 8, 4});
  REQUIRE_THROWS_WITH(d.be->conv2d_forward(p, x, w2, Tensor(), ybad, Activation::None),
                      Catch::Contains("[2, 6, 6, 4]") && Catch::Contains("float32[2, 8, 8, 4]"));
  Tensor wh = d.make(DType::F16, Shape{4, 3, 3, 3});
  REQUIRE_THROWS_WITH(d.be->conv2d_forward(p, x, wh, Tensor(), y, Activation::None), Catch::Contains("float16"));
  Tensor bias = d.make(DType::F32, Shape{5});
  REQUIRE_THROWS_AS(d.be->conv2d_forward(p, x, w2, bias, y, Activation::None), Error);

  Tensor dx = d.make(DType::F32, Shape{2, 10});
  Tensor dw = d.make(DType::F32, Shape{3, 12});
  Tensor dy = d.make(DType::F32, Shape{2, 3});
  REQUIRE_THROWS_WITH(d.be->dense_forward(dx, dw, Tensor(), dy, Activation::None),
                      Catch::Contains("float32[2, 10]") && Catch::Contains("float32[3, 12]"));
  Tensor a = d.make(DType::F32, Shape{4}), b = d.make(DType::F32, Shape{5});
  REQUIRE_THROWS_WITH(d.be->add(a, a, b), Catch::Contains("float32[5]"));
  REQUIRE_THROWS_AS(d.be->cast(a, b), Error);
  Tensor logits = d.make(DType::F16, Shape{2, 3});
  Tensor labels = d.make(DType::I32, Shape{2});
  Tensor one = d.make(DType::F32, Shape{1});
  REQUIRE_THROWS_WITH(d.be->softmax_cross_entropy(logits, labels, 1.0f, one, one, Tensor()),
                      Catch::Contains("float32") && Catch::Contains("float16[2, 3]"));
  Tensor g = d.make(DType::F32, Shape{4});
  OptimizerStep s;  // Adam needs both moments
  REQUIRE_THROWS_WITH(d.be->optimizer_step(s, a, g, a, Tensor(), Tensor()), Catch::Contains("state2"));
  REQUIRE_THROWS_AS(d.be->optimizer_step(s, a, b, a, a, Tensor()), Error);
  PoolParams pp;
  Tensor py = d.make(DType::F32, Shape{2, 3, 3, 3});
  REQUIRE_THROWS_WITH(d.be->pool_forward(pp, x, py), Catch::Contains("[2, 4, 4, 3]"));
}

TEST_CASE("backend supports() answers for every op and dtype") {
  Dev d;
  REQUIRE(d.be->supports(Op::Conv2d, DType::BF16));
  REQUIRE(d.be->supports(Op::Conv2d, DType::F16));
  REQUIRE(d.be->supports(Op::SoftmaxCrossEntropy, DType::F32));
  REQUIRE_FALSE(d.be->supports(Op::SoftmaxCrossEntropy, DType::F16));
  REQUIRE(d.be->info().name == "cpu");
}

TEST_CASE("backend max pooling, non-overlapping windows (the fast path): uncovered rows/columns, many channels",
          "[backend][cpu]") {
  auto t = GENERATE(DType::F32, DType::BF16);
  auto win = GENERATE(2, 3);
  Dev d;
  Rng rng(43);
  PoolParams p;
  p.R = p.S = p.stride_h = p.stride_w = win;
  const int64_t N = 4, H = 11, W = 10, C = 300;  // > 2^16 elements (parallel), C > one 256-channel chunk
  const int64_t P = p.out_h(H), Q = p.out_w(W);
  std::vector<float> xv, dyv;
  Tensor x = d.rand(rng, t, Shape{N, H, W, C}, &xv);
  xv[static_cast<size_t>(2 * C + 9)] = xv[static_cast<size_t>(9)];            // a tie: the first one gets dy
  d.put(x, xv);
  xv = d.get(x);
  Tensor dy = d.rand(rng, t, Shape{N, P, Q, C}, &dyv);
  Tensor y = d.make(t, Shape{N, P, Q, C});
  d.be->fill(y, std::numeric_limits<float>::quiet_NaN());
  d.be->pool_forward(p, x, y);
  check_close("tiled max forward", d.get(y), ref::pool_forward(p, N, H, W, C, widen(xv)), t);
  Tensor dx = d.make(t, Shape{N, H, W, C});
  d.be->fill(dx, std::numeric_limits<float>::quiet_NaN());  // every element must be written
  d.be->pool_backward(p, x, y, dy, dx);
  check_close("tiled max backward", d.get(dx), ref::pool_backward(p, N, H, W, C, widen(xv), widen(dyv)), t);
}

TEST_CASE("backend max pooling: a NaN wins its window and takes the gradient", "[backend][cpu]") {
  Dev d;
  PoolParams p;  // 2x2 stride 2
  Tensor x = d.make(DType::F32, Shape{1, 2, 2, 1});
  d.put(x, {1.0f, std::numeric_limits<float>::quiet_NaN(), 5.0f, 2.0f});
  Tensor y = d.make(DType::F32, Shape{1, 1, 1, 1});
  d.be->pool_forward(p, x, y);
  REQUIRE(std::isnan(d.get(y)[0]));
  Tensor dy = d.make(DType::F32, Shape{1, 1, 1, 1});
  d.put(dy, {5.0f});
  Tensor dx = d.make(DType::F32, Shape{1, 2, 2, 1});
  d.be->pool_backward(p, x, y, dy, dx);
  check_exact("NaN max", d.get(dx), {0.0f, 5.0f, 0.0f, 0.0f});
}
