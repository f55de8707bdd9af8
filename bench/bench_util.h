// SPDX-License-Identifier: MIT
// Shared by the CPU backend benchmarks (bench/*_bench.cpp): a CPU backend with the
// buffers of one run, random inputs rounded to their dtype, and per-call timers.
// They print figures and check nothing; correctness is the tests' job.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "core/rng.h"

namespace bench {

/// A CPU backend plus the buffers it allocated for one benchmark.
struct CpuDev {
  std::unique_ptr<mpx::Backend> be = mpx::create_backend("cpu");
  std::vector<mpx::Buffer> bufs;

  mpx::Tensor make(mpx::DType t, mpx::Shape s) {
    bufs.push_back(be->alloc(static_cast<size_t>(s.numel()) * mpx::dtype_size(t), "bench"));
    return bufs.back().view(t, s);
  }
  void put(const mpx::Tensor& t, const std::vector<float>& v) {
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
  /// offset + uniform[lo, hi) rounded to t (the values in *vals when given).
  mpx::Tensor rand(mpx::Rng& rng, mpx::DType t, mpx::Shape s, std::vector<float>* vals = nullptr, double lo = -1,
                   double hi = 1, double offset = 0) {
    mpx::Tensor x = make(t, s);
    std::vector<float> v(static_cast<size_t>(s.numel()));
    for (auto& e : v) e = mpx::round_to(t, static_cast<float>(offset + rng.uniform(lo, hi)));
    put(x, v);
    if (vals) *vals = std::move(v);
    return x;
  }
};

/// Milliseconds now: wall time, or the process's CPU time (all threads) when cpu_time.
inline double now_ms(bool cpu_time) {
  if (cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Mean milliseconds per call over `reps` calls, after one untimed call (which creates
/// the plan and grows the scratch).
template <typename F>
double mean_ms(F&& f, int reps, bool cpu_time = false) {
  f();
  const double t0 = now_ms(cpu_time);
  for (int i = 0; i < reps; ++i) f();
  return (now_ms(cpu_time) - t0) / reps;
}

/// Median milliseconds of one call over `reps` calls, after one untimed call.
template <typename F>
double median_ms(F&& f, int reps) {
  f();
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_ms(false);
    f();
    v.push_back(now_ms(false) - t0);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The fastest of `reps` calls, after one untimed call (on a shared machine the minimum
/// is the least noisy figure).
template <typename F>
double min_ms(F&& f, int reps) {
  f();
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_ms(false);
    f();
    best = std::min(best, now_ms(false) - t0);
  }
  return best;
}

inline std::string shape_str(const mpx::Shape& s) {
  std::string r = "[";
  for (int i = 0; i < s.rank; ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace bench
