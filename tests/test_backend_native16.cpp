// SPDX-License-Identifier: MIT
// The CPU backend's 16-bit math paths (docs/precision.md, "16-bit arithmetic on the CPU"):
// convolutions and dense layers on oneDNN's native bf16/f16 kernels, or widened to float32.
// Whatever path this process takes (MPX_CPU_16BIT, ONEDNN_MAX_CPU_ISA; CTest runs this file
// under several), every result is checked against the float64 reference and against the
// widened result (the float32 op on the same values, rounded once) within a bound derived
// from the summation length and the rounding of the output, and the backend must say which
// path ran.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>

#include "backend/backend.h"
#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/native16.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/reference.h"
#include "support/winograd_bound.h"

using namespace mpx;
using ref::Vec;

namespace {

using support::widen;
using Dev = support::CpuDev;

/// Unit roundoff of a result stored in t.
double unit_roundoff(DType t) {
  switch (t) {
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -24);
  }
}

/// The error bound of a sum of n products of 16-bit values (exact in float32) accumulated in
/// float32 in any order and rounded once to t: |got - ref| <= u*|ref| + (1+u)*gamma_n*S, with
/// gamma_n = n*2^-24 / (1 - n*2^-24) and S the same sum over absolute values (`mag`), plus
/// the float16 subnormal spacing for float16 results.
struct Bound {
  const Vec& ref;
  const Vec& mag;
  int64_t n;
  DType out;
  double at(size_t i) const {
    const double e = std::ldexp(1.0, -24) * static_cast<double>(n);
    const double u = unit_roundoff(out);
    return u * std::fabs(ref[i]) + (1 + u) * e / (1 - e) * mag[i] + (out == DType::F16 ? std::ldexp(1.0, -24) : 1e-30);
  }
};

/// Every element of got within the bound of the reference; and within twice the bound of
/// the widened path's result (both are within the bound of the reference).
void check_bound(const std::string& what, const std::vector<float>& got, const std::vector<float>& widened,
                 const Bound& b) {
  REQUIRE(got.size() == b.ref.size());
  REQUIRE(widened.size() == b.ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = b.at(i);
    if (!(std::fabs(got[i] - b.ref[i]) <= tol))
      FAIL(what << ": element " << i << " is " << got[i] << ", float64 reference " << b.ref[i] << ", bound " << tol);
    if (!(std::fabs(static_cast<double>(got[i]) - widened[i]) <= 2 * tol))
      FAIL(what << ": element " << i << " is " << got[i] << ", widened path " << widened[i] << ", bound " << 2 * tol);
  }
}

Vec absv(const std::vector<float>& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = std::fabs(static_cast<double>(v[i]));
  return r;
}

std::vector<float> rounded(const std::vector<float>& v, DType t) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_to(t, v[i]);
  return r;
}

/// The math text the backend reports for t ("native ..." or "widened to float32 (...)").
std::string math_text(Backend& be, DType t) { return t == DType::BF16 ? be.info().math_bf16 : be.info().math_f16; }

/// Whether bfloat16's path text here names this AMX rule; WARNs and answers false if not (the
/// test case then has nothing to check on this CPU or under these switches).
bool amx_rule_here(Backend& be, const char* rule) {
  const std::string text = math_text(be, DType::BF16);
  if (text.find(rule) != std::string::npos) return true;
  WARN("not run: bfloat16 here is " << text);
  return false;
}

/// The implementation of the last op run on be whose name starts with op ("" if none).
std::string last_impl(Backend& be, const std::string& op) {
  std::string impl;
  for (const KernelChoice& k : be.kernels())
    if (k.op.rfind(op, 0) == 0) impl = k.impl;
  return impl;
}

/// Whether MPX_CONV_WGRAD keeps every weight gradient that does not run Winograd on oneDNN
/// (onednn) or on the GEMM kernel (gemm): then the AMX path gives none of them to mpx.
bool wgrad_switch_set() {
  const char* v = std::getenv("MPX_CONV_WGRAD");
  return v && (std::string(v) == "onednn" || std::string(v) == "gemm");
}

/// Whether the path of this text is native for some passes and shapes only (bfloat16 on
/// AVX512-BF16 without AMX: the choosers' rule, docs/precision.md).
bool per_shape(const std::string& text) { return text.find(" per shape (") != std::string::npos; }

/// After ops of dtype t: the backend reports them, native where its path is native (some
/// ops may be widened where oneDNN has no native kernel), none native where it widens; on a
/// per-shape path, native or widened as the rule says, and the report says which.
void check_reported(Backend& be, DType t) {
  const std::string text = math_text(be, t);
  const bool native = text.rfind("native", 0) == 0;
  INFO("path of " << dtype_name(t) << ": " << text);
  bool found = false;
  for (const Math16Report& r : be.math16()) {
    if (r.dtype != dtype_name(t)) continue;
    found = true;
    CHECK(r.native_ops + r.widened_ops > 0);
    if (per_shape(text)) {
      CHECK(r.path == (r.widened_ops == 0 ? "native" : r.native_ops == 0 ? "widened" : "mixed"));
      if (r.native_ops > 0) CHECK(r.detail.rfind(text, 0) == 0);
      if (r.native_ops == 0) CHECK(r.detail == "widened to float32 (for these shapes; " + text + ")");
      bool named = r.native_ops == 0;  // the kernels list names the native kernels that ran, or
      for (const KernelChoice& k : be.kernels())  // mpx's on the CPU's 16-bit products
        named = named || (k.op.find(dtype_name(t)) != std::string::npos && k.impl.rfind("widened", 0) != 0) ||
                k.impl.find("(vdpbf16ps)") != std::string::npos || k.impl.rfind("mpx:amx", 0) == 0;
      CHECK(named);
      return;
    }
    if (native) {
      CHECK(r.native_ops > 0);
      CHECK(r.detail.rfind(text, 0) == 0);
    } else {
      CHECK(r.native_ops == 0);
      CHECK(r.path == "widened");
      CHECK(r.detail == text);
    }
  }
  CHECK(found);
  if (native) {  // the kernels list names the native kernels (dtype in the op's name)
    bool named = false;
    for (const KernelChoice& k : be.kernels())
      named = named || (k.op.find(dtype_name(t)) != std::string::npos && k.impl.rfind("widened", 0) != 0);
    CHECK(named);
  }
}

struct ConvCase {
  const char* name;
  int64_t N, H, W, C, K;
  int R, S, stride, pad;
  bool bias;
  Activation act;
};

}  // namespace

TEST_CASE("native 16-bit conv2d forward / backward data / backward filter: within the summation bound of the float64 "
          "reference and of the widened path",
          "[backend][cpu][native16]") {
  const DType t = GENERATE(DType::BF16, DType::F16);
  const ConvCase cases[] = {
      {"net layer 3x3 same, C=64 K=32 + bias + relu", 2, 8, 8, 64, 32, 3, 3, 1, 1, true, Activation::Relu},
      {"first layer C=3 + bias", 3, 9, 7, 3, 16, 3, 3, 1, 1, true, Activation::None},
      {"1x1 stride 2, C=32 K=48", 2, 9, 9, 32, 48, 1, 1, 2, 0, false, Activation::None},
      {"odd 3x3, C=5 K=6, gelu (epilogue)", 2, 5, 6, 5, 6, 3, 3, 1, 1, true, Activation(ActKind::Gelu)},
  };
  for (const ConvCase& cc : cases) {
    DYNAMIC_SECTION(cc.name << " " << dtype_name(t)) {
      Dev d;
      Rng rng(31);
      Conv2dParams p;
      p.R = cc.R, p.S = cc.S, p.stride_h = p.stride_w = cc.stride;
      p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = cc.pad;
      const int64_t P = p.out_h(static_cast<int>(cc.H)), Q = p.out_w(static_cast<int>(cc.W));
      const Shape xs{cc.N, cc.H, cc.W, cc.C}, ws{cc.K, cc.R, cc.S, cc.C}, ys{cc.N, P, Q, cc.K};
      std::vector<float> xv, wv, bv, dyv;
      Tensor x = d.rand(rng, t, xs, &xv), w = d.rand(rng, t, ws, &wv), dy = d.rand(rng, t, ys, &dyv);
      Tensor b = cc.bias ? d.rand(rng, t, Shape{cc.K}, &bv) : Tensor();
      // The same values in float32: the widened path is the float32 op on them, rounded once.
      Tensor x32 = d.make(DType::F32, xs), w32 = d.make(DType::F32, ws), dy32 = d.make(DType::F32, ys);
      Tensor b32 = cc.bias ? d.make(DType::F32, Shape{cc.K}) : Tensor();
      d.put(x32, xv), d.put(w32, wv), d.put(dy32, dyv);
      if (cc.bias) d.put(b32, bv);
      const ref::ConvDims rd = ref::conv_dims(p, cc.N, cc.H, cc.W, cc.C, cc.K);
      const Vec bw = widen(bv), babs = absv(bv);

      Tensor y = d.make(t, ys), y32 = d.make(DType::F32, ys);
      d.be->conv2d_forward(p, x, w, b, y, cc.act);
      d.be->conv2d_forward(p, x32, w32, b32, y32, cc.act);
      // gelu is not 1-Lipschitz beyond ~1.13; its reference is taken on the pre-activation bound.
      const Vec fref = ref::conv2d_forward(p, rd, widen(xv), widen(wv), cc.bias ? &bw : nullptr, cc.act);
      Vec fmag = ref::conv2d_forward(p, rd, absv(xv), absv(wv), cc.bias ? &babs : nullptr, Activation::None);
      if (cc.act.kind == ActKind::Gelu)
        for (double& m : fmag) m *= 1.13;
      check_bound("conv2d_forward", d.get(y), rounded(d.get(y32), t), {fref, fmag, cc.R * cc.S * cc.C + 1, t});

      Tensor dx = d.make(t, xs), dx32 = d.make(DType::F32, xs);
      d.be->conv2d_backward_data(p, dy, w, dx);
      d.be->conv2d_backward_data(p, dy32, w32, dx32);
      check_bound("conv2d_backward_data", d.get(dx), rounded(d.get(dx32), t),
                  {ref::conv2d_backward_data(p, rd, widen(dyv), widen(wv)),
                   ref::conv2d_backward_data(p, rd, absv(dyv), absv(wv)), cc.K * cc.R * cc.S, t});

      Vec rdb, mdb;
      const Vec rdw = ref::conv2d_backward_filter(p, rd, widen(xv), widen(dyv), &rdb);
      const Vec mdw = ref::conv2d_backward_filter(p, rd, absv(xv), absv(dyv), &mdb);
      Tensor dw32 = d.make(DType::F32, ws), db32 = d.make(DType::F32, Shape{cc.K});
      d.be->conv2d_backward_filter(p, x32, dy32, dw32, cc.bias ? db32 : Tensor());
      // dw in t (the model's 16-bit weight gradient, rounded once) and in float32.
      for (DType gt : {t, DType::F32}) {
        Tensor dw = d.make(gt, ws), db = d.make(gt, Shape{cc.K});
        d.be->conv2d_backward_filter(p, x, dy, dw, cc.bias ? db : Tensor());
        const std::string g = std::string(" into ") + dtype_name(gt);
        check_bound("conv2d_backward_filter dw" + g, d.get(dw), rounded(d.get(dw32), gt), {rdw, mdw, cc.N * P * Q, gt});
        if (cc.bias)
          check_bound("conv2d_backward_filter db" + g, d.get(db), rounded(d.get(db32), gt), {rdb, mdb, cc.N * P * Q, gt});
      }
      check_reported(*d.be, t);
    }
  }
}

TEST_CASE("native 16-bit dense forward / backward: within the summation bound, a partial chunk of rows included",
          "[backend][cpu][native16]") {
  const DType t = GENERATE(DType::BF16, DType::F16);
  struct Case {
    int64_t N, Ci, Co;
    Activation act;
  };
  for (const Case& c : {Case{200, 100, 48, Activation::Relu}, Case{7, 37, 11, Activation::None},
                        Case{256, 128, 256, Activation(ActKind::LeakyRelu, 0.1f)}}) {
    DYNAMIC_SECTION("N=" << c.N << " Ci=" << c.Ci << " Co=" << c.Co << " " << dtype_name(t)) {
      Dev d;
      Rng rng(41);
      std::vector<float> xv, wv, bv, dyv;
      Tensor x = d.rand(rng, t, Shape{c.N, c.Ci}, &xv), w = d.rand(rng, t, Shape{c.Co, c.Ci}, &wv);
      Tensor b = d.rand(rng, t, Shape{c.Co}, &bv), dy = d.rand(rng, t, Shape{c.N, c.Co}, &dyv);
      Tensor x32 = d.make(DType::F32, x.shape), w32 = d.make(DType::F32, w.shape);
      Tensor b32 = d.make(DType::F32, b.shape), dy32 = d.make(DType::F32, dy.shape);
      d.put(x32, xv), d.put(w32, wv), d.put(b32, bv), d.put(dy32, dyv);
      const Vec bw = widen(bv), babs = absv(bv);

      Tensor y = d.make(t, Shape{c.N, c.Co}), y32 = d.make(DType::F32, Shape{c.N, c.Co});
      d.be->dense_forward(x, w, b, y, c.act);
      d.be->dense_forward(x32, w32, b32, y32, c.act);
      check_bound("dense_forward", d.get(y), rounded(d.get(y32), t),
                  {ref::dense_forward(c.N, c.Ci, c.Co, widen(xv), widen(wv), &bw, c.act),
                   ref::dense_forward(c.N, c.Ci, c.Co, absv(xv), absv(wv), &babs, Activation::None), c.Ci + 1, t});

      Tensor dx = d.make(t, x.shape), dx32 = d.make(DType::F32, x.shape);
      d.be->dense_backward_data(dy, w, dx);
      d.be->dense_backward_data(dy32, w32, dx32);
      check_bound("dense_backward_data", d.get(dx), rounded(d.get(dx32), t),
                  {ref::dense_backward_data(c.N, c.Ci, c.Co, widen(dyv), widen(wv)),
                   ref::dense_backward_data(c.N, c.Ci, c.Co, absv(dyv), absv(wv)), c.Co, t});

      Vec rdb, mdb;
      const Vec rdw = ref::dense_backward_weights(c.N, c.Ci, c.Co, widen(xv), widen(dyv), &rdb);
      const Vec mdw = ref::dense_backward_weights(c.N, c.Ci, c.Co, absv(xv), absv(dyv), &mdb);
      Tensor dw32 = d.make(DType::F32, w.shape), db32 = d.make(DType::F32, b.shape);
      d.be->dense_backward_weights(x32, dy32, dw32, db32);
      for (DType gt : {t, DType::F32}) {
        Tensor dw = d.make(gt, w.shape), db = d.make(gt, b.shape);
        d.be->dense_backward_weights(x, dy, dw, db);
        const std::string g = std::string(" into ") + dtype_name(gt);
        check_bound("dense_backward_weights dw" + g, d.get(dw), rounded(d.get(dw32), gt), {rdw, mdw, c.N, gt});
        check_bound("dense_backward_weights db" + g, d.get(db), rounded(d.get(db32), gt), {rdb, mdb, c.N, gt});
      }
      check_reported(*d.be, t);
    }
  }
}

TEST_CASE("native 16-bit dense: a row's result does not depend on the batch size", "[backend][cpu][native16]") {
  const DType t = GENERATE(DType::BF16, DType::F16);
  Dev d;
  Rng rng(43);
  const int64_t N = 300, Ci = 64, Co = 40;
  Tensor x = d.rand(rng, t, Shape{N, Ci}, nullptr), w = d.rand(rng, t, Shape{Co, Ci}, nullptr);
  Tensor y = d.make(t, Shape{N, Co}), ys = d.make(t, Shape{N, Co});
  d.be->dense_forward(x, w, Tensor(), y, Activation::None);
  for (int64_t r0 = 0; r0 < N; r0 += 70) {  // the model's partial batches are row slices
    const int64_t n = std::min<int64_t>(70, N - r0);
    d.be->dense_forward(x.slice_rows(r0, n), w, Tensor(), ys.slice_rows(r0, n), Activation::None);
  }
  support::check_exact("dense rows in slices of 70 vs one batch of 300", d.get(ys), d.get(y));
}

TEST_CASE("the 16-bit path follows MPX_CPU_16BIT and oneDNN's ISA, and is the same in every backend",
          "[backend][cpu][native16]") {
  const char* mode_env = std::getenv("MPX_CPU_16BIT");
  const char* isa_env = std::getenv("ONEDNN_MAX_CPU_ISA");
  const std::string mode = mode_env ? mode_env : "", isa = isa_env ? isa_env : "";
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line + " ";
      break;
    }
  const bool amx = flags.find(" amx_bf16 ") != std::string::npos;
  const bool avx512_bf16 = flags.find(" avx512_bf16 ") != std::string::npos;
  Dev a, b;
  const DeviceInfo info = a.be->info();
  INFO("bfloat16: " << info.math_bf16 << "; float16: " << info.math_f16);
  CHECK(info.math_bf16 == b.be->info().math_bf16);  // decided once per process, never by timing
  CHECK(info.math_f16 == b.be->info().math_f16);
  if (mode == "widen") {
    CHECK(info.math_bf16 == "widened to float32 (MPX_CPU_16BIT=widen)");
    CHECK(info.math_f16 == "widened to float32 (MPX_CPU_16BIT=widen)");
  } else if (isa == "AVX2" || isa == "avx2" || !avx512_bf16) {
    CHECK(info.math_bf16.rfind("widened to float32 (no native bf16 on this CPU", 0) == 0);
    CHECK(info.math_f16.rfind("widened to float32 (no native f16 on this CPU", 0) == 0);
  } else if (isa.empty() && amx) {
    // mpx's AMX kernel where the build has AMX instructions (a compiler without them leaves it out).
    const std::string own_amx = cpu::own_amx_bf16() ? ", mpx's AMX weight gradient for 3x3 stride-1 layers "
                                                      "(channels and filters multiples of 16)"
                                                    : "";
    const std::string amx_own = "native bf16 (avx512_core_amx); mpx's few-channel forward and weight gradient for "
                                "one input channel, its forward for a first layer with an activation other than "
                                "relu or a kept pre-activation, Winograd weight gradient under 7x7 outputs" +
                                own_amx;
    CHECK(info.math_bf16 == (mode == "native" ? std::string("native bf16 (avx512_core_amx)") : amx_own));
    CHECK(info.native_bf16);
  }
  if (mode.empty() || mode == "auto") {
    // float16 without AMX-FP16 is widened: oneDNN's AVX512-FP16 kernels measured slower.
    if (flags.find(" amx_fp16 ") == std::string::npos) CHECK(info.math_f16.rfind("widened", 0) == 0);
  }
  CHECK_FALSE(info.native_f16);
}

TEST_CASE("bfloat16 per shape (AVX512-BF16 without AMX): the rule's choice for the seed nets' passes",
          "[backend][cpu][native16]") {
  Dev d;
  const std::string text = math_text(*d.be, DType::BF16);
  if (!per_shape(text)) {
    WARN("not run: bfloat16 here is " << text);
    return;
  }
  const bool dots =
      text.find("bfloat16 dot products in its few-channel forward for one input channel") != std::string::npos;
  CHECK(dots == cpu::fwd_small_dots(DType::BF16, true));
  // Per pass and shape, the kernel the rule takes (docs/precision.md): the CIFAR net's
  // Winograd layer (whole tiles, 64 -> 128) and a 16x16 128 -> 128 layer stay widened in all
  // three passes; a one-channel first layer's forward runs mpx's few-channel kernel where it
  // has bfloat16 dot products (the path's text says so); other first layers' forward passes,
  // a strided layer's forward and
  // backward-data, and Winograd layers' forward and backward-data under 8x8 outputs
  // (Winograd's tiles a quarter empty), over outputs that are not whole tiles, or with few
  // channels (C K / (C + K) <= 32) run oneDNN's bf16 kernels, and so do a 1x1 layer's three
  // passes and the weight gradients of 3x3 layers with at most 32 channels and 64 filters;
  // other 3x3 weight gradients and dense backward passes stay widened.
  struct Case {
    const char* name;
    int64_t N, H, W, C, K;
    int R, stride, pad;
    bool fwd, bwd_data, wgrad;  // native?
  };
  const Case cases[] = {{"cifar conv2 (Winograd)", 2, 32, 32, 64, 128, 3, 1, 1, false, false, false},
                        {"cifar conv1 (3 channels)", 2, 32, 32, 3, 64, 3, 1, 1, true, true, false},
                        {"mnist conv (1 channel, valid)", 2, 28, 28, 1, 32, 3, 1, 0, !dots, true, false},
                        {"3x3 stride 2, 16 -> 32", 2, 16, 16, 16, 32, 3, 2, 1, true, true, false},
                        {"fast CIFAR 7x7, 64 -> 64 (Winograd's weight gradient)", 2, 7, 7, 64, 64, 3, 1, 1, true,
                         true, false},
                        {"8x8, 64 -> 64 (few channels)", 2, 8, 8, 64, 64, 3, 1, 1, true, true, false},
                        {"16x16, 128 -> 128 (Winograd)", 2, 16, 16, 128, 128, 3, 1, 1, false, false, false},
                        {"15x15, 64 -> 256 (partial tiles)", 2, 15, 15, 64, 256, 3, 1, 1, true, true, false},
                        {"12x12 valid, 64 -> 256: 10x10 out, 12x12 back (partial forward tiles only)", 2, 12, 12,
                         64, 256, 3, 1, 0, true, false, false},
                        {"31x31, 24 -> 64 (few channels)", 2, 31, 31, 24, 64, 3, 1, 1, true, true, true},
                        {"16x16, 32 -> 32 (few channels)", 2, 16, 16, 32, 32, 3, 1, 1, true, true, true},
                        {"16x16, 32 -> 128: weight gradient widened (more than 64 filters)", 2, 16, 16, 32, 128, 3,
                         1, 1, true, true, false},
                        {"1x1, 64 -> 128", 2, 8, 8, 64, 128, 1, 1, 0, true, true, true}};
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      Dev e;
      Rng rng(47);
      Conv2dParams p;
      p.R = p.S = c.R, p.stride_h = p.stride_w = c.stride;
      p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = c.pad;
      const int64_t P = p.out_h(static_cast<int>(c.H)), Q = p.out_w(static_cast<int>(c.W));
      const Shape xs{c.N, c.H, c.W, c.C}, ws{c.K, c.R, c.R, c.C}, ys{c.N, P, Q, c.K};
      Tensor x = e.rand(rng, DType::BF16, xs, nullptr), w = e.rand(rng, DType::BF16, ws, nullptr);
      std::vector<float> dyv;
      Tensor dy = e.rand(rng, DType::BF16, ys, &dyv);
      Tensor y = e.make(DType::BF16, ys), dx = e.make(DType::BF16, xs), dw = e.make(DType::BF16, ws);
      auto ran_native = [&](const std::string& op) {
        for (const KernelChoice& k : e.be->kernels())
          if (k.op.rfind(op + " bfloat16 for", 0) == 0) return k.impl.rfind("widened", 0) != 0;
        return false;
      };
      e.be->conv2d_forward(p, x, w, Tensor(), y, Activation::Relu);
      CHECK(ran_native("convolution forward") == c.fwd);
      if (dots && c.C == 1) {  // the few-channel kernel, and its name says it multiplies bfloat16 pairs
        bool named = false;
        for (const KernelChoice& k : e.be->kernels())
          named = named || (k.op.rfind("convolution forward for", 0) == 0 &&
                            k.impl.rfind("mpx:few-channels", 0) == 0 &&
                            k.impl.find("bfloat16 dot products (vdpbf16ps)") != std::string::npos);
        CHECK(named);
      }
      e.be->conv2d_backward_data(p, dy, w, dx);
      CHECK(ran_native("convolution backward data") == c.bwd_data);
      e.be->conv2d_backward_filter(p, x, dy, dw, Tensor());
      CHECK(ran_native("convolution backward weights") == c.wgrad);
    }
  }
  SECTION("dense: forward native with more than 16 outputs or a long input, backward passes widened (or, with "
          "at most 16 outputs, mpx's loops on bfloat16 dot products: native math too)") {
    for (const auto& [Ci, Co, fwd] : {std::tuple<int64_t, int64_t, bool>{128, 256, true}, {256, 10, false},
                                      {21632, 10, true}}) {
      Dev e;
      Rng rng(48);
      const int64_t N = 4;
      Tensor x = e.rand(rng, DType::BF16, Shape{N, Ci}, nullptr), w = e.rand(rng, DType::BF16, Shape{Co, Ci}, nullptr);
      Tensor dy = e.rand(rng, DType::BF16, Shape{N, Co}, nullptr);
      Tensor y = e.make(DType::BF16, Shape{N, Co}), dx = e.make(DType::BF16, Shape{N, Ci});
      Tensor dw = e.make(DType::BF16, Shape{Co, Ci});
      e.be->dense_forward(x, w, Tensor(), y, Activation::None);
      e.be->dense_backward_data(dy, w, dx);
      e.be->dense_backward_weights(x, dy, dw, Tensor());
      const Math16Report r = e.be->math16().at(0);
      INFO("dense " << Ci << " -> " << Co);
      const int own = dots && Co <= 16 ? (fwd ? 2 : 3) : 0;  // mpx's loops' passes on dot products
      CHECK(r.native_ops == (fwd ? 1 : 0) + own);
      CHECK(r.widened_ops == (fwd ? 2 : 3) - own);
    }
  }
}

TEST_CASE("bfloat16 with AMX: a one-channel forward and weight gradient, and a few-channel forward with an activation "
          "after it, take mpx's kernels, every other pass oneDNN's",
          "[backend][cpu][native16]") {
  Dev d;
  if (!amx_rule_here(*d.be, "few-channel forward and weight gradient for one input channel")) return;
  // oneDNN runs its avx512_core_bf16 kernel for one input channel, not an AMX one
  // (docs/cpu-performance.md): the forward goes to mpx where its few-channel kernel applies
  // (16, 32 or 64 filters, relu or none), and so does the weight gradient (16, 32 or 64
  // filters, any activation: it is the same pass); 3 channels, 48 filters and the
  // backward-data pass stay native. A forward with an activation that oneDNN does not fuse
  // (GELU) goes to mpx's kernel at 1-4 channels, which applies it to each row in cache.
  struct Case {
    const char* name;
    int64_t C, K;
    Activation act;
    bool own_fwd, own_wgrad;
  };
  const Case cases[] = {{"1 channel, 32 filters, relu", 1, 32, Activation::Relu, true, true},
                        {"1 channel, 64 filters, linear", 1, 64, Activation::None, true, true},
                        {"1 channel, 16 filters, relu", 1, 16, Activation::Relu, true, true},
                        {"3 channels, 64 filters", 3, 64, Activation::Relu, false, false},
                        {"1 channel, 48 filters", 1, 48, Activation::Relu, false, false},
                        {"1 channel, 32 filters, gelu (applied per row in cache)", 1, 32,
                         Activation(ActKind::Gelu), true, true},
                        {"3 channels, 16 filters, gelu (applied per row in cache)", 3, 16,
                         Activation(ActKind::Gelu), true, false}};
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      Dev e;
      Rng rng(53);
      Conv2dParams p;
      p.R = p.S = 3;
      const Shape xs{2, 12, 12, c.C}, ws{c.K, 3, 3, c.C}, ys{2, 10, 10, c.K};
      std::vector<float> xv, wv;
      Tensor x = e.rand(rng, DType::BF16, xs, &xv), w = e.rand(rng, DType::BF16, ws, &wv);
      std::vector<float> dyv;
      Tensor dy = e.rand(rng, DType::BF16, ys, &dyv);
      Tensor y = e.make(DType::BF16, ys), dx = e.make(DType::BF16, xs), dw = e.make(DType::BF16, ws);
      e.be->conv2d_forward(p, x, w, Tensor(), y, c.act);
      // The op reads "convolution forward bfloat16 for ..." on oneDNN's kernel.
      const std::string fwd = last_impl(*e.be, "convolution forward");
      const char* sw = std::getenv("MPX_CONV_FORWARD");  // onednn: never mpx's forward
      const bool own = c.own_fwd && !(sw && std::string(sw) == "onednn");
      INFO("forward ran " << fwd);
      CHECK((fwd.rfind("mpx:few-channels", 0) == 0) == own);
      if (!own) CHECK(fwd.rfind("widened", 0) != 0);
      // Either kernel is within bfloat16's bound of the float64 reference.
      support::check_close("y", e.get(y),
                           ref::conv2d_forward(p, ref::conv_dims(p, 2, 12, 12, c.C, c.K), widen(xv), widen(wv),
                                               nullptr, c.act),
                           DType::BF16);
      e.be->conv2d_backward_data(p, dy, w, dx);
      Tensor db = e.make(DType::BF16, Shape{c.K});
      e.be->conv2d_backward_filter(p, x, dy, dw, db);
      const std::string wgrad = last_impl(*e.be, "convolution backward weights");
      const bool own_w = c.own_wgrad && !wgrad_switch_set();
      INFO("weight gradient ran " << wgrad);
      CHECK((wgrad.rfind("mpx:few-channels", 0) == 0) == own_w);
      if (own_w) CHECK(wgrad.find("vdpbf16ps") != std::string::npos);
      if (!own_w) CHECK(wgrad.rfind("widened", 0) != 0);
      // Either kernel is within the bound of the float64 reference (dw and db rounded once to
      // bfloat16), and of the float32 op on the same values.
      const ref::ConvDims rd = ref::conv_dims(p, 2, 12, 12, c.C, c.K);
      Vec rdb, mdb;
      const Vec rdw = ref::conv2d_backward_filter(p, rd, widen(xv), widen(dyv), &rdb);
      const Vec mdw = ref::conv2d_backward_filter(p, rd, absv(xv), absv(dyv), &mdb);
      Tensor x32 = e.make(DType::F32, xs), dy32 = e.make(DType::F32, ys);
      Tensor dw32 = e.make(DType::F32, ws), db32 = e.make(DType::F32, Shape{c.K});
      e.put(x32, xv), e.put(dy32, dyv);
      e.be->conv2d_backward_filter(p, x32, dy32, dw32, db32);
      check_bound("dw", e.get(dw), rounded(e.get(dw32), DType::BF16), {rdw, mdw, 2 * 10 * 10, DType::BF16});
      check_bound("db", e.get(db), rounded(e.get(db32), DType::BF16), {rdb, mdb, 2 * 10 * 10, DType::BF16});
      // mpx's few-channel kernels multiply on bfloat16 dot products here (AMX Xeons have
      // AVX512-BF16): native 16-bit math as much as oneDNN's kernels
      const Math16Report r = e.be->math16().at(0);
      CHECK(r.native_ops == 3);
    }
  }
}

TEST_CASE("bfloat16 with AMX: a 3x3 weight gradient takes mpx's AMX kernel (channels and filters multiples of 16), "
          "else mpx's Winograd under 7x7 outputs, else oneDNN's",
          "[backend][cpu][native16]") {
  Dev d0;
  if (!amx_rule_here(*d0.be, "Winograd weight gradient under 7x7 outputs")) return;
  // oneDNN's AMX weight gradient of a 3x3 stride-1 layer lost to mpx's AMX kernel, or tied,
  // where that applies (channels and filters in multiples of 16, at most 4 filters per channel,
  // a grid at most twice the outputs); among the others, it took twice mpx's Winograd under
  // 7x7 outputs (docs/cpu-performance.md). 1x1 filters stay on oneDNN.
  enum Want { Amx, Winograd, OneDnn };
  struct Case {
    const char* name;
    int64_t H, C, K, R;
    Want want;
  };
  const Case cases[] = {{"3x3 outputs, 32 -> 32", 3, 32, 32, 3, Amx},
                        {"6x6 outputs, 16 -> 48", 6, 16, 48, 3, Amx},
                        {"7x7 outputs, 16 -> 16", 7, 16, 16, 3, Amx},
                        {"9x9 outputs, 16 -> 64", 9, 16, 64, 3, Amx},
                        {"7x7 outputs, 16 -> 80: more than 4 filters per channel", 7, 16, 80, 3, OneDnn},
                        {"2x2 outputs, 32 -> 32: a grid of 2.25x the outputs, under Winograd's 3x3", 2, 32, 32, 3,
                         OneDnn},
                        {"6x6 outputs, 24 -> 48: 24 channels", 6, 24, 48, 3, Winograd},
                        {"7x7 outputs, 24 -> 24", 7, 24, 24, 3, OneDnn},
                        {"5x5 outputs, 1x1 filters", 5, 16, 16, 1, OneDnn}};
  const char* wino = std::getenv("MPX_CONV_WINOGRAD");  // on or f2: never the AMX kernel; off: never Winograd
  const bool wino_forced = wino && (std::string(wino) == "on" || std::string(wino) == "f2");
  const bool wino_off = wino && std::string(wino) == "off";
  const bool amx_kernel = cpu::own_amx_bf16();
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      Dev e;
      Rng rng(59);
      Conv2dParams p;
      p.R = p.S = static_cast<int>(c.R);
      p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = static_cast<int>(c.R / 2);
      const int64_t N = 3;
      const Shape xs{N, c.H, c.H, c.C}, ws{c.K, c.R, c.R, c.C}, ys{N, c.H, c.H, c.K};
      std::vector<float> xv, dyv;
      Tensor x = e.rand(rng, DType::BF16, xs, &xv), dy = e.rand(rng, DType::BF16, ys, &dyv);
      Tensor dw = e.make(DType::BF16, ws), db = e.make(DType::BF16, Shape{c.K});
      e.be->conv2d_backward_filter(p, x, dy, dw, db);
      const std::string wgrad = last_impl(*e.be, "convolution backward weights");
      Want want = c.want;
      if (wino_forced && c.R == 3 && c.H < 7) want = Winograd;  // forced Winograd skips its shape rule
      if (want == Amx && (wino_forced || !amx_kernel)) want = c.H < 7 ? Winograd : OneDnn;
      if (want == Winograd && wino_off) want = OneDnn;
      if (wgrad_switch_set()) want = OneDnn;
      INFO("weight gradient ran " << wgrad);
      CHECK((wgrad.rfind("mpx:amx", 0) == 0) == (want == Amx));
      CHECK((wgrad.rfind("winograd:", 0) == 0) == (want == Winograd));
      if (want == Winograd) CHECK(wgrad.find("bfloat16 in the transforms") != std::string::npos);
      if (want == OneDnn) CHECK(wgrad.rfind("widened", 0) != 0);
      const ref::ConvDims rd = ref::conv_dims(p, N, c.H, c.H, c.C, c.K);
      Vec rdb, mdb;
      const Vec rdw = ref::conv2d_backward_filter(p, rd, widen(xv), widen(dyv), &rdb);
      const Vec mdw = ref::conv2d_backward_filter(p, rd, absv(xv), absv(dyv), &mdb);
      Tensor x32 = e.make(DType::F32, xs), dy32 = e.make(DType::F32, ys);
      Tensor dw32 = e.make(DType::F32, ws), db32 = e.make(DType::F32, Shape{c.K});
      e.put(x32, xv), e.put(dy32, dyv);
      e.be->conv2d_backward_filter(p, x32, dy32, dw32, db32);
      const int64_t n = N * c.H * c.H;
      if (want == Winograd) {
        // Winograd's bound (support/winograd_bound.h): float32 sums over the tiles through the
        // transforms, |error| <= gamma_(tiles+20) Y_abs, then one rounding to bfloat16.
        const int64_t tiles = N * ((c.H + 3) / 4) * ((c.H + 3) / 4);
        const Vec yabs = support::winograd::abs_winograd_wgrad(4, N, c.H, c.H, c.C, c.H, c.H, c.K, 1, 1, widen(xv),
                                                               widen(dyv));
        const double g = std::ldexp(1.0, -24) * static_cast<double>(tiles + 20), u = std::ldexp(1.0, -8);
        const std::vector<float> got = e.get(dw);
        for (size_t i = 0; i < got.size(); ++i) {
          const double tol = u * std::fabs(rdw[i]) + (1 + u) * g / (1 - g) * yabs[i];
          if (!(std::fabs(got[i] - rdw[i]) <= tol))
            FAIL("dw: element " << i << " is " << got[i] << ", float64 reference " << rdw[i] << ", bound " << tol);
        }
        check_bound("db", e.get(db), rounded(e.get(db32), DType::BF16), {rdb, mdb, n, DType::BF16});
      } else {
        // The AMX kernel sums over its grid (zeros included): at most (H + 1)^2 pixels per image.
        const int64_t terms = want == Amx ? N * (c.H + 1) * (c.H + 1) + 32 : n;
        check_bound("dw", e.get(dw), rounded(e.get(dw32), DType::BF16), {rdw, mdw, terms, DType::BF16});
        check_bound("db", e.get(db), rounded(e.get(db32), DType::BF16), {rdb, mdb, terms, DType::BF16});
      }
    }
  }
}
