// SPDX-License-Identifier: MIT
// The shape cuDNN sees for one convolution, in plain C++ (no CUDA headers) so the CPU
// tests check it (docs/gpu.md, "Convolutions with few channels"):
//  - asymmetric padding (Keras "same" with an even kernel or a stride > 1): cuDNN gets the
//    smaller pad of each dimension and the input is padded explicitly by the difference;
//  - 16-bit operands with a channel count that is not a multiple of 8 (the 1 or 3 channels
//    of an MNIST or CIFAR image): input and filter are zero-padded to the next multiple of
//    8 channels, since cuDNN may have no 16-bit NHWC algorithm for them. The zero channels
//    add nothing to the output; their filter gradient is cropped away before the optimizer.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/backend.h"

namespace mpx::cuda {

/// Channels cuDNN sees for C input channels of dtype t.
inline int64_t conv_channels(DType t, int64_t C) {
  if (t == DType::F32 || C % 8 == 0) return C;
  return (C + 7) / 8 * 8;
}

struct ConvGeo {
  int64_t N, H, W, C, K, R, S, P, Q;
  int sh, sw;
  int ph, pw;       // symmetric pads given to cuDNN
  int top, left;    // where x sits inside the explicitly padded input
  int64_t Hp, Wp;   // input extent cuDNN sees
  int64_t Cp;       // channels cuDNN sees (conv_channels)
  bool padded;      // the input is copied into a padded buffer (spatially or in channels)
  bool channels_padded() const { return Cp != C; }
};

/// x: [N, H, W, C], w: [K, R, S, C], operands of dtype t.
inline ConvGeo conv_geometry(const Conv2dParams& p, const Shape& x, const Shape& w, DType t) {
  ConvGeo g{};
  g.N = x[0], g.H = x[1], g.W = x[2], g.C = x[3];
  g.K = w[0], g.R = w[1], g.S = w[2];
  g.P = p.out_h(static_cast<int>(g.H));
  g.Q = p.out_w(static_cast<int>(g.W));
  g.sh = p.stride_h, g.sw = p.stride_w;
  g.ph = std::min(p.pad_top, p.pad_bottom);
  g.pw = std::min(p.pad_left, p.pad_right);
  g.top = p.pad_top - g.ph;
  g.left = p.pad_left - g.pw;
  g.Hp = g.H + (p.pad_top - g.ph) + (p.pad_bottom - g.ph);
  g.Wp = g.W + (p.pad_left - g.pw) + (p.pad_right - g.pw);
  g.Cp = conv_channels(t, g.C);
  g.padded = g.Hp != g.H || g.Wp != g.W || g.Cp != g.C;
  return g;
}

}  // namespace mpx::cuda
