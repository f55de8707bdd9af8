// SPDX-License-Identifier: MIT
// Helpers of the CPU-vs-CUDA agreement tests (ggml's test-backend-ops shape): the
// same inputs (identical bits) on both backends, outputs poisoned with NaN before
// each call, the whole-tensor relative error against a per-dtype tolerance, and
// the worst element in the failure message; bit-exact checks for the fused passes
// (any two NaNs equal: support/float_bits.h).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/float_bits.h"
#include "support/pool_bound.h"

namespace cudatest {

using namespace mpx;
using support::gamma32;
using support::rounded_bound;

/// The GPU backend's cuDNN/cuBLASLt workspace: MPX_TEST_CUDA_WORKSPACE_MB when set (the staged
/// GPU check's compute-sanitizer reruns keep it small, docs/gpu.md), else the default.
inline BackendOptions test_cuda_options() {
  BackendOptions o;
  if (const char* mb = std::getenv("MPX_TEST_CUDA_WORKSPACE_MB"); mb && *mb)
    o.cuda_workspace_bytes = static_cast<size_t>(std::strtoull(mb, nullptr, 10)) << 20;
  return o;
}

struct Backends {
  std::unique_ptr<Backend> cpu = create_backend("cpu");
  std::unique_ptr<Backend> gpu = create_backend("cuda", test_cuda_options());
};
inline Backends& be() {
  static Backends b;
  return b;
}

/// One tensor on both backends.
struct Dual {
  Buffer cb, gb;
  Tensor c, g;
  DType t = DType::F32;
  Shape s;
};

inline Dual alloc_dual(DType t, Shape s) {
  Dual d;
  const size_t bytes = static_cast<size_t>(s.numel()) * dtype_size(t);
  d.cb = be().cpu->alloc(bytes, "test");
  d.gb = be().gpu->alloc(bytes, "test");
  d.c = d.cb.view(t, s);
  d.g = d.gb.view(t, s);
  d.t = t;
  d.s = s;
  return d;
}

/// Uploads the same bytes to both.
inline Dual from_bytes(DType t, Shape s, const void* bytes) {
  Dual d = alloc_dual(t, s);
  be().cpu->upload(d.c, bytes);
  be().gpu->upload(d.g, bytes);
  return d;
}

/// Float values rounded to t on the host, identical bits on both backends.
inline Dual from_floats(DType t, Shape s, const std::vector<float>& v) {
  std::vector<uint8_t> bytes(static_cast<size_t>(s.numel()) * dtype_size(t));
  convert(v.data(), DType::F32, bytes.data(), t, v.size());
  return from_bytes(t, s, bytes.data());
}

inline std::vector<float> random_floats(Rng& rng, int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = static_cast<float>(rng.uniform(lo, hi));
    if (x == 0.0f) x = 0.5f * hi;  // never zeros
  }
  return v;
}

inline Dual random_dual(Rng& rng, DType t, Shape s, float lo = -1.0f, float hi = 1.0f) {
  return from_floats(t, s, random_floats(rng, s.numel(), lo, hi));
}

/// An output poisoned with NaN on both backends, so an unwritten element fails.
inline Dual poisoned(DType t, Shape s) {
  Dual d = alloc_dual(t, s);
  if (is_float(t)) {
    be().cpu->fill(d.c, NAN);
    be().gpu->fill(d.g, NAN);
  } else {
    be().cpu->fill(d.c, 123);
    be().gpu->fill(d.g, 123);
  }
  return d;
}

inline std::vector<uint8_t> raw(Backend& b, const Tensor& t) {
  std::vector<uint8_t> out(t.bytes());
  b.download(out.data(), t);
  return out;
}

inline std::vector<float> floats(Backend& b, const Tensor& t) {
  const std::vector<uint8_t> r = raw(b, t);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  convert(r.data(), t.dtype, out.data(), DType::F32, out.size());
  return out;
}

/// Per-dtype tolerance of the whole-tensor relative error: float32 1e-5 (convolutions 1e-4),
/// float16 1e-3, bfloat16 8e-3.
inline double tolerance(DType t, bool conv = false) {
  switch (t) {
    case DType::F32: return conv ? 1e-4 : 1e-5;
    case DType::F16: return 1e-3;
    default: return 8e-3;
  }
}

/// ||gpu - cpu|| / ||cpu|| <= tol, no NaN where the CPU has none; reports the worst element.
inline void expect_close(const Dual& d, double tol, const std::string& what) {
  const std::vector<float> c = floats(*be().cpu, d.c), g = floats(*be().gpu, d.g);
  double num = 0, den = 0, worst = -1;
  size_t at = 0, nan_at = c.size();
  for (size_t i = 0; i < c.size(); ++i) {
    if (std::isnan(g[i]) != std::isnan(c[i])) {
      if (nan_at == c.size()) nan_at = i;
      continue;
    }
    if (std::isnan(c[i])) continue;
    const double e = static_cast<double>(g[i]) - c[i];
    num += e * e;
    den += static_cast<double>(c[i]) * c[i];
    if (std::fabs(e) > worst) {
      worst = std::fabs(e);
      at = i;
    }
  }
  const double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  std::ostringstream msg;
  msg << what << " " << dtype_name(d.t) << d.s.str() << ": relative error " << rel << " (tolerance " << tol
      << "), worst element " << at << ": cuda " << (g.empty() ? 0.f : g[at]) << " vs cpu "
      << (c.empty() ? 0.f : c[at]);
  if (nan_at != c.size())
    msg << "; NaN mismatch (unwritten?) at element " << nan_at << ": cuda " << g[nan_at] << " vs cpu " << c[nan_at];
  INFO(msg.str());
  CHECK(nan_at == c.size());
  CHECK(rel <= tol);
}

/// Bit-for-bit equality, except that any two NaNs of a float dtype are equal (x86 keeps a
/// NaN's payload, NVIDIA GPUs write the canonical 0x7fffffff); reports the first differing element.
inline void expect_bits(const Dual& d, const std::string& what) {
  const std::vector<uint8_t> c = raw(*be().cpu, d.c), g = raw(*be().gpu, d.g);
  REQUIRE(c.size() == g.size());
  const size_t es = dtype_size(d.t);
  const size_t n = c.size() / es;
  const size_t first = support::first_difference_nan_equal(c.data(), g.data(), c.size(), d.t);
  std::ostringstream msg;
  msg << what << " " << dtype_name(d.t) << d.s.str() << ": ";
  if (first == n) {
    msg << "bit-identical (NaNs of any payload count as equal)";
  } else if (is_float(d.t)) {
    const std::vector<float> cf = floats(*be().cpu, d.c), gf = floats(*be().gpu, d.g);
    msg << "first difference at element " << first << ": cuda " << gf[first] << " vs cpu " << cf[first];
  } else {
    msg << "first difference at element " << first << ": cuda " << int(g[first * es]) << " vs cpu "
        << int(c[first * es]);
  }
  INFO(msg.str());
  CHECK(first == n);
}

/// Each backend's output element i within bound[i] of the float64 reference ref[i] (the
/// ops whose two implementations may sum in different orders: docs/gpu.md, "What the CUDA
/// tests compare"); reports the worst element against its bound.
inline void expect_within(const Dual& d, const std::vector<double>& ref, const std::vector<double>& bound,
                          const std::string& what) {
  REQUIRE(ref.size() == static_cast<size_t>(d.s.numel()));
  REQUIRE(bound.size() == ref.size());
  for (int side = 0; side < 2; ++side) {
    const std::vector<float> v = floats(side == 0 ? *be().cpu : *be().gpu, side == 0 ? d.c : d.g);
    size_t bad = v.size(), worst = 0;
    double worst_ratio = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double e = std::fabs(static_cast<double>(v[i]) - ref[i]);
      if (!(e <= bound[i]) && bad == v.size()) bad = i;
      const double r = bound[i] > 0 ? e / bound[i] : (e > 0 ? INFINITY : 0);
      if (r > worst_ratio || std::isnan(r)) {
        worst_ratio = r;
        worst = i;
      }
    }
    std::ostringstream msg;
    msg << what << " " << dtype_name(d.t) << d.s.str() << " on " << (side == 0 ? "cpu" : "cuda")
        << ": worst element " << worst << " = " << (v.empty() ? 0.f : v[worst]) << " against float64 "
        << (ref.empty() ? 0.0 : ref[worst]) << " (error " << worst_ratio << " of its bound)";
    if (bad != v.size()) msg << "; first out of bound: element " << bad;
    INFO(msg.str());
    CHECK(bad == v.size());
  }
}

inline const std::vector<DType>& float_dtypes() {
  static const std::vector<DType> v{DType::F32, DType::F16, DType::BF16};
  return v;
}

}  // namespace cudatest
