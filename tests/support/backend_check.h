// SPDX-License-Identifier: MIT
// Shared by the CPU backend tests (test_backend*.cpp): a CPU backend with the buffers of
// one test (every new tensor poisoned, so an unwritten output fails), random inputs
// rounded to their dtype, and the comparisons against the float64 reference
// (support/reference.h): per element and in relative L2 norm, or bit for bit.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/reference.h"

namespace support {

inline const float kNaN = std::numeric_limits<float>::quiet_NaN();
inline const float kInf = std::numeric_limits<float>::infinity();

/// A CPU backend plus the buffers of one test; every new tensor is poisoned
/// (floats with NaN, other dtypes with 0xAB bytes).
struct CpuDev {
  std::unique_ptr<mpx::Backend> be = mpx::create_backend("cpu");
  std::vector<mpx::Buffer> bufs;

  mpx::Tensor make(mpx::DType t, mpx::Shape s) {
    bufs.push_back(be->alloc(static_cast<size_t>(s.numel()) * mpx::dtype_size(t), "test"));
    mpx::Tensor x = bufs.back().view(t, s);
    if (mpx::is_float(t))
      be->fill(x, kNaN);
    else
      std::memset(x.data, 0xAB, x.bytes());
    return x;
  }
  /// Uploads float values (already representable in t) into t.
  void put(const mpx::Tensor& t, const std::vector<float>& v) {
    REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
    std::vector<char> bytes(t.bytes());
    mpx::convert(v.data(), mpx::DType::F32, bytes.data(), t.dtype, v.size());
    be->upload(t, bytes.data());
  }
  std::vector<float> get(const mpx::Tensor& t) {
    std::vector<char> bytes(t.bytes());
    be->download(bytes.data(), t);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    mpx::convert(bytes.data(), t.dtype, v.data(), mpx::DType::F32, v.size());
    return v;
  }
  /// Random values in [lo, hi), never within 1e-3 of 0, rounded to t (returned in *vals).
  mpx::Tensor rand(mpx::Rng& rng, mpx::DType t, mpx::Shape s, std::vector<float>* vals, double lo = -1,
                   double hi = 1) {
    mpx::Tensor x = make(t, s);
    std::vector<float> v(static_cast<size_t>(s.numel()));
    for (auto& e : v) {
      double d = rng.uniform(lo, hi);
      if (std::fabs(d) < 1e-3) d = 1e-3 + rng.uniform() * 1e-2;
      e = mpx::round_to(t, static_cast<float>(d));
    }
    put(x, v);
    if (vals) *vals = v;
    return x;
  }
  /// Values offset + uniform[lo, hi) rounded to t, zero allowed (returned in *vals).
  mpx::Tensor rand_plain(mpx::Rng& rng, mpx::DType t, mpx::Shape s, std::vector<float>* vals, double lo = -1,
                         double hi = 1, double offset = 0) {
    mpx::Tensor x = make(t, s);
    std::vector<float> v(static_cast<size_t>(s.numel()));
    for (auto& e : v) e = mpx::round_to(t, static_cast<float>(offset + rng.uniform(lo, hi)));
    put(x, v);
    if (vals) *vals = v;
    return x;
  }
};

inline ref::Vec widen(const std::vector<float>& v) { return ref::Vec(v.begin(), v.end()); }

/// Relative tolerance per dtype: 2 half-ulps of float16 / bfloat16, 1e-5 for float32.
inline double dtype_eps(mpx::DType t) {
  switch (t) {
    case mpx::DType::F16: return 1.0 / 1024;
    case mpx::DType::BF16: return 1.0 / 128;
    default: return 1e-5;
  }
}

/// Every element finite and within eps*|ref| + max(1e-5*loosen*max|ref|, the float16
/// subnormal spacing 2^-24 for float16 results), eps = dtype_eps(t)*loosen, and the whole
/// tensor within eps in relative L2 norm. Reports the first bad element.
inline void check_close(const std::string& what, const std::vector<float>& got, const ref::Vec& want, mpx::DType t,
                        double loosen = 1.0) {
  REQUIRE(got.size() == want.size());
  const double eps = dtype_eps(t) * loosen;
  double maxref = 0, num = 0, den = 0;
  for (double r : want) maxref = std::max(maxref, std::fabs(r));
  const double abs_tol = std::max(1e-5 * loosen * maxref, t == mpx::DType::F16 ? std::ldexp(1.0, -24) : 0.0);
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!std::isfinite(got[i]) || err > eps * std::fabs(want[i]) + abs_tol) {
      FAIL(what << " (" << mpx::dtype_name(t) << "): element " << i << " of " << got.size() << " is " << got[i]
                << ", reference " << want[i] << " (error " << err << ")");
    }
    num += err * err;
    den += want[i] * want[i];
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  INFO(what << " (" << mpx::dtype_name(t) << "): relative L2 error " << rel);
  REQUIRE(rel <= eps);
}

/// Whether an op ran on oneDNN's native 16-bit kernels: the kernels list names them with their
/// dtype after the op (`convolution forward bfloat16 for ...`), widened ones as "widened ...".
/// (The math16 report counts mpx's own kernels on the CPU's 16-bit products as native too.)
inline bool onednn_native16_ran(const std::vector<mpx::KernelChoice>& kernels) {
  for (const mpx::KernelChoice& k : kernels)
    if ((k.op.find(" bfloat16 for ") != std::string::npos || k.op.find(" float16 for ") != std::string::npos) &&
        k.impl.rfind("widened", 0) != 0)
      return true;
  return false;
}

/// Bit for bit (a NaN matches any NaN).
inline void check_exact(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = (std::isnan(got[i]) && std::isnan(want[i])) || std::memcmp(&got[i], &want[i], 4) == 0;
    if (!same) FAIL(what << ": element " << i << " is " << got[i] << ", expected " << want[i]);
  }
}

}  // namespace support
