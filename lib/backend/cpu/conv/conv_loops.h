// SPDX-License-Identifier: MIT
// Convolution geometry and the plain float32 loops of the CPU backend's convolutions
// (MPX_CPU_REFERENCE=1; conv.cpp runs oneDNN otherwise). NHWC activations, KRSC filters.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace mpx::cpu::conv_detail {

struct Geo {
  int64_t N, H, W, C, K, R, S, P, Q;
  int sh, sw, pt, pl;
};

inline Geo geometry(const Conv2dParams& p, const Shape& x, const Shape& w) {
  Geo g{};
  g.N = x[0], g.H = x[1], g.W = x[2], g.C = x[3];
  g.K = w[0], g.R = w[1], g.S = w[2];
  g.P = p.out_h(static_cast<int>(g.H));
  g.Q = p.out_w(static_cast<int>(g.W));
  g.sh = p.stride_h, g.sw = p.stride_w, g.pt = p.pad_top, g.pl = p.pad_left;
  return g;
}

/// The first layers' shapes that mpx's few-channel kernels take (conv_fwd_small.h,
/// conv_wgrad_small.h): stride 1, 1 to 4 input channels, 16, 32 or 64 filters, at most 64 taps.
inline bool few_channel_shape(const Geo& g) {
  return g.sh == 1 && g.sw == 1 && g.C >= 1 && g.C <= 4 && (g.K == 16 || g.K == 32 || g.K == 64) &&
         g.R * g.S * g.C <= 64 && g.P > 0 && g.Q > 0;
}

/// A few-channel weight gradient's float64 sums of `threads` threads, added in thread order:
/// dw[k * J + j] (KRSC, J = R*S*C taps) = sum over u of accd(u)[j * K + k], for the elements
/// [e0, e1) of dw; and, when db is not null, db[k] = sum over u of dbd(u)[k] for every k.
/// accd(u) and dbd(u) return thread u's sums ([J][K] and [K] doubles).
template <class Accd, class Dbd>
void add_thread_sums(int64_t J, int64_t K, int threads, Accd accd, Dbd dbd, int64_t e0, int64_t e1, float* dw,
                     float* db) {
  for (int64_t e = e0; e < e1; ++e) {
    const int64_t k = e / J, j = e % J;
    double sum = 0.0;
    for (int u = 0; u < threads; ++u) sum += accd(u)[j * K + k];
    dw[e] = static_cast<float>(sum);
  }
  if (db)
    for (int64_t k = 0; k < K; ++k) {
      double sum = 0.0;
      for (int u = 0; u < threads; ++u) sum += dbd(u)[k];
      db[k] = static_cast<float>(sum);
    }
}

void conv_forward_loops(const Geo& g, const float* x, const float* w, const float* b, float* y);
void conv_backward_data_loops(const Geo& g, const float* dy, const float* w, float* dx);
void conv_backward_filter_loops(const Geo& g, const float* x, const float* dy, float* dw, float* db);

}  // namespace mpx::cpu::conv_detail
