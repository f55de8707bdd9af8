// SPDX-License-Identifier: MIT
// The float32 GEMM ceiling of this CPU: GFLOP/s of oneDNN's dnnl_sgemm (the
// library mpx's CPU backend runs on) on square row-major matrices, on the
// OpenMP threads OMP_NUM_THREADS gives. bench/cpu_peers.py reports the
// convolutions' achieved GFLOP/s as a fraction of it (docs/cpu-performance.md,
// "Against the peers").
//   gemm_ceiling [N] [reps]      (defaults 2048, 10); prints one JSON object
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 2048;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  if (n < 16 || n > 16384 || reps < 1) {
    std::fprintf(stderr, "usage: gemm_ceiling [N in 16..16384] [reps >= 1]\n");
    return 2;
  }
  std::vector<float> a(n * n), b(n * n), c(n * n, 0.0f);
  for (long i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>((i * 7 % 13) - 6) / 8.0f;
    b[i] = static_cast<float>((i * 5 % 11) - 5) / 8.0f;
  }
  std::vector<double> gflops;
  for (int r = 0; r < reps + 1; ++r) {  // the first call is a warm-up
    const auto t0 = std::chrono::steady_clock::now();
    if (dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n) != dnnl_success) {
      std::fprintf(stderr, "gemm_ceiling: dnnl_sgemm failed\n");
      return 1;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) gflops.push_back(2.0 * n * n * n / s / 1e9);
  }
  std::sort(gflops.begin(), gflops.end());
  const dnnl_version_t* v = dnnl_version();
  std::printf("{\"gemm\": \"oneDNN %d.%d.%d dnnl_sgemm\", \"n\": %ld, \"threads\": %d, \"reps\": %d, "
              "\"gflops_best\": %.1f, \"gflops_median\": %.1f, \"checksum\": %.3g}\n",
              v->major, v->minor, v->patch, n, omp_get_max_threads(), reps, gflops.back(), gflops[gflops.size() / 2],
              static_cast<double>(c[n + 1]));
  return 0;
}
