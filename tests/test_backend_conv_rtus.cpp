// SPDX-License-Identifier: MIT
// Strided 1x1 convolutions with few input channels on the CPU backend (a residual
// block's projection shortcut), against the float64 reference. oneDNN 2.6.3's AVX2
// jit_1x1 backward weights with an NHWC source and C < 8 gets dW wrong with 2+ threads
// and can hang in its reducer barrier (lib/backend/cpu/conv/conv.cpp,
// rtus_nhwc_bwd_weights_bug); the backend routes these shapes through blocked layouts.
// Run with 2+ OpenMP threads to exercise the bug (the default on the 2-core machines).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;

namespace {

struct Dev {
  std::unique_ptr<Backend> be = create_backend("cpu");
  std::vector<Buffer> bufs;

  Tensor make(DType t, Shape s) {
    bufs.push_back(be->alloc(static_cast<size_t>(s.numel()) * dtype_size(t), "test"));
    Tensor x = bufs.back().view(t, s);
    be->fill(x, std::numeric_limits<float>::quiet_NaN());
    return x;
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<char> bytes(t.bytes());
    be->download(bytes.data(), t);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    convert(bytes.data(), t.dtype, v.data(), DType::F32, v.size());
    return v;
  }
  Tensor rand(Rng& rng, Shape s, std::vector<float>* vals) {
    Tensor x = make(DType::F32, s);
    std::vector<float> v(static_cast<size_t>(s.numel()));
    for (auto& e : v) e = static_cast<float>(rng.uniform(-1, 1));
    be->upload(x, v.data());
    *vals = v;
    return x;
  }
};

/// Every element within 1e-4 relative (+1e-5 of the largest), as float32 sums of ~5000 products.
void check_close(const std::string& what, const std::vector<float>& got, const Vec& want) {
  REQUIRE(got.size() == want.size());
  double maxref = 0;
  for (double r : want) maxref = std::max(maxref, std::fabs(r));
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!std::isfinite(got[i]) || err > 1e-4 * std::fabs(want[i]) + 1e-5 * maxref)
      FAIL(what << ": element " << i << " of " << got.size() << " is " << got[i] << ", reference " << want[i]);
  }
}

}  // namespace

TEST_CASE("backend conv2d 1x1 strided, few input channels: backward filter matches the reference",
          "[backend][cpu][conv]") {
  auto C = GENERATE(1, 3, 4, 5, 12);
  auto K = GENERATE(8, 16);
  auto stride = GENERATE(std::make_pair(2, 2), std::make_pair(2, 1), std::make_pair(3, 3));
  auto bias = GENERATE(false, true);
  INFO("C " << C << " K " << K << " stride " << stride.first << "x" << stride.second << " bias " << bias);
  Dev d;
  Rng rng(31);
  Conv2dParams p;
  p.R = p.S = 1;
  p.stride_h = stride.first;
  p.stride_w = stride.second;
  const int64_t N = 32, H = 26, W = 26;
  const int64_t P = p.out_h(static_cast<int>(H)), Q = p.out_w(static_cast<int>(W));
  std::vector<float> xv, wv, dyv;
  Tensor x = d.rand(rng, Shape{N, H, W, C}, &xv);
  Tensor w = d.rand(rng, Shape{K, 1, 1, C}, &wv);
  Tensor dy = d.rand(rng, Shape{N, P, Q, K}, &dyv);
  const ref::ConvDims rd = ref::conv_dims(p, N, H, W, C, K);
  Vec rdb;
  const Vec rdw = ref::conv2d_backward_filter(p, rd, Vec(xv.begin(), xv.end()), Vec(dyv.begin(), dyv.end()), &rdb);
  Tensor dw = d.make(DType::F32, Shape{K, 1, 1, C}), db = d.make(DType::F32, Shape{K});
  for (int rep = 0; rep < 3; ++rep) {  // the cached plan, several times (the hang was at any execution)
    d.be->conv2d_backward_filter(p, x, dy, dw, bias ? db : Tensor());
    check_close("dw", d.get(dw), rdw);
    if (bias) check_close("db", d.get(db), rdb);
  }
  // Forward and backward data of the same shape (oneDNN's other strided 1x1 paths).
  Tensor y = d.make(DType::F32, Shape{N, P, Q, K}), dx = d.make(DType::F32, Shape{N, H, W, C});
  d.be->conv2d_forward(p, x, w, Tensor(), y, Activation::None);
  check_close("y", d.get(y),
              ref::conv2d_forward(p, rd, Vec(xv.begin(), xv.end()), Vec(wv.begin(), wv.end()), nullptr,
                                  Activation::None));
  d.be->conv2d_backward_data(p, dy, w, dx);
  check_close("dx", d.get(dx),
              ref::conv2d_backward_data(p, rd, Vec(dyv.begin(), dyv.end()), Vec(wv.begin(), wv.end())));
}
