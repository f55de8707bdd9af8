// SPDX-License-Identifier: MIT
// The memory bandwidth of this machine on the OpenMP threads OMP_NUM_THREADS gives: best
// GB/s of a read (a sum), a write (a fill) and a copy over arrays far larger than the caches.
// bench/cpu_peers.py sets it beside each net's activation traffic (docs/cpu-performance.md,
// "Against the peers"), as gemm_ceiling sets the convolutions beside the GEMM ceiling.
//   mem_bandwidth [MiB per array] [reps]      (defaults 256, 10); prints one JSON object
// GB/s count the bytes the loop asks for: the copy's read and write both, a write's line
// fetch (write-allocate) not at all.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

namespace {

/// Best GB/s of `reps` calls of f (after one warm-up call), f touching `bytes` bytes.
double best_gbs(int reps, double bytes, const std::function<void()>& f) {
  double best = 0.0;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::max(best, bytes / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const long mib = argc > 1 ? std::atol(argv[1]) : 256;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  if (mib < 16 || mib > 8192 || reps < 1) {
    std::fprintf(stderr, "usage: mem_bandwidth [MiB per array in 16..8192] [reps >= 1]\n");
    return 2;
  }
  const long n = mib * (1L << 20) / static_cast<long>(sizeof(float));
  // Uninitialized storage, first touched by the threads that use it (their NUMA node's pages).
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]);
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 7);
    b[i] = 0.0f;
  }
  float* pa = a.get();
  float* pb = b.get();
  const double bytes = static_cast<double>(n) * sizeof(float);
  volatile float sink = 0.0f;  // keeps the sum
  const double read = best_gbs(reps, bytes, [&] {
    float s = 0.0f;
#pragma omp parallel reduction(+ : s)
    {
      // Independent sums in 16 lanes: one chain of additions would time the adder, not memory.
      float acc[16] = {};
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const long chunk = (n / 16 + nt - 1) / nt * 16, lo = std::min(n, t * chunk), hi = std::min(n, lo + chunk);
      for (long i = lo; i + 16 <= hi; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] += pa[i + l];
      for (long i = lo + (hi - lo) / 16 * 16; i < hi; ++i) acc[0] += pa[i];
      for (float x : acc) s += x;
    }
    sink = sink + s;
  });
  float value = 1.0f;
  const double write = best_gbs(reps, bytes, [&] {
    const float v = value;
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; ++i) pb[i] = v;
    value += 1.0f;
  });
  const double copy = best_gbs(reps, 2.0 * bytes, [&] {
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; ++i) pb[i] = pa[i];
  });
  std::printf("{\"bandwidth\": \"OpenMP read, write, copy of float32 arrays\", \"mib\": %ld, \"threads\": %d, "
              "\"reps\": %d, \"read_gbs_best\": %.1f, \"write_gbs_best\": %.1f, \"copy_gbs_best\": %.1f, "
              "\"checksum\": %.3g}\n",
              mib, omp_get_max_threads(), reps, read, write, copy, static_cast<double>(sink) + pb[n / 2]);
  return 0;
}
