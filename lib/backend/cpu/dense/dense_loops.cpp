// SPDX-License-Identifier: MIT
// The dense layers' plain loops (dense_loops.h): the reference that MPX_CPU_REFERENCE=1 runs.
#include "backend/cpu/dense/dense_loops.h"

#include <cstring>

namespace mpx::cpu::dense_detail {

// y = x w^T + b (the activation follows in activation_epilogue).
void dense_forward_loops(int64_t N, int64_t Ci, int64_t Co, const float* x, const float* w, const float* b,
                         float* y) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Co; ++o) {
      const float* xi = x + n * Ci;
      const float* wo = w + o * Ci;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < Ci; ++i) acc += xi[i] * wo[i];
      acc += b ? b[o] : 0.0f;
      y[n * Co + o] = acc;
    }
}

void dense_backward_data_loops(int64_t N, int64_t Ci, int64_t Co, const float* dy, const float* w, float* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* d = dx + n * Ci;
    std::memset(d, 0, sizeof(float) * static_cast<size_t>(Ci));
    for (int64_t o = 0; o < Co; ++o) {
      const float g = dy[n * Co + o];
      const float* wo = w + o * Ci;
      for (int64_t i = 0; i < Ci; ++i) d[i] += g * wo[i];
    }
  }
}

void dense_backward_weights_loops(int64_t N, int64_t Ci, int64_t Co, const float* x, const float* dy, float* dw,
                                  float* db) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < Co; ++o) {
    float* d = dw + o * Ci;
    std::memset(d, 0, sizeof(float) * static_cast<size_t>(Ci));
    float bsum = 0.0f;
    for (int64_t n = 0; n < N; ++n) {
      const float g = dy[n * Co + o];
      bsum += g;
      const float* xi = x + n * Ci;
      for (int64_t i = 0; i < Ci; ++i) d[i] += g * xi[i];
    }
    if (db) db[o] = bsum;
  }
}

}  // namespace mpx::cpu::dense_detail
