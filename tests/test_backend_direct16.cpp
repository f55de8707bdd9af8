// SPDX-License-Identifier: MIT
// 16-bit activations read and written by the CPU kernels themselves where the CPU has no
// native 16-bit math (docs/cpu-performance.md, "16-bit without native math"): Winograd's
// transforms, the tiled max pooling and global average pooling. The convolutions and max
// pooling must give the bits of the widened path (the float32 op on the same values,
// rounded once); global average pooling is checked against float64 and across thread counts.
// CTest runs this file on the default path, with the 16-bit math widened
// (MPX_CPU_16BIT=widen), with oneDNN capped at AVX2 and with the baseline build.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/pool/pool_tiled.h"
#include "core/half.h"
#include "support/backend_check.h"
#include "support/reference.h"

using namespace mpx;

namespace {

using Dev = support::CpuDev;

std::vector<float> rounded(const std::vector<float>& v, DType t) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to(t, v[i]);
  return r;
}

/// Whether a kernel of `op` ran with 16-bit t converted inside Winograd's transforms.
bool direct_ran(Backend& be, const std::string& op, DType t) {
  const std::string tag = std::string(dtype_name(t)) + " in the transforms";
  for (const KernelChoice& k : be.kernels())
    if (k.op.rfind(op, 0) == 0 && k.impl.find(tag) != std::string::npos) return true;
  return false;
}

/// Whether this process runs t on oneDNN's native kernels (then the direct path is not taken).
bool native(Backend& be, DType t) {
  return (t == DType::BF16 ? be.info().math_bf16 : be.info().math_f16).rfind("native", 0) == 0;
}

struct ConvCase {
  const char* name;
  int64_t N, H, W, C, K;
  int pt, pl, pb, pr;
  bool bias;
  Activation act;
};

}  // namespace

TEST_CASE("16-bit convolutions in Winograd's transforms: the bits of the widened path", "[backend][cpu][direct16]") {
  const DType t = GENERATE(DType::BF16, DType::F16);
  // Channel counts off the vector width (partial channel blocks), sizes off the tile size
  // (partial tiles), every padding from 0 to 2; sizes of at least 8x8 and 16+ channels,
  // which the shape rule sends to Winograd on every ISA that has it.
  const ConvCase cases[] = {
      {"same, C=20 K=24, bias + relu", 2, 11, 9, 20, 24, 1, 1, 1, 1, true, Activation::Relu},
      {"valid, C=32 K=16, no bias", 2, 12, 10, 32, 16, 0, 0, 0, 0, false, Activation::None},
      {"pad 2/0/1/2, C=16 K=40, bias", 1, 9, 13, 16, 40, 2, 0, 1, 2, true, Activation::None},
  };
  for (const ConvCase& cc : cases) {
    DYNAMIC_SECTION(cc.name << " " << dtype_name(t)) {
      Dev d;
      if (native(*d.be, t)) {  // the _widen and _avx2 runs cover this dtype
        WARN("not run: this process runs " << dtype_name(t) << " on oneDNN's native kernels");
        return;
      }
      Rng rng(71);
      Conv2dParams p;
      p.R = p.S = 3, p.stride_h = p.stride_w = 1;
      p.pad_top = cc.pt, p.pad_left = cc.pl, p.pad_bottom = cc.pb, p.pad_right = cc.pr;
      const int64_t P = p.out_h(static_cast<int>(cc.H)), Q = p.out_w(static_cast<int>(cc.W));
      const Shape xs{cc.N, cc.H, cc.W, cc.C}, ws{cc.K, 3, 3, cc.C}, ys{cc.N, P, Q, cc.K};
      std::vector<float> xv, wv, bv, dyv;
      Tensor x = d.rand(rng, t, xs, &xv), w = d.rand(rng, t, ws, &wv), dy = d.rand(rng, t, ys, &dyv);
      Tensor b = cc.bias ? d.rand(rng, t, Shape{cc.K}, &bv) : Tensor();
      Tensor x32 = d.make(DType::F32, xs), w32 = d.make(DType::F32, ws), dy32 = d.make(DType::F32, ys);
      Tensor b32 = cc.bias ? d.make(DType::F32, Shape{cc.K}) : Tensor();
      d.put(x32, xv), d.put(w32, wv), d.put(dy32, dyv);
      if (cc.bias) d.put(b32, bv);

      Tensor y = d.make(t, ys), y32 = d.make(DType::F32, ys);
      d.be->conv2d_forward(p, x, w, b, y, cc.act);
      CHECK(direct_ran(*d.be, "convolution forward", t));  // before the float32 op notes its kernel
      d.be->conv2d_forward(p, x32, w32, b32, y32, cc.act);
      support::check_exact("conv2d_forward", d.get(y), rounded(d.get(y32), t));

      Tensor dx = d.make(t, xs), dx32 = d.make(DType::F32, xs);
      d.be->conv2d_backward_data(p, dy, w, dx);
      CHECK(direct_ran(*d.be, "convolution backward data", t));
      d.be->conv2d_backward_data(p, dy32, w32, dx32);
      support::check_exact("conv2d_backward_data", d.get(dx), rounded(d.get(dx32), t));

      Tensor dw32 = d.make(DType::F32, ws), db32 = d.make(DType::F32, Shape{cc.K});
      for (DType gt : {t, DType::F32}) {  // the weight gradient rounded to t, and in float32
        Tensor dw = d.make(gt, ws), db = d.make(gt, Shape{cc.K});
        d.be->conv2d_backward_filter(p, x, dy, dw, cc.bias ? db : Tensor());
        if (gt == t) CHECK(direct_ran(*d.be, "convolution backward weights", t));  // noted once per shape
        d.be->conv2d_backward_filter(p, x32, dy32, dw32, cc.bias ? db32 : Tensor());
        const std::string into = std::string(" into ") + dtype_name(gt);
        support::check_exact("conv2d_backward_filter dw" + into, d.get(dw), rounded(d.get(dw32), gt));
        if (cc.bias) support::check_exact("conv2d_backward_filter db" + into, d.get(db), rounded(d.get(db32), gt));
      }
    }
  }
}

TEST_CASE("16-bit Winograd: values near the 16-bit range's ends round as the widened path does",
          "[backend][cpu][direct16]") {
  const DType t = GENERATE(DType::BF16, DType::F16);
  Dev d;
  if (native(*d.be, t)) {
    WARN("not run: this process runs " << dtype_name(t) << " on oneDNN's native kernels");
    return;
  }
  Rng rng(73);
  Conv2dParams p;
  p.R = p.S = 3, p.stride_h = p.stride_w = 1, p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = 1;
  const Shape xs{1, 8, 8, 16}, ws{16, 3, 3, 16};
  // Large inputs (float16 overflows to inf), tiny ones (subnormal outputs), a NaN and an inf.
  const double scale = t == DType::F16 ? 4000.0 : 1e36;
  std::vector<float> xv, wv;
  d.rand(rng, t, xs, &xv, -scale, scale);
  d.rand(rng, t, ws, &wv);
  const double tiny = t == DType::F16 ? 1e-10 : 1e-75;  // subnormal products in float32 or float16
  for (size_t i = 0; i < xv.size(); i += 37) xv[i] = round_to(t, static_cast<float>(xv[i] * tiny));
  xv[5 * 16 + 3] = support::kNaN;
  xv[40 * 16 + 7] = support::kInf;
  Tensor x = d.make(t, xs), w = d.make(t, ws), x32 = d.make(DType::F32, xs), w32 = d.make(DType::F32, ws);
  d.put(x, xv), d.put(w, wv), d.put(x32, xv), d.put(w32, wv);
  Tensor y = d.make(t, xs), y32 = d.make(DType::F32, xs);
  d.be->conv2d_forward(p, x, w, Tensor(), y, Activation::Relu);
  CHECK(direct_ran(*d.be, "convolution forward", t));
  d.be->conv2d_forward(p, x32, w32, Tensor(), y32, Activation::Relu);
  support::check_exact("conv2d_forward", d.get(y), rounded(d.get(y32), t));
}

TEST_CASE("16-bit max pooling on the 16-bit values: the bits of the float32 kernel, ties, zeros and NaN included",
          "[backend][cpu][direct16]") {
  const DType t = GENERATE(DType::BF16, DType::F16);
  const bool relu = GENERATE(false, true);
  const int64_t C = GENERATE(19, 32);  // the runtime loops, and a shape the kernels specialise
  INFO(dtype_name(t) << ", " << C << " channels" << (relu ? ", relu" : ""));
  Dev d;
  Rng rng(79);
  PoolParams p;
  p.kind = PoolKind::Max, p.R = p.S = 2, p.stride_h = p.stride_w = 2;
  const Shape xs{3, 9, 7, C}, ys{3, 4, 3, C};  // an uncovered last row and column
  // Few distinct values: many ties, +0 against -0, negatives only, NaN and infinities.
  const float pool[] = {-1.5f, -0.0f, 0.0f, 0.5f, 0.5f, 2.0f, -2.0f, support::kInf, -support::kInf, support::kNaN};
  std::vector<float> xv(static_cast<size_t>(xs.numel())), dyv;
  for (float& v : xv) v = pool[static_cast<size_t>(rng.uniform() * 9.999)];
  Tensor x = d.make(t, xs), x32 = d.make(DType::F32, xs);
  d.put(x, xv), d.put(x32, xv);
  Tensor dy = d.rand(rng, t, ys, &dyv), dy32 = d.make(DType::F32, ys);
  d.put(dy32, dyv);

  Tensor y = d.make(t, ys), y32 = d.make(DType::F32, ys);
  d.be->pool_forward(p, x, y);
  d.be->pool_forward(p, x32, y32);
  // Bit for bit, so where -0 and +0 tie the sign shows that the first in the window was kept.
  support::check_exact("pool_forward", d.get(y), rounded(d.get(y32), t));

  Tensor dx = d.make(t, xs), dx32 = d.make(DType::F32, xs);
  if (relu) {
    d.be->max_pool_relu_backward(p, x, y, dy, dx);
    d.be->max_pool_relu_backward(p, x32, y32, dy32, dx32);
  } else {
    d.be->pool_backward(p, x, y, dy, dx);
    d.be->pool_backward(p, x32, y32, dy32, dx32);
  }
  support::check_exact(relu ? "max_pool_relu_backward" : "pool_backward", d.get(dx), rounded(d.get(dx32), t));

  // The same bits from the forward's window positions (ties, -0 against +0 and NaN decide
  // which position is kept).
  REQUIRE(d.be->max_pool_keeps_argmax(p, xs));
  Tensor am = d.make(DType::U8, ys), ya = d.make(t, ys), dxa = d.make(t, xs);
  d.be->pool_forward(p, x, ya, am);
  support::check_exact("pool_forward with argmax", d.get(ya), d.get(y));
  if (relu)
    d.be->max_pool_relu_backward(p, x, y, dy, dxa, am);
  else
    d.be->pool_backward(p, x, y, dy, dxa, am);
  support::check_exact("backward from argmax", d.get(dxa), d.get(dx));
}

TEST_CASE("16-bit global average pooling: within float32 summation of the float64 mean, the same at 1 and 2 threads",
          "[backend][cpu][direct16]") {
  const DType t = GENERATE(DType::BF16, DType::F16);
  Dev d;
  Rng rng(83);
  const int64_t N = 5, H = 13, W = 11, C = 21, HW = H * W;  // HW not a multiple of the row block
  std::vector<float> xv;
  Tensor x = d.rand(rng, t, Shape{N, H, W, C}, &xv, -1, 3);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> got;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Tensor y = d.make(t, Shape{N, C});
    d.be->global_avg_pool_forward(x, y);
    got.push_back(d.get(y));
  }
  omp_set_num_threads(saved);
  support::check_exact("1 thread against 2", got[1], got[0]);
  const double u32 = std::ldexp(1.0, -24), u = t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0, mag = 0;
      for (int64_t i = 0; i < HW; ++i) {
        sum += xv[static_cast<size_t>((n * HW + i) * C + c)];
        mag += std::fabs(xv[static_cast<size_t>((n * HW + i) * C + c)]);
      }
      const double ref = sum / static_cast<double>(HW);
      // float32 sums of HW terms, a product by 1/HW (itself rounded), one rounding to t.
      const double tol = u * std::fabs(ref) + (1 + u) * (HW + 2) * u32 * mag / static_cast<double>(HW);
      const double v = got[0][static_cast<size_t>(n * C + c)];
      INFO("image " << n << ", channel " << c);
      REQUIRE(std::fabs(v - ref) <= tol);
    }
}

TEST_CASE("bfloat16 global average pooling: the documented float32 order, bit for bit, in every vector build",
          "[backend][cpu][direct16]") {
  // Blocks of kGapRows rows (pool_tiled.h), each block's rows added in order to its first
  // row, the blocks' sums added in order to 0, then one product by 1/HW. The kernel's float32
  // output is compared, so that a different order shows: the values span 2^-12..2^12, whose
  // float32 sums round. C = 300: more than one chunk of 256 channels; HW = 143: a partial
  // block.
  const int64_t N = 3, H = 13, W = 11, C = 300, HW = H * W;
  Rng rng(89);
  std::vector<uint16_t> xb(static_cast<size_t>(N * HW * C));
  std::vector<float> xv(xb.size());
  for (size_t i = 0; i < xb.size(); ++i) {
    const float v = std::ldexp(static_cast<float>(rng.uniform(-1, 1)), static_cast<int>(rng.uniform(-12, 12)));
    xb[i] = f32_to_bf16(v);
    xv[i] = bf16_to_f32(xb[i]);
  }
  std::vector<float> want(static_cast<size_t>(N * C));
  const float inv = 1.0f / static_cast<float>(HW);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int64_t i0 = 0; i0 < HW; i0 += cpu::kGapRows) {
        float part = xv[static_cast<size_t>((n * HW + i0) * C + c)];
        for (int64_t r = 1; r < cpu::kGapRows && i0 + r < HW; ++r)
          part += xv[static_cast<size_t>((n * HW + i0 + r) * C + c)];
        acc += part;
      }
      want[static_cast<size_t>(n * C + c)] = acc * inv;
    }
  // The widest build, then capped at AVX2, then the baseline build (the switches are read at
  // each call), at 1 and 2 threads.
  const std::pair<const char*, const char*> builds[] = {{"", ""}, {"MPX_CPU_POOL_ISA", "avx2"}, {"MPX_CPU_BASELINE", "1"}};
  const int saved = omp_get_max_threads();
  for (const auto& [name, value] : builds)
    for (int threads : {1, 2}) {
      if (*name) ::setenv(name, value, 1);
      omp_set_num_threads(threads);
      std::vector<float> got(want.size(), -1.0f);
      cpu::gap_forward_bf16_dispatch(N, HW, C, xb.data(), got.data());
      omp_set_num_threads(saved);
      if (*name) ::unsetenv(name);
      INFO("switch " << (*name ? name : "(none)") << ", " << threads << " threads");
      support::check_exact("gap_forward_bf16", got, want);
    }
  // Through the op: the same sums rounded once to bfloat16.
  Dev d;
  Tensor x = d.make(DType::BF16, Shape{N, H, W, C}), y = d.make(DType::BF16, Shape{N, C});
  d.put(x, xv);
  d.be->global_avg_pool_forward(x, y);
  support::check_exact("global_avg_pool_forward", d.get(y), rounded(want, DType::BF16));
}
