// SPDX-License-Identifier: MIT
// A convolution test case of the CPU kernels' tests (shape, filter, Keras-style padding that
// may differ before and after), the kernels' geometry of it, and random values of a dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/conv_loops.h"
#include "core/half.h"
#include "core/rng.h"
#include "support/reference.h"

namespace support {

struct ConvCase {
  const char* name;
  int64_t N, H, W, C, K;
  int R, S, pt, pl, pb, pr;

  mpx::Conv2dParams params() const {
    mpx::Conv2dParams p;
    p.R = R, p.S = S, p.pad_top = pt, p.pad_left = pl, p.pad_bottom = pb, p.pad_right = pr;
    return p;
  }
};

/// The CPU kernels' geometry of a stride-1 case with output dims d.
inline mpx::cpu::conv_detail::Geo stride1_geo(const ConvCase& c, const ref::ConvDims& d) {
  mpx::cpu::conv_detail::Geo g{};
  g.N = c.N, g.H = c.H, g.W = c.W, g.C = c.C, g.K = c.K, g.R = c.R, g.S = c.S, g.P = d.P, g.Q = d.Q;
  g.sh = g.sw = 1, g.pt = c.pt, g.pl = c.pl;
  return g;
}

/// n values uniform in [-1, 1), each a value of dtype t.
inline std::vector<float> uniform_values(mpx::Rng& rng, int64_t n, mpx::DType t = mpx::DType::F32) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = mpx::round_to(t, static_cast<float>(rng.uniform() * 2.0 - 1.0));
  return v;
}

}  // namespace support
