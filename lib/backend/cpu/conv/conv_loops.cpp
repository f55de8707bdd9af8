// SPDX-License-Identifier: MIT
// The plain float32 loops of the CPU backend's convolutions (conv_loops.h).
#include "backend/cpu/conv/conv_loops.h"

#include <cstring>

namespace mpx::cpu::conv_detail {

// ---- plain float32 loops ---------------------------------------------------------

// y[n,p,q,k] = b[k] + sum_{r,s,c} x[n, p*sh-pt+r, q*sw-pl+s, c] * w[k,r,s,c] (the activation
// follows in activation_epilogue)
void conv_forward_loops(const Geo& g, const float* x, const float* w, const float* b, float* y) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t p = 0; p < g.P; ++p)
      for (int64_t q = 0; q < g.Q; ++q) {
        float* yo = y + ((n * g.P + p) * g.Q + q) * g.K;
        for (int64_t k = 0; k < g.K; ++k) yo[k] = b ? b[k] : 0.0f;
        for (int64_t r = 0; r < g.R; ++r) {
          const int64_t ih = p * g.sh - g.pt + r;
          if (ih < 0 || ih >= g.H) continue;
          for (int64_t s = 0; s < g.S; ++s) {
            const int64_t iw = q * g.sw - g.pl + s;
            if (iw < 0 || iw >= g.W) continue;
            const float* xi = x + ((n * g.H + ih) * g.W + iw) * g.C;
            for (int64_t k = 0; k < g.K; ++k) {
              const float* wk = w + ((k * g.R + r) * g.S + s) * g.C;
              float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
              for (int64_t c = 0; c < g.C; ++c) acc += xi[c] * wk[c];
              yo[k] += acc;
            }
          }
        }
      }
}

// dx[n,h,w,c] = sum over (p,q,r,s) that read (h,w) of dy[n,p,q,k] * w[k,r,s,c]
void conv_backward_data_loops(const Geo& g, const float* dy, const float* w, float* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < g.N; ++n) {
    std::memset(dx + n * g.H * g.W * g.C, 0, sizeof(float) * static_cast<size_t>(g.H * g.W * g.C));
    for (int64_t p = 0; p < g.P; ++p)
      for (int64_t q = 0; q < g.Q; ++q) {
        const float* dyo = dy + ((n * g.P + p) * g.Q + q) * g.K;
        for (int64_t r = 0; r < g.R; ++r) {
          const int64_t ih = p * g.sh - g.pt + r;
          if (ih < 0 || ih >= g.H) continue;
          for (int64_t s = 0; s < g.S; ++s) {
            const int64_t iw = q * g.sw - g.pl + s;
            if (iw < 0 || iw >= g.W) continue;
            float* dxi = dx + ((n * g.H + ih) * g.W + iw) * g.C;
            for (int64_t k = 0; k < g.K; ++k) {
              const float gk = dyo[k];
              const float* wk = w + ((k * g.R + r) * g.S + s) * g.C;
              for (int64_t c = 0; c < g.C; ++c) dxi[c] += gk * wk[c];
            }
          }
        }
      }
  }
}

// dw[k,r,s,c] = sum_{n,p,q} dy[n,p,q,k] * x[n, p*sh-pt+r, q*sw-pl+s, c]; db[k] = sum dy[...,k]
void conv_backward_filter_loops(const Geo& g, const float* x, const float* dy, float* dw, float* db) {
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t k = 0; k < g.K; ++k) {
    float* dwk = dw + k * g.R * g.S * g.C;
    std::memset(dwk, 0, sizeof(float) * static_cast<size_t>(g.R * g.S * g.C));
    float bsum = 0.0f;
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t p = 0; p < g.P; ++p)
        for (int64_t q = 0; q < g.Q; ++q) {
          const float gk = dy[((n * g.P + p) * g.Q + q) * g.K + k];
          bsum += gk;
          for (int64_t r = 0; r < g.R; ++r) {
            const int64_t ih = p * g.sh - g.pt + r;
            if (ih < 0 || ih >= g.H) continue;
            for (int64_t s = 0; s < g.S; ++s) {
              const int64_t iw = q * g.sw - g.pl + s;
              if (iw < 0 || iw >= g.W) continue;
              const float* xi = x + ((n * g.H + ih) * g.W + iw) * g.C;
              float* d = dwk + (r * g.S + s) * g.C;
              for (int64_t c = 0; c < g.C; ++c) d[c] += gk * xi[c];
            }
          }
        }
    if (db) db[k] = bsum;
  }
}

}  // namespace mpx::cpu::conv_detail
