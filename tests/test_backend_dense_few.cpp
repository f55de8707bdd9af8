// SPDX-License-Identifier: MIT
// mpx's dense loops for few outputs on 16-bit operands (lib/backend/cpu/dense/dense_few.cpp,
// docs/cpu-performance.md "Dense layers with few outputs") against the float64 reference,
// within the bound of their float32 sums (and one rounding of a 16-bit dx): 1 to 16 outputs
// (partial register blocks), input lengths that leave vector tails, odd batches, 1 to 3
// threads. In 16 bits each pass equals the float32 loops on the widened values (dx rounded
// once), bit for bit; rows do not depend on the batch they are in. On bfloat16 dot products
// (bfloat16 w and dy, AVX512-BF16) each pass equals the FMA loops, bit for bit. Through the
// backend: the kernel it names, only for 16-bit operands.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <omp.h>

#include "backend/cpu/dense/dense_few.h"
#include "backend/cpu/native16.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/conv_case.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;

namespace {

struct Shape3 {
  int64_t N, Ci, Co;
};

const void* data_of(const std::vector<float>& f, const std::vector<uint16_t>& h, DType t) {
  return t == DType::F32 ? static_cast<const void*>(f.data()) : static_cast<const void*>(h.data());
}

std::vector<float> forward(const Shape3& s, const std::vector<float>& x, DType t, const std::vector<float>& w,
                           const std::vector<float>& b, int threads) {
  const support::OmpThreads th(threads);
  const std::vector<uint16_t> x16 = t == DType::F32 ? std::vector<uint16_t>() : support::to16(x, t);
  std::vector<float> y(static_cast<size_t>(s.N * s.Co), std::numeric_limits<float>::quiet_NaN());
  cpu::dense_few_forward(s.N, s.Ci, s.Co, data_of(x, x16, t), t, w.data(), b.data(), y.data());
  return y;
}

/// dx as float32 values (of dtype t).
std::vector<float> backward_data(const Shape3& s, const std::vector<float>& dy, const std::vector<float>& w, DType t,
                                 int threads) {
  const support::OmpThreads th(threads);
  const size_t n = static_cast<size_t>(s.N * s.Ci);
  std::vector<float> dx(n, std::numeric_limits<float>::quiet_NaN());
  if (t == DType::F32) {
    cpu::dense_few_backward_data(s.N, s.Ci, s.Co, dy.data(), w.data(), dx.data(), t);
  } else {
    std::vector<uint16_t> dx16(n, 0xFFFF);  // a NaN in both formats
    cpu::dense_few_backward_data(s.N, s.Ci, s.Co, dy.data(), w.data(), dx16.data(), t);
    convert(dx16.data(), t, dx.data(), DType::F32, n);
  }
  return dx;
}

std::pair<std::vector<float>, std::vector<float>> backward_weights(const Shape3& s, const std::vector<float>& x,
                                                                   DType t, const std::vector<float>& dy, int threads) {
  const support::OmpThreads th(threads);
  const std::vector<uint16_t> x16 = t == DType::F32 ? std::vector<uint16_t>() : support::to16(x, t);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dw(static_cast<size_t>(s.Co * s.Ci), nan), db(static_cast<size_t>(s.Co), nan);
  cpu::dense_few_backward_weights(s.N, s.Ci, s.Co, data_of(x, x16, t), t, dy.data(), dw.data(), db.data());
  return {dw, db};
}

Vec absv(const std::vector<float>& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = std::fabs(v[i]);
  return r;
}

/// f rounded to t as the loops round dx: where the CPU's VCVTNEPS2BF16 rounds bfloat16
/// (cpu::own_bf16_math()), a float32 subnormal is first a zero of its sign.
float round_as_loops(DType t, float f) {
  if (t == DType::BF16 && cpu::own_bf16_math() && std::fpclassify(f) == FP_SUBNORMAL)
    f = std::copysign(0.0f, f);
  return round_to(t, f);
}

double gamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return static_cast<double>(n) * u / (1 - static_cast<double>(n) * u);
}

void check_within(const char* what, const std::vector<float>& got, const Vec& want, const Vec& mag, double g,
                  double u16, double tiny) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = g * mag[i] * (1 + 2 * u16) + u16 * std::fabs(want[i]) + tiny;
    if (!(std::fabs(got[i] - want[i]) <= tol)) FAIL(what << "[" << i << "] " << got[i] << ", reference " << want[i]);
  }
}

}  // namespace

TEST_CASE("few-output dense loops: within their float32 summation bounds of the float64 reference",
          "[backend][cpu][dense]") {
  const Shape3 shapes[] = {{5, 37, 10}, {4, 64, 16}, {3, 5, 1}, {7, 130, 11}, {1, 8, 3}, {6, 300, 6}};
  for (const Shape3& s : shapes)
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      DYNAMIC_SECTION("N " << s.N << ", " << s.Ci << " -> " << s.Co << ", " << dtype_name(t)) {
        Rng rng(static_cast<uint64_t>(s.N * 131 + s.Ci * 7 + s.Co));
        const std::vector<float> x = support::uniform_values(rng, s.N * s.Ci, t);
        const std::vector<float> w = support::uniform_values(rng, s.Co * s.Ci);
        const std::vector<float> b = support::uniform_values(rng, s.Co);
        const std::vector<float> dy = support::uniform_values(rng, s.N * s.Co);
        const Vec bv = support::widen(b), abv = absv(b);
        const Vec ry = ref::dense_forward(s.N, s.Ci, s.Co, support::widen(x), support::widen(w), &bv, Activation::None);
        const Vec my = ref::dense_forward(s.N, s.Ci, s.Co, absv(x), absv(w), &abv, Activation::None);
        const Vec rdx = ref::dense_backward_data(s.N, s.Ci, s.Co, support::widen(dy), support::widen(w));
        const Vec mdx = ref::dense_backward_data(s.N, s.Ci, s.Co, absv(dy), absv(w));
        Vec rdb, mdb;
        const Vec rdw = ref::dense_backward_weights(s.N, s.Ci, s.Co, support::widen(x), support::widen(dy), &rdb);
        const Vec mdw = ref::dense_backward_weights(s.N, s.Ci, s.Co, absv(x), absv(dy), &mdb);
        const double u16 = t == DType::BF16 ? std::ldexp(1.0, -8) : t == DType::F16 ? std::ldexp(1.0, -11) : 0.0;
        const double tiny16 = t == DType::F16 ? std::ldexp(1.0, -25) : 1e-30;
        for (int threads : {1, 2, 3}) {
          INFO(threads << " threads");
          const std::vector<float> y = forward(s, x, t, w, b, threads);
          check_within("y", y, ry, my, gamma(s.Ci + 1), 0.0, 1e-30);
          const std::vector<float> dx = backward_data(s, dy, w, t, threads);
          check_within("dx", dx, rdx, mdx, gamma(s.Co), u16, tiny16);
          const auto [dw, db] = backward_weights(s, x, t, dy, threads);
          check_within("dw", dw, rdw, mdw, gamma(s.N), 0.0, 1e-30);
          check_within("db", db, rdb, mdb, gamma(s.N), 0.0, 1e-30);
          if (t != DType::F32) {  // the float32 loops on the same values; dx rounded once
            support::check_exact("y against float32", y, forward(s, x, DType::F32, w, b, threads));
            std::vector<float> dx32 = backward_data(s, dy, w, DType::F32, threads);
            for (float& v : dx32) v = round_as_loops(t, v);
            support::check_exact("dx against float32 rounded once", dx, dx32);
            const auto [dw32, db32] = backward_weights(s, x, DType::F32, dy, threads);
            support::check_exact("dw against float32", dw, dw32);
          }
          if (threads > 1) {  // no result depends on the thread count
            support::check_exact("y across thread counts", y, forward(s, x, t, w, b, 1));
            support::check_exact("dx across thread counts", dx, backward_data(s, dy, w, t, 1));
            support::check_exact("dw across thread counts", dw, backward_weights(s, x, t, dy, 1).first);
          }
        }
        // A row's forward and backward-data result does not depend on its batch: the last row alone.
        const Shape3 one{1, s.Ci, s.Co};
        const std::vector<float> x1(x.end() - s.Ci, x.end()), dy1(dy.end() - s.Co, dy.end());
        const std::vector<float> y = forward(s, x, t, w, b, 2), dx = backward_data(s, dy, w, t, 2);
        support::check_exact("y of the last row alone", forward(one, x1, t, w, b, 2),
                             std::vector<float>(y.end() - s.Co, y.end()));
        support::check_exact("dx of the last row alone", backward_data(one, dy1, w, t, 2),
                             std::vector<float>(dx.end() - s.Ci, dx.end()));
      }
}

TEST_CASE("both backward passes in one walk: the bits of the two passes, within their bounds of float64",
          "[backend][cpu][dense][fuse]") {
  // dense_few_backward (docs/cpu-performance.md, "Both backward passes in one walk") against
  // dense_few_backward_weights then dense_few_backward_data (relu_out x when relu) bit for bit,
  // in every dtype and build (the register walk of the AVX-512 build, the chunked one of the
  // AVX2 and baseline builds): 1 to 10 outputs, batches across the chunks of rows the walks take
  // (16), inputs across the chunked walk's panels (128 columns) and with vector tails, 1 to 3
  // threads; x a relu's output (zeros of both signs, negatives, NaN) when relu, and then
  // without the odd values against float64.
  const Shape3 shapes[] = {{37, 37, 10}, {5, 300, 1}, {20, 130, 7}, {1, 8, 3}, {17, 70, 10}, {33, 64, 4},
                           {34, 270, 9}};
  for (const Shape3& s : shapes)
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      for (bool relu : {false, true})
        DYNAMIC_SECTION("N " << s.N << ", " << s.Ci << " -> " << s.Co << ", " << dtype_name(t)
                             << (relu ? ", relu" : "")) {
          Rng rng(static_cast<uint64_t>(s.N * 17 + s.Ci * 3 + s.Co + (relu ? 1000 : 0)));
          std::vector<float> x = support::uniform_values(rng, s.N * s.Ci, t);
          if (relu)
            for (size_t i = 0; i < x.size(); ++i) {
              if (x[i] < 0) x[i] = (i % 3 == 0) ? -0.0f : 0.0f;
              if (i % 97 == 5) x[i] = -0.25f;
              if (i % 89 == 7) x[i] = std::numeric_limits<float>::quiet_NaN();
            }
          const std::vector<float> w = support::uniform_values(rng, s.Co * s.Ci);
          const std::vector<float> dy = support::uniform_values(rng, s.N * s.Co);
          const std::vector<uint16_t> x16 = t == DType::F32 ? std::vector<uint16_t>() : support::to16(x, t);
          const void* xp = data_of(x, x16, t);
          const size_t nx = static_cast<size_t>(s.N * s.Ci);
          const float nan = std::numeric_limits<float>::quiet_NaN();
          auto widen_dx = [&](const std::vector<float>& f, const std::vector<uint16_t>& h) {
            if (t == DType::F32) return f;
            std::vector<float> r(nx);
            convert(h.data(), t, r.data(), DType::F32, nx);
            return r;
          };
          for (int threads : {1, 2, 3}) {
            INFO(threads << " threads");
            const support::OmpThreads th(threads);
            std::vector<float> dw(static_cast<size_t>(s.Co * s.Ci), nan), db(static_cast<size_t>(s.Co), nan);
            std::vector<float> dx(t == DType::F32 ? nx : 0, nan);
            std::vector<uint16_t> dx16(t == DType::F32 ? 0 : nx, 0xFFFF);
            void* dxp = t == DType::F32 ? static_cast<void*>(dx.data()) : static_cast<void*>(dx16.data());
            cpu::dense_few_backward(s.N, s.Ci, s.Co, xp, t, dy.data(), w.data(), dw.data(), db.data(), dxp, relu);
            std::vector<float> dw2(dw.size(), nan), db2(db.size(), nan), dx2(dx.size(), nan);
            std::vector<uint16_t> dx216(dx16.size(), 0xFFFF);
            void* dx2p = t == DType::F32 ? static_cast<void*>(dx2.data()) : static_cast<void*>(dx216.data());
            cpu::dense_few_backward_weights(s.N, s.Ci, s.Co, xp, t, dy.data(), dw2.data(), db2.data());
            cpu::dense_few_backward_data(s.N, s.Ci, s.Co, dy.data(), w.data(), dx2p, t, relu ? xp : nullptr);
            support::check_exact("dw against the weight gradient's loops", dw, dw2);
            support::check_exact("db against the weight gradient's loops", db, db2);
            const std::vector<float> got_dx = widen_dx(dx, dx16);
            support::check_exact("dx against the backward-data loops", got_dx, widen_dx(dx2, dx216));
            if (!relu) {  // against float64 (no NaN to carry): the two passes' bounds
              const double u16 = t == DType::BF16 ? std::ldexp(1.0, -8) : t == DType::F16 ? std::ldexp(1.0, -11) : 0.0;
              const double tiny16 = t == DType::F16 ? std::ldexp(1.0, -25) : 1e-30;
              Vec rdb, mdb;
              const Vec rdw = ref::dense_backward_weights(s.N, s.Ci, s.Co, support::widen(x), support::widen(dy), &rdb);
              const Vec mdw = ref::dense_backward_weights(s.N, s.Ci, s.Co, absv(x), absv(dy), &mdb);
              check_within("dw", dw, rdw, mdw, gamma(s.N), 0.0, 1e-30);
              check_within("db", db, rdb, mdb, gamma(s.N), 0.0, 1e-30);
              check_within("dx", got_dx, ref::dense_backward_data(s.N, s.Ci, s.Co, support::widen(dy), support::widen(w)),
                           ref::dense_backward_data(s.N, s.Ci, s.Co, absv(dy), absv(w)), gamma(s.Co), u16, tiny16);
            } else {  // dx is 0 wherever x is not > 0 (NaN included), and x's NaN reaches dw
              for (size_t i = 0; i < nx; ++i)
                if (!(x[i] > 0.0f) && got_dx[i] != 0.0f) FAIL("dx[" << i << "] = " << got_dx[i] << " where x = " << x[i]);
              for (size_t i = 0; i < nx; ++i)
                if (std::isnan(x[i])) {
                  const size_t col = i % static_cast<size_t>(s.Ci);
                  for (int64_t o = 0; o < s.Co; ++o) CHECK(std::isnan(dw[static_cast<size_t>(o * s.Ci) + col]));
                }
            }
          }
        }
}

/// The backend's three passes of a relu dense layer on random x, w, dy of dtype t (b, dw
/// and db float32), each checked against the float64 reference within t's bound; returns the
/// tensors and the values, for the caller's checks.
struct DensePasses {
  std::vector<float> xv, wv, bv, dyv;
  Tensor x, w, b, dy, y, dx, dw, db;
};
DensePasses run_dense_passes(support::CpuDev& d, Rng& rng, DType t, int64_t N, int64_t Ci, int64_t Co) {
  DensePasses r;
  r.x = d.rand(rng, t, Shape{N, Ci}, &r.xv), r.w = d.rand(rng, t, Shape{Co, Ci}, &r.wv);
  r.b = d.rand(rng, DType::F32, Shape{Co}, &r.bv), r.dy = d.rand(rng, t, Shape{N, Co}, &r.dyv);
  r.y = d.make(t, Shape{N, Co}), r.dx = d.make(t, Shape{N, Ci});
  r.dw = d.make(DType::F32, Shape{Co, Ci}), r.db = d.make(DType::F32, Shape{Co});
  d.be->dense_forward(r.x, r.w, r.b, r.y, Activation::Relu);
  d.be->dense_backward_data(r.dy, r.w, r.dx);
  d.be->dense_backward_weights(r.x, r.dy, r.dw, r.db);
  const Vec rb = support::widen(r.bv);
  Vec rdb;
  support::check_close("y", d.get(r.y), ref::dense_forward(N, Ci, Co, support::widen(r.xv), support::widen(r.wv), &rb,
                                                           Activation::Relu), t);
  support::check_close("dx", d.get(r.dx),
                       ref::dense_backward_data(N, Ci, Co, support::widen(r.dyv), support::widen(r.wv)), t);
  support::check_close("dw", d.get(r.dw),
                       ref::dense_backward_weights(N, Ci, Co, support::widen(r.xv), support::widen(r.dyv), &rdb),
                       DType::F32);
  support::check_close("db", d.get(r.db), rdb, DType::F32);
  return r;
}

TEST_CASE("few-output dense loops on bfloat16 dot products: with bfloat16 weights and gradients, the FMA loops' "
          "sums in their order, bit for bit",
          "[backend][cpu][dense]") {
  // vdpbf16ps adds a pair's upper element first, and the pairs hold the earlier column (forward:
  // columns i + l and i + 16 + l), output (backward-data) or row (weight gradient) there; each
  // product is exact, so every sum is the FMA loops' (checked against float64 above). Inputs
  // that leave a last single vector of 16 and a tail, odd outputs and odd batches (a lone last
  // output or row), relu's mask, 1 to 3 threads.
  const bool fwd = cpu::dense_few_dots_forward(DType::BF16, DType::BF16, 32);
  const bool bwd = cpu::dense_few_dots_backward_data(DType::BF16, DType::BF16, DType::BF16);
  const bool wgt = cpu::dense_few_dots_backward_weights(DType::BF16, DType::BF16);
  CHECK(fwd == bwd);
  CHECK(bwd == wgt);
  if (!fwd) WARN("no bfloat16 dot products here (" << cpu::dense_few_isa() << "): both runs take the FMA loops");
  CHECK_FALSE(cpu::dense_few_dots_forward(DType::BF16, DType::BF16, 31));  // no whole pair of vectors
  CHECK_FALSE(cpu::dense_few_dots_forward(DType::BF16, DType::F32, 64));   // float32 weights
  const Shape3 shapes[] = {{5, 37, 10}, {4, 64, 16}, {3, 48, 1}, {7, 130, 11}, {1, 32, 3}, {6, 300, 6}, {9, 5408, 10}};
  for (const Shape3& s : shapes)
    DYNAMIC_SECTION("N " << s.N << ", " << s.Ci << " -> " << s.Co) {
      Rng rng(static_cast<uint64_t>(s.N * 17 + s.Ci * 3 + s.Co));
      const DType t = DType::BF16;
      const std::vector<float> x = support::uniform_values(rng, s.N * s.Ci, t);
      const std::vector<float> w = support::uniform_values(rng, s.Co * s.Ci, t);
      const std::vector<float> b = support::uniform_values(rng, s.Co);
      const std::vector<float> dy = support::uniform_values(rng, s.N * s.Co, t);
      std::vector<float> relu_out = support::uniform_values(rng, s.N * s.Ci, t);
      for (float& v : relu_out) v = std::max(v, 0.0f);  // a relu's output: zeros and positives
      const std::vector<uint16_t> x16 = support::to16(x, t), w16 = support::to16(w, t), dy16 = support::to16(dy, t);
      const std::vector<uint16_t> r16 = support::to16(relu_out, t);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<uint32_t> pairs(static_cast<size_t>(
          std::max(cpu::dense_few_pair_words(s.Co, s.Ci), cpu::dense_few_dy_pair_words(s.N, s.Co))));
      const cpu::DenseFewBf16 b16{w16.data(), dy16.data(), pairs.data()};
      for (int threads : {1, 2, 3}) {
        INFO(threads << " threads");
        const support::OmpThreads th(threads);
        std::vector<float> y(static_cast<size_t>(s.N * s.Co), nan), yd = y;
        cpu::dense_few_forward(s.N, s.Ci, s.Co, x16.data(), t, w.data(), b.data(), y.data());
        cpu::dense_few_forward(s.N, s.Ci, s.Co, x16.data(), t, w.data(), b.data(), yd.data(), b16);
        support::check_exact("y on dot products against the FMA loops", yd, y);
        for (const void* relu : {static_cast<const void*>(nullptr), static_cast<const void*>(r16.data())}) {
          std::vector<uint16_t> dx(static_cast<size_t>(s.N * s.Ci), 0xFFFF), dxd = dx;
          cpu::dense_few_backward_data(s.N, s.Ci, s.Co, dy.data(), w.data(), dx.data(), t, relu);
          cpu::dense_few_backward_data(s.N, s.Ci, s.Co, dy.data(), w.data(), dxd.data(), t, relu, b16);
          INFO((relu ? "with" : "without") << " relu's mask");
          CHECK(dxd == dx);
        }
        std::vector<float> dw(static_cast<size_t>(s.Co * s.Ci), nan), dwd = dw, db(static_cast<size_t>(s.Co), nan),
            dbd = db;
        cpu::dense_few_backward_weights(s.N, s.Ci, s.Co, x16.data(), t, dy.data(), dw.data(), db.data());
        cpu::dense_few_backward_weights(s.N, s.Ci, s.Co, x16.data(), t, dy.data(), dwd.data(), dbd.data(), b16);
        support::check_exact("dw on dot products against the FMA loops", dwd, dw);
        support::check_exact("db", dbd, db);
      }
    }
}

TEST_CASE("the backend's 16-bit dense layer with few outputs runs mpx's loops; short float32 and wide layers stay "
          "on oneDNN",
          "[backend][cpu][dense]") {
  const DType t = GENERATE(DType::F32, DType::BF16, DType::F16);
  const int64_t Co = GENERATE(10, 32);
  INFO(dtype_name(t) << ", " << Co << " outputs");
  support::CpuDev d;
  Rng rng(29);
  const int64_t N = 6, Ci = 200;
  run_dense_passes(d, rng, t, N, Ci, Co);
  int named = 0;
  for (const KernelChoice& k : d.be->kernels())
    if (k.op.rfind("inner product", 0) == 0 && k.impl.rfind("mpx:few-outputs", 0) == 0) ++named;
  const bool native = support::onednn_native16_ran(d.be->kernels());  // the path that runs them here
  const char* mode = std::getenv("MPX_DENSE_FEW");
  const bool off = (mode && std::string(mode) == "onednn") || std::getenv("MPX_CPU_REFERENCE");
  if (t == DType::F32 || Co > cpu::kDenseFewMaxOut || off)
    CHECK(named == 0);
  else if (!native)
    CHECK(named == 3);  // forward, backward data, weight gradient
  int dots = 0;  // the loops that name bfloat16 dot products: all three where the CPU has them
  for (const KernelChoice& k : d.be->kernels())
    if (k.impl.rfind("mpx:few-outputs", 0) == 0 &&
        k.impl.find("bfloat16 dot products (vdpbf16ps)") != std::string::npos)
      ++dots;
  CHECK(dots == (named == 3 && t == DType::BF16 && cpu::dense_few_dots_forward(t, t, Ci) ? 3 : 0));
}

TEST_CASE("a float32 dense layer with few outputs and a long input runs mpx's loops forward and backward-data",
          "[backend][cpu][dense]") {
  // The seed MNIST net's shape class (8192 or more inputs, at most 16 outputs): forward with
  // its activation epilogue and backward-data on mpx's loops, the weight gradient on oneDNN's;
  // all three within float32's bounds of the float64 reference.
  support::CpuDev d;
  Rng rng(31);
  const int64_t N = 5, Ci = 8200, Co = 10;
  const DensePasses r = run_dense_passes(d, rng, DType::F32, N, Ci, Co);
  std::string fwd, bwd_data, bwd_w;
  for (const KernelChoice& k : d.be->kernels()) {
    if (k.op.rfind("inner product forward", 0) == 0) fwd = k.impl;
    if (k.op.rfind("inner product backward data", 0) == 0) bwd_data = k.impl;
    if (k.op.rfind("inner product backward weights", 0) == 0) bwd_w = k.impl;
  }
  const char* mode = std::getenv("MPX_DENSE_FEW");
  const bool off = (mode && std::string(mode) == "onednn") || std::getenv("MPX_CPU_REFERENCE");
  INFO("forward " << fwd << "; backward data " << bwd_data << "; weight gradient " << bwd_w);
  CHECK((fwd.rfind("mpx:few-outputs", 0) == 0) == !off);
  CHECK((bwd_data.rfind("mpx:few-outputs", 0) == 0) == !off);
  CHECK(bwd_w.rfind("mpx:few-outputs", 0) != 0);
  // Each row depends on that row only: the first two rows alone give the same bits.
  Tensor x2 = d.make(DType::F32, Shape{2, Ci}), y2 = d.make(DType::F32, Shape{2, Co});
  Tensor dy2 = d.make(DType::F32, Shape{2, Co}), dx2 = d.make(DType::F32, Shape{2, Ci});
  d.put(x2, std::vector<float>(r.xv.begin(), r.xv.begin() + 2 * Ci));
  d.put(dy2, std::vector<float>(r.dyv.begin(), r.dyv.begin() + 2 * Co));
  d.be->dense_forward(x2, r.w, r.b, y2, Activation::Relu);
  d.be->dense_backward_data(dy2, r.w, dx2);
  if (!off) {
    const std::vector<float> yall = d.get(r.y), dxall = d.get(r.dx);
    support::check_exact("y rows 0-1", d.get(y2), std::vector<float>(yall.begin(), yall.begin() + 2 * Co));
    support::check_exact("dx rows 0-1", d.get(dx2), std::vector<float>(dxall.begin(), dxall.begin() + 2 * Ci));
  }
}

TEST_CASE("a float32 dense layer takes its 16-bit input as it is and returns its input gradient in it",
          "[backend][cpu][dense]") {
  // The input cast folded into the ops: x and dx 16-bit, w, b, y, dy, dw and db float32. The
  // same numbers as the float32 ops on the widened x with dx rounded once afterwards: bit for
  // bit on oneDNN's path (32 outputs), within float32 summation of the float64 reference on
  // mpx's few-output loops (10), which read x as it is.
  const DType t = GENERATE(DType::BF16, DType::F16);
  const int64_t Co = GENERATE(10, 32);
  INFO(dtype_name(t) << ", " << Co << " outputs");
  support::CpuDev d;
  Rng rng(31);
  const int64_t N = 5, Ci = 300;
  std::vector<float> xv, wv, bv, dyv;
  Tensor x = d.rand(rng, t, Shape{N, Ci}, &xv), w = d.rand(rng, DType::F32, Shape{Co, Ci}, &wv);
  Tensor b = d.rand(rng, DType::F32, Shape{Co}, &bv), dy = d.rand(rng, DType::F32, Shape{N, Co}, &dyv);
  Tensor y = d.make(DType::F32, Shape{N, Co}), dx = d.make(t, Shape{N, Ci});
  Tensor dw = d.make(DType::F32, Shape{Co, Ci}), db = d.make(DType::F32, Shape{Co});
  d.be->dense_forward(x, w, b, y, Activation::None);
  d.be->dense_backward_data(dy, w, dx);
  d.be->dense_backward_weights(x, dy, dw, db);
  const Vec rb = support::widen(bv);
  Vec rdb;
  support::check_close("y", d.get(y),
                       ref::dense_forward(N, Ci, Co, support::widen(xv), support::widen(wv), &rb, Activation::None),
                       DType::F32);
  support::check_close("dx", d.get(dx), ref::dense_backward_data(N, Ci, Co, support::widen(dyv), support::widen(wv)),
                       t);
  support::check_close("dw", d.get(dw),
                       ref::dense_backward_weights(N, Ci, Co, support::widen(xv), support::widen(dyv), &rdb),
                       DType::F32);
  support::check_close("db", d.get(db), rdb, DType::F32);
  if (Co > cpu::kDenseFewMaxOut) {  // against the cast written out: widen x, run in float32, round dx
    Tensor x32 = d.make(DType::F32, Shape{N, Ci}), y32 = d.make(DType::F32, Shape{N, Co});
    Tensor dx32 = d.make(DType::F32, Shape{N, Ci}), dx16 = d.make(t, Shape{N, Ci});
    Tensor dw32 = d.make(DType::F32, Shape{Co, Ci}), db32 = d.make(DType::F32, Shape{Co});
    d.be->cast(x, x32);
    d.be->dense_forward(x32, w, b, y32, Activation::None);
    d.be->dense_backward_data(dy, w, dx32);
    d.be->cast(dx32, dx16);
    d.be->dense_backward_weights(x32, dy, dw32, db32);
    support::check_exact("y", d.get(y), d.get(y32));
    support::check_exact("dx", d.get(dx), d.get(dx16));
    support::check_exact("dw", d.get(dw), d.get(dw32));
    support::check_exact("db", d.get(db), d.get(db32));
  }
}

/// A dense layer of the backend tests below: its dtype, x's (dx's, which a float32 layer may
/// take as 16 bits), and its shape.
struct DenseCase {
  DType t, tx;
  int64_t Ci, Co;
};

TEST_CASE("dense_relu_backward_data: the same bits as dense_backward_data then relu's backward, on each kernel",
          "[backend][cpu][dense][fuse]") {
  // The relu's backward done with the product (docs/cpu-performance.md, "Relu before a dense
  // layer"): x, the relu's output, with zeros of both signs, negatives and NaN of both signs
  // (not > 0: 0), infinity and a subnormal (> 0),
  // and a NaN in one row of dy; mpx's few-output loops (a 16-bit layer, a float32 layer with
  // a long input, a float32 layer reading a 16-bit x as it is) and oneDNN's inner product
  // (32 outputs). Against the two ops bit for bit, and the float64 reference masked by x > 0.
  const DenseCase cases[] = {{DType::F32, DType::F32, 8200, 10}, {DType::F32, DType::F32, 300, 32},
                        {DType::BF16, DType::BF16, 300, 10}, {DType::F16, DType::F16, 300, 10},
                        {DType::BF16, DType::BF16, 300, 32}, {DType::F32, DType::BF16, 8200, 10},
                        {DType::F32, DType::F16, 300, 10},   {DType::F32, DType::BF16, 300, 32}};
  for (const DenseCase& cs : cases)
    DYNAMIC_SECTION(dtype_name(cs.t) << " layer, " << dtype_name(cs.tx) << " x, " << cs.Ci << " -> " << cs.Co) {
      support::CpuDev d;
      Rng rng(static_cast<uint64_t>(41 + cs.Ci + cs.Co));
      const int64_t N = 5, Ci = cs.Ci, Co = cs.Co;
      std::vector<float> xv, wv, dyv;
      Tensor x = d.rand(rng, cs.tx, Shape{N, Ci}, &xv);
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (int64_t i = 0; i < N * Ci; ++i) {  // a relu's output: about half zeros, then the odd values
        if (xv[static_cast<size_t>(i)] < 0) xv[static_cast<size_t>(i)] = (i % 3 == 0) ? -0.0f : 0.0f;
        if (i % 97 == 5) xv[static_cast<size_t>(i)] = -0.25f;
        if (i % 89 == 7) xv[static_cast<size_t>(i)] = nan;
        if (i % 83 == 3) xv[static_cast<size_t>(i)] = std::numeric_limits<float>::infinity();  // > 0
        if (i % 79 == 2) xv[static_cast<size_t>(i)] = -nan;
        if (i % 73 == 1) xv[static_cast<size_t>(i)] = round_to(cs.tx, std::ldexp(1.0f, -130));  // > 0 but in float16
      }
      d.put(x, xv);
      Tensor w = d.rand(rng, cs.t, Shape{Co, Ci}, &wv), dy = d.rand(rng, cs.t, Shape{N, Co}, &dyv);
      dyv[1] = nan;  // row 0's dx is NaN where x > 0
      d.put(dy, dyv);
      Tensor fused = d.make(cs.tx, Shape{N, Ci}), two = d.make(cs.tx, Shape{N, Ci});
      d.be->dense_relu_backward_data(dy, w, x, fused);
      d.be->dense_backward_data(dy, w, two);
      d.be->activation_backward(Activation::Relu, x, two, two);
      const std::vector<float> got = d.get(fused);
      support::check_exact("dx against the two ops", got, d.get(two));
      const Vec full = ref::dense_backward_data(N, Ci, Co, support::widen(dyv), support::widen(wv));
      std::vector<float> got_rest(got.begin() + Ci, got.end());
      Vec want_rest(full.begin() + Ci, full.end());
      for (size_t i = 0; i < want_rest.size(); ++i)
        if (!(xv[static_cast<size_t>(Ci) + i] > 0.0f)) want_rest[i] = 0.0;
      support::check_close("dx of rows 1.. against float64", got_rest, want_rest, cs.tx);
      for (int64_t i = 0; i < Ci; ++i) {  // row 0: NaN where the relu was active, 0 elsewhere
        const bool active = xv[static_cast<size_t>(i)] > 0.0f;
        INFO("row 0, column " << i);
        CHECK((active ? std::isnan(got[static_cast<size_t>(i)]) : got[static_cast<size_t>(i)] == 0.0f));
      }
      std::string impl;
      for (const KernelChoice& k : d.be->kernels())
        if (k.op.rfind("inner product backward data", 0) == 0) impl = k.impl;
      const char* mode = std::getenv("MPX_DENSE_FEW");
      const bool off = (mode && std::string(mode) == "onednn") || std::getenv("MPX_CPU_REFERENCE");
      const bool native = support::onednn_native16_ran(d.be->kernels());
      INFO("backward data ran " << impl);
      if (Co > cpu::kDenseFewMaxOut || off) CHECK(impl.rfind("mpx:few-outputs", 0) != 0);
      if (Co <= cpu::kDenseFewMaxOut && !off && !native && (cs.t != DType::F32 || cs.tx != DType::F32 || Ci >= 8192))
        CHECK(impl.rfind("mpx:few-outputs", 0) == 0);
    }
}

TEST_CASE("dense_backward: the results of the weight gradient and the backward-data pass, on each kernel",
          "[backend][cpu][dense][fuse]") {
  // Backend::dense_backward against dense_backward_weights then dense_relu_backward_data (or
  // dense_backward_data) on the same tensors: where nothing was fused, bit for bit; where a
  // float32 layer's long input takes one walk (oneDNN's weight gradient alone), dw within
  // float32's bound of float64 and dx bit for bit. The walk is named in the kernels list
  // exactly where the rule says it runs.
  const DenseCase cases[] = {{DType::F32, DType::F32, 8200, 10}, {DType::F32, DType::F32, 300, 10},
                        {DType::F32, DType::F32, 300, 32},  {DType::BF16, DType::BF16, 300, 10},
                        {DType::F16, DType::F16, 300, 7},   {DType::BF16, DType::BF16, 300, 12},
                        {DType::F32, DType::BF16, 8200, 10}, {DType::F32, DType::F16, 300, 10},
                        {DType::F32, DType::BF16, 300, 32},  {DType::F32, DType::F16, 8200, 10},
                        {DType::BF16, DType::BF16, 8200, 7}};
  for (const DenseCase& cs : cases)
    for (bool relu : {true, false})
      DYNAMIC_SECTION(dtype_name(cs.t) << " layer, " << dtype_name(cs.tx) << " x, " << cs.Ci << " -> " << cs.Co
                                       << (relu ? ", relu" : "")) {
        support::CpuDev d;
        Rng rng(static_cast<uint64_t>(53 + cs.Ci + cs.Co));
        const int64_t N = 19, Ci = cs.Ci, Co = cs.Co;
        std::vector<float> xv, wv, dyv;
        Tensor x = d.rand(rng, cs.tx, Shape{N, Ci}, &xv);
        if (relu) {
          for (float& v : xv) v = std::max(v, 0.0f);
          d.put(x, xv);
        }
        Tensor w = d.rand(rng, cs.t, Shape{Co, Ci}, &wv), dy = d.rand(rng, cs.t, Shape{N, Co}, &dyv);
        Tensor dw = d.make(cs.t, Shape{Co, Ci}), db = d.make(cs.t, Shape{Co}), dx = d.make(cs.tx, Shape{N, Ci});
        Tensor dw2 = d.make(cs.t, Shape{Co, Ci}), db2 = d.make(cs.t, Shape{Co}), dx2 = d.make(cs.tx, Shape{N, Ci});
        d.be->dense_backward(x, dy, w, dw, db, dx, relu);
        d.be->dense_backward_weights(x, dy, dw2, db2);
        if (relu)
          d.be->dense_relu_backward_data(dy, w, x, dx2);
        else
          d.be->dense_backward_data(dy, w, dx2);
        std::string fused, wgrad;
        for (const KernelChoice& k : d.be->kernels()) {
          if (k.op.rfind("inner product backward weights and data for", 0) == 0) fused = k.impl;
          if (k.op.rfind("inner product backward weights for", 0) == 0 ||
              k.op.rfind("inner product backward weights " + std::string(dtype_name(cs.t)) + " for", 0) == 0)
            wgrad = k.impl;
        }
        INFO("fused: '" << fused << "'; weight gradient alone: '" << wgrad << "'");
        const char* mode = std::getenv("MPX_DENSE_FEW");
        const bool off = (mode && std::string(mode) != "auto") || std::getenv("MPX_CPU_REFERENCE");
        // The rule (choose_dense_backward): an x of 8,192+ columns, float32 in the AVX-512 build or
        // any dtype in the AVX2 build.
        const std::string isa = cpu::dense_few_isa();
        if (Co <= cpu::kDenseFewFuseMaxOut && !off && Ci >= 8192 &&
            (isa == "avx2" || (isa == "avx512" && cs.tx == DType::F32)))
          CHECK(fused.rfind("mpx:few-outputs", 0) == 0);
        else
          CHECK(fused.empty());
        support::check_exact("dx against the two ops", d.get(dx), d.get(dx2));
        Vec rdb;
        const Vec rdw = ref::dense_backward_weights(N, Ci, Co, support::widen(xv), support::widen(dyv), &rdb);
        support::check_close("dw against float64", d.get(dw), rdw, cs.t);
        support::check_close("db against float64", d.get(db), rdb, cs.t);
        Vec rdx = ref::dense_backward_data(N, Ci, Co, support::widen(dyv), support::widen(wv));
        if (relu)
          for (size_t i = 0; i < rdx.size(); ++i)
            if (!(xv[i] > 0.0f)) rdx[i] = 0.0;
        support::check_close("dx against float64", d.get(dx), rdx, cs.tx);
        if (fused.empty() || wgrad.rfind("mpx:few-outputs", 0) == 0) {
          support::check_exact("dw against the two ops", d.get(dw), d.get(dw2));
          support::check_exact("db against the two ops", d.get(db), d.get(db2));
        }
      }
}

TEST_CASE("dense_backward: an x of another shape or dtype than dx, or a dw of another shape, is refused",
          "[backend][cpu][dense]") {
  support::CpuDev d;
  Rng rng(47);
  Tensor dy = d.rand(rng, DType::F32, Shape{2, 3}, nullptr), w = d.rand(rng, DType::F32, Shape{3, 8}, nullptr);
  Tensor x = d.rand(rng, DType::F32, Shape{2, 8}, nullptr), dx = d.make(DType::F32, Shape{2, 8});
  Tensor dw = d.make(DType::F32, Shape{3, 8}), db = d.make(DType::F32, Shape{3});
  Tensor x16 = d.rand(rng, DType::BF16, Shape{2, 8}, nullptr), dw_short = d.make(DType::F32, Shape{3, 7});
  REQUIRE_THROWS_WITH(d.be->dense_backward(x16, dy, w, dw, db, dx, true),
                      Catch::Contains("dense_backward: x bfloat16[2, 8] and dx float32[2, 8]"));
  REQUIRE_THROWS_WITH(d.be->dense_backward(x, dy, w, dw_short, db, dx, false), Catch::Contains("dense_backward"));
  d.be->dense_backward(x, dy, w, dw, db, dx, false);  // the shapes the checks accept
}

TEST_CASE("dense_relu_backward_data: an x of another shape or dtype than dx is refused", "[backend][cpu][dense]") {
  support::CpuDev d;
  Rng rng(43);
  Tensor dy = d.rand(rng, DType::F32, Shape{2, 3}, nullptr), w = d.rand(rng, DType::F32, Shape{3, 8}, nullptr);
  Tensor dx = d.make(DType::F32, Shape{2, 8});
  Tensor x16 = d.rand(rng, DType::BF16, Shape{2, 8}, nullptr), x_short = d.rand(rng, DType::F32, Shape{2, 7}, nullptr);
  REQUIRE_THROWS_WITH(d.be->dense_relu_backward_data(dy, w, x16, dx),
                      Catch::Contains("dense_relu_backward_data: x bfloat16[2, 8] and dx float32[2, 8]"));
  REQUIRE_THROWS_WITH(d.be->dense_relu_backward_data(dy, w, x_short, dx),
                      Catch::Contains("dense_relu_backward_data: x float32[2, 7] and dx float32[2, 8]"));
}

TEST_CASE("dense ops: a float32 input or input gradient of a 16-bit layer, or outputs of another dtype, are refused",
          "[backend][cpu][dense]") {
  support::CpuDev d;
  Rng rng(37);
  Tensor x16 = d.rand(rng, DType::BF16, Shape{2, 8}, nullptr), x32 = d.rand(rng, DType::F32, Shape{2, 8}, nullptr);
  Tensor w16 = d.rand(rng, DType::BF16, Shape{3, 8}, nullptr);
  Tensor y16 = d.make(DType::BF16, Shape{2, 3}), y32 = d.make(DType::F32, Shape{2, 3});
  REQUIRE_THROWS_WITH(d.be->dense_forward(x32, w16, Tensor(), y16, Activation::None),
                      Catch::Contains("dense_forward: x float32[2, 8] must have the dtype of w (bfloat16)"));
  REQUIRE_THROWS_WITH(d.be->dense_forward(x16, w16, Tensor(), y32, Activation::None),
                      Catch::Contains("dense_forward: w bfloat16[3, 8] and y float32[2, 3] must have the same dtype"));
  Tensor dy16 = d.rand(rng, DType::BF16, Shape{2, 3}, nullptr), dx32 = d.make(DType::F32, Shape{2, 8});
  REQUIRE_THROWS_WITH(d.be->dense_backward_data(dy16, w16, dx32),
                      Catch::Contains("dense_backward_data: dx float32[2, 8] must have the dtype of dy (bfloat16)"));
  Tensor dw = d.make(DType::F32, Shape{3, 8});
  REQUIRE_THROWS_WITH(d.be->dense_backward_weights(x32, dy16, dw, Tensor()),
                      Catch::Contains("dense_backward_weights: x float32[2, 8] must have the dtype of dy (bfloat16)"));
}

TEST_CASE("bfloat16 dx: a float32 subnormal sum is a zero of its sign where the CPU rounds it, else a bfloat16 "
          "subnormal",
          "[backend][cpu][dense]") {
  // dx = dy w: every product is +-2^-130 (a float32 subnormal, a bfloat16 subnormal too), in
  // the vector blocks (pairs and single vectors) and the scalar tail columns, with and without
  // relu's mask (its output all positive); beside them products of +-1, which stay.
  const Shape3 s{3, 64 + 16 + 5, 2};
  std::vector<float> w(static_cast<size_t>(s.Co * s.Ci)), dy(static_cast<size_t>(s.N * s.Co));
  for (int64_t i = 0; i < s.Ci; ++i) {
    w[static_cast<size_t>(i)] = std::ldexp(i % 3 == 0 ? -1.0f : 1.0f, -65);  // output 0: tiny
    w[static_cast<size_t>(s.Ci + i)] = i % 2 == 0 ? 1.0f : -1.0f;           // output 1
  }
  const bool native = cpu::own_bf16_math();
  INFO((native ? "VCVTNEPS2BF16" : "elem16's formula") << ", kernel ISA " << cpu::dense_few_isa());
  const std::vector<uint16_t> relu_out(static_cast<size_t>(s.N * s.Ci), 0x3F80);  // bfloat16 1.0
  for (bool relu : {false, true}) {
    DYNAMIC_SECTION((relu ? "with relu" : "no relu")) {
      for (int64_t n = 0; n < s.N; ++n) {
        dy[static_cast<size_t>(n * s.Co)] = std::ldexp(n == 1 ? -1.0f : 1.0f, -65);
        dy[static_cast<size_t>(n * s.Co + 1)] = 0.0f;
      }
      std::vector<uint16_t> dx(static_cast<size_t>(s.N * s.Ci), 0xFFFF);
      cpu::dense_few_backward_data(s.N, s.Ci, s.Co, dy.data(), w.data(), dx.data(), DType::BF16,
                                   relu ? relu_out.data() : nullptr);
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t i = 0; i < s.Ci; ++i) {
          const float exact = std::ldexp(1.0f, -130) * ((i % 3 == 0) != (n == 1) ? -1.0f : 1.0f);
          const uint16_t want = native ? (std::signbit(exact) ? 0x8000 : 0x0000) : f32_to_bf16(exact);
          INFO("row " << n << ", column " << i);
          REQUIRE(dx[static_cast<size_t>(n * s.Ci + i)] == want);
        }
      if (!native) CHECK(f32_to_bf16(std::ldexp(1.0f, -130)) == 0x0008);  // a subnormal, not zero
      // And a sum of ordinary size rounds alike in both.
      for (int64_t n = 0; n < s.N; ++n) {
        dy[static_cast<size_t>(n * s.Co)] = 0.0f;
        dy[static_cast<size_t>(n * s.Co + 1)] = 1.5f;
      }
      cpu::dense_few_backward_data(s.N, s.Ci, s.Co, dy.data(), w.data(), dx.data(), DType::BF16,
                                   relu ? relu_out.data() : nullptr);
      for (int64_t i = 0; i < s.N * s.Ci; ++i)
        REQUIRE(dx[static_cast<size_t>(i)] == f32_to_bf16((i % s.Ci) % 2 == 0 ? 1.5f : -1.5f));
    }
  }
}

namespace {

/// dense_conv_backward's cases: a first convolution (stride 1, few channels) whose relu output,
/// flattened, has at least 8,192 columns (the walk's rule), a dense layer of Co outputs on it.
struct DenseConvCase {
  const char* name;
  support::ConvCase conv;
  int64_t Co;
};

/// g(n) of the walk's float32 sums of the convolution's products: a chunk of 16 rows times the
/// pixels of a panel of at most 256 columns (then float64, one rounding).
double dense_conv_gamma(int64_t K) { return gamma(16 * 256 / K + 1); }

/// The convolution's dw and db (dw KRSC) against the float64 reference from its input x and its
/// output gradient g, within that bound.
void check_conv_grads(const Conv2dParams& p, const ref::ConvDims& dims, const std::vector<float>& x,
                      const std::vector<float>& g, const std::vector<float>& dw, const std::vector<float>& db) {
  Vec rdb, mdb;
  const Vec rdw = ref::conv2d_backward_filter(p, dims, support::widen(x), support::widen(g), &rdb);
  const Vec mdw = ref::conv2d_backward_filter(p, dims, absv(x), absv(g), &mdb);
  const double u = std::ldexp(1.0, -24), gm = dense_conv_gamma(dims.K);
  REQUIRE(dw.size() == rdw.size());
  REQUIRE(db.size() == rdb.size());
  for (size_t i = 0; i < dw.size(); ++i)
    if (!(std::fabs(dw[i] - rdw[i]) <= gm * mdw[i] + u * std::fabs(rdw[i]) + 1e-30))
      FAIL("the convolution's dw[" << i << "] " << dw[i] << ", reference " << rdw[i]);
  for (size_t k = 0; k < db.size(); ++k)
    if (!(std::fabs(db[k] - rdb[k]) <= gm * mdb[k] + u * std::fabs(rdb[k]) + 1e-30))
      FAIL("the convolution's db[" << k << "] " << db[k] << ", reference " << rdb[k]);
}

}  // namespace

TEST_CASE("dense_conv_backward: the dense layer's gradients of dense_backward, the convolution's within float32 "
          "summation of the float64 reference, dx never needed",
          "[backend][cpu][dense][fuse]") {
  // Backend::dense_conv_backward against dense_backward(relu) then conv2d_backward_filter on the
  // dx it returns: dw and db of the dense layer bit for bit where both run mpx's loops (within
  // float32's bound of float64 everywhere); the convolution's dw and db within the bound of
  // their float32 sums of the float64 reference on that dx, and bit for bit where the walk does
  // not run (the base runs the two ops). Valid and same padding (windows into the padding), 1
  // to 4 channels, 16/32/64 filters, taps in several blocks, a batch of 19 (a partial chunk),
  // 1 to 3 threads, float32 and 16-bit.
  const DenseConvCase cases[] = {
      {"seed MNIST-like 3x3 valid, C=1, K=32", {"", 19, 18, 18, 1, 32, 3, 3, 0, 0, 0, 0}, 10},
      {"CIFAR-like 3x3 same, C=3, K=64", {"", 19, 12, 12, 3, 64, 3, 3, 1, 1, 1, 1}, 7},
      {"5x5 valid, C=2, K=16 (50 taps)", {"", 19, 28, 28, 2, 16, 5, 5, 0, 0, 0, 0}, 10},
      {"1x1, C=4, K=32", {"", 19, 16, 16, 4, 32, 1, 1, 0, 0, 0, 0}, 1},
      {"2x2, padding after, C=3, K=32", {"", 19, 16, 16, 3, 32, 2, 2, 0, 0, 1, 1}, 10},
  };
  for (const DenseConvCase& cs : cases)
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      for (int threads : {1, 2, 3})
        DYNAMIC_SECTION(cs.name << ", " << dtype_name(t) << ", " << threads << " threads") {
          const support::ConvCase& c = cs.conv;
          const Conv2dParams p = c.params();
          const ref::ConvDims dims = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
          const int64_t N = c.N, Ci = dims.P * dims.Q * c.K, Co = cs.Co;
          REQUIRE(Ci >= 8192);
          const support::OmpThreads th(threads);
          support::CpuDev d;
          Rng rng(static_cast<uint64_t>(71 + Ci + Co + c.C));
          std::vector<float> xv, wv, dyv, cxv;
          Tensor x = d.rand(rng, t, Shape{N, Ci}, &xv);  // the convolution's relu output: half zeros
          for (float& v : xv) v = std::max(v, 0.0f);
          d.put(x, xv);
          Tensor cx = d.rand(rng, t, Shape{N, c.H, c.W, c.C}, &cxv);
          Tensor w = d.rand(rng, DType::F32, Shape{Co, Ci}, &wv), dy = d.rand(rng, DType::F32, Shape{N, Co}, &dyv);
          Tensor dw = d.make(DType::F32, Shape{Co, Ci}), db = d.make(DType::F32, Shape{Co}), dx = d.make(t, Shape{N, Ci});
          Tensor cdw = d.make(DType::F32, Shape{c.K, c.R, c.S, c.C}), cdb = d.make(DType::F32, Shape{c.K});
          d.be->dense_conv_backward(x, dy, w, dw, db, dx, p, cx, cdw, cdb);
          // The two ops.
          Tensor dw2 = d.make(DType::F32, Shape{Co, Ci}), db2 = d.make(DType::F32, Shape{Co});
          Tensor dx2 = d.make(t, Shape{N, Ci}), cdw2 = d.make(DType::F32, Shape{c.K, c.R, c.S, c.C});
          Tensor cdb2 = d.make(DType::F32, Shape{c.K});
          d.be->dense_backward(x, dy, w, dw2, db2, dx2, true);
          Tensor g2 = dx2;
          g2.shape = Shape{N, dims.P, dims.Q, c.K};
          d.be->conv2d_backward_filter(p, cx, g2, cdw2, cdb2);
          std::string walk, both, wgrad;
          for (const KernelChoice& k : d.be->kernels()) {
            if (k.op.rfind("inner product backward weights and data with", 0) == 0) walk = k.impl;
            if (k.op.rfind("inner product backward weights and data for", 0) == 0) both = k.impl;
            if (k.op.rfind("inner product backward weights for", 0) == 0) wgrad = k.impl;
          }
          INFO("walk: '" << walk << "'; dense_backward: '" << both << "'; its weight gradient: '" << wgrad << "'");
          const char* mode = std::getenv("MPX_DENSE_FEW");
          const bool off = (mode && std::string(mode) != "auto") || std::getenv("MPX_CPU_REFERENCE");
          const std::string isa = cpu::dense_few_isa();
          // The rule (choose_dense_conv_backward): at most 10 outputs, 8,192+ columns, a float32
          // x, the AVX-512 or AVX2 build.
          const bool runs = !off && t == DType::F32 && (isa == "avx512" || isa == "avx2");
          if (runs)
            CHECK(walk.rfind("mpx:few-outputs", 0) == 0);
          else
            CHECK(walk.empty());
          // The dense layer's dw and db.
          Vec rdb;
          const Vec rdw = ref::dense_backward_weights(N, Ci, Co, support::widen(xv), support::widen(dyv), &rdb);
          support::check_close("dw against float64", d.get(dw), rdw, DType::F32);
          support::check_close("db against float64", d.get(db), rdb, DType::F32);
          if (!runs || both.rfind("mpx:few-outputs", 0) == 0 || wgrad.rfind("mpx:few-outputs", 0) == 0) {
            support::check_exact("dw against dense_backward", d.get(dw), d.get(dw2));
            support::check_exact("db against dense_backward", d.get(db), d.get(db2));
          }
          // The convolution's, against float64 on the dx the two ops give.
          const std::vector<float> gotw = d.get(cdw), gotb = d.get(cdb);
          check_conv_grads(p, dims, cxv, d.get(dx2), gotw, gotb);
          if (!runs) {
            support::check_exact("the convolution's dw against the two ops", gotw, d.get(cdw2));
            support::check_exact("the convolution's db against the two ops", gotb, d.get(cdb2));
          }
        }
}

TEST_CASE("dense_few_backward_conv on 16-bit operands: the dense layer's bits, the convolution's within float32 "
          "summation of the float64 reference",
          "[backend][cpu][dense][fuse]") {
  // The loops take a 16-bit x too (the backend's rule sends only float32 there): against the
  // separate loops' dw and db bit for bit, and the convolution's gradients against float64 on
  // the dx that dense_few_backward returns (rounded once to x's dtype), 1 to 3 threads.
  const support::ConvCase c{"", 19, 18, 18, 1, 32, 3, 3, 0, 0, 0, 0};
  const Conv2dParams p = c.params();
  const ref::ConvDims dims = ref::conv_dims(p, c.N, c.H, c.W, c.C, c.K);
  const cpu::conv_detail::Geo g = support::stride1_geo(c, dims);
  const int64_t N = c.N, Ci = dims.P * dims.Q * c.K, Co = 10, J = c.R * c.S * c.C;
  for (DType t : {DType::BF16, DType::F16})
    for (int threads : {1, 2, 3}) DYNAMIC_SECTION(dtype_name(t) << ", " << threads << " threads") {
        const support::OmpThreads th(threads);
        Rng rng(static_cast<uint64_t>(5 + threads));
        std::vector<float> xv = support::uniform_values(rng, N * Ci, t);
        for (float& v : xv) v = std::max(v, 0.0f);
        const std::vector<float> cxv = support::uniform_values(rng, N * c.H * c.W * c.C, t);
        const std::vector<float> wv = support::uniform_values(rng, Co * Ci), dyv = support::uniform_values(rng, N * Co);
        const std::vector<uint16_t> x16 = support::to16(xv, t), cx16 = support::to16(cxv, t);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> dw(static_cast<size_t>(Co * Ci), nan), db(static_cast<size_t>(Co), nan);
        std::vector<float> cdw(static_cast<size_t>(c.K * J), nan), cdb(static_cast<size_t>(c.K), nan);
        std::vector<double> scratch(cpu::dense_few_conv_scratch(g, threads), 0.0);
        cpu::dense_few_backward_conv(N, Ci, Co, x16.data(), t, dyv.data(), wv.data(), dw.data(), db.data(), g,
                                     cx16.data(), cdw.data(), cdb.data(), scratch.data());
        std::vector<float> dw2(dw.size(), nan), db2(db.size(), nan), dxf(static_cast<size_t>(N * Ci));
        std::vector<uint16_t> dx16(static_cast<size_t>(N * Ci), 0xFFFF);
        cpu::dense_few_backward(N, Ci, Co, x16.data(), t, dyv.data(), wv.data(), dw2.data(), db2.data(), dx16.data(),
                                true);
        support::check_exact("dw against dense_few_backward", dw, dw2);
        support::check_exact("db against dense_few_backward", db, db2);
        convert(dx16.data(), t, dxf.data(), DType::F32, dxf.size());
        check_conv_grads(p, dims, cxv, dxf, cdw, cdb);
      }
}

TEST_CASE("dense_conv_backward: the walk's results do not depend on which thread count ran the dense part",
          "[backend][cpu][dense][fuse]") {
  // The dense layer's dw and db are the same bits at 1, 2 and 3 threads (each column summed over
  // the rows in order by one thread); the convolution's are within their bound at each (checked
  // above), and the same bits when the thread count is the same.
  const support::ConvCase c{"", 5, 18, 18, 1, 32, 3, 3, 0, 0, 0, 0};
  const Conv2dParams p = c.params();
  const int64_t Ci = 16 * 16 * 32, Co = 10, N = c.N;
  std::vector<float> dw1, cdw_first;
  for (int threads : {1, 2, 3, 2}) {
    const support::OmpThreads th(threads);
    support::CpuDev d;
    Rng rng(99);
    std::vector<float> xv;
    Tensor x = d.rand(rng, DType::F32, Shape{N, Ci}, &xv);
    for (float& v : xv) v = std::max(v, 0.0f);
    d.put(x, xv);
    Tensor cx = d.rand(rng, DType::F32, Shape{N, c.H, c.W, c.C}, nullptr);
    Tensor w = d.rand(rng, DType::F32, Shape{Co, Ci}, nullptr), dy = d.rand(rng, DType::F32, Shape{N, Co}, nullptr);
    Tensor dw = d.make(DType::F32, Shape{Co, Ci}), db = d.make(DType::F32, Shape{Co}), dx = d.make(DType::F32, Shape{N, Ci});
    Tensor cdw = d.make(DType::F32, Shape{c.K, c.R, c.S, c.C}), cdb = d.make(DType::F32, Shape{c.K});
    d.be->dense_conv_backward(x, dy, w, dw, db, dx, p, cx, cdw, cdb);
    if (dw1.empty())
      dw1 = d.get(dw);
    else
      support::check_exact("dw at " + std::to_string(threads) + " threads", d.get(dw), dw1);
    if (threads == 2) {
      if (cdw_first.empty())
        cdw_first = d.get(cdw);
      else
        support::check_exact("the convolution's dw, 2 threads again", d.get(cdw), cdw_first);
    }
  }
}

TEST_CASE("dense_conv_backward: an x that is not the convolution's output, or a convolution input of another dtype, "
          "is refused",
          "[backend][cpu][dense]") {
  support::CpuDev d;
  Rng rng(41);
  Conv2dParams p;
  p.R = p.S = 3;
  Tensor cx = d.rand(rng, DType::F32, Shape{2, 6, 6, 1}, nullptr), cx16 = d.rand(rng, DType::BF16, Shape{2, 6, 6, 1}, nullptr);
  Tensor cdw = d.make(DType::F32, Shape{16, 3, 3, 1}), cdb = d.make(DType::F32, Shape{16});
  Tensor x = d.rand(rng, DType::F32, Shape{2, 4 * 4 * 16}, nullptr), dx = d.make(DType::F32, Shape{2, 4 * 4 * 16});
  Tensor xs = d.rand(rng, DType::F32, Shape{2, 100}, nullptr), dxs = d.make(DType::F32, Shape{2, 100});
  Tensor w = d.rand(rng, DType::F32, Shape{3, 256}, nullptr), ws = d.rand(rng, DType::F32, Shape{3, 100}, nullptr);
  Tensor dy = d.rand(rng, DType::F32, Shape{2, 3}, nullptr);
  Tensor dw = d.make(DType::F32, Shape{3, 256}), dws = d.make(DType::F32, Shape{3, 100}), db = d.make(DType::F32, Shape{3});
  REQUIRE_THROWS_WITH(d.be->dense_conv_backward(xs, dy, ws, dws, db, dxs, p, cx, cdw, cdb),
                      Catch::Contains("dense_conv_backward: x float32[2, 100] must be the convolution's output "
                                      "flattened, [2, 4x4x16]"));
  REQUIRE_THROWS_WITH(d.be->dense_conv_backward(x, dy, w, dw, db, dx, p, cx16, cdw, cdb),
                      Catch::Contains("dense_conv_backward: x float32[2, 256] and conv_x bfloat16[2, 6, 6, 1]"));
  Tensor cdw_bad = d.make(DType::F32, Shape{16, 3, 3, 2});
  REQUIRE_THROWS_WITH(d.be->dense_conv_backward(x, dy, w, dw, db, dx, p, cx, cdw_bad, cdb),
                      Catch::Contains("disagree on C"));
}
