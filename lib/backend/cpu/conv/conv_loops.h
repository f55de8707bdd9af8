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

void conv_forward_loops(const Geo& g, const float* x, const float* w, const float* b, float* y);
void conv_backward_data_loops(const Geo& g, const float* dy, const float* w, float* dx);
void conv_backward_filter_loops(const Geo& g, const float* x, const float* dy, float* dw, float* db);

}  // namespace mpx::cpu::conv_detail
