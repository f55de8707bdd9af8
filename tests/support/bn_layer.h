// SPDX-License-Identifier: MIT
// One batch-norm layer's tensors on the CPU backend, random and rounded to the layer's dtype,
// for the batch-norm tests (test_backend_bn, test_backend_bn_act).
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "support/backend_check.h"

namespace support {

/// One batch-norm layer's tensors.
struct BnLayer {
  mpx::Shape s;
  int64_t C = 0, M = 0;
  mpx::DType t = mpx::DType::F32;
  std::vector<float> xv, gv, bv, rmv, rvv, dyv;
  mpx::Tensor x, gamma, beta, rm, rv, sm, si, y, dy, dx, dg, db;
};

/// x uniform in [x_lo, x_hi) + x_offset; gamma in [0.5, 1.5), the moving variance in [0.5, 2).
inline BnLayer make_layer(CpuDev& d, mpx::Rng& rng, mpx::DType t, mpx::Shape s, double x_lo, double x_hi,
                          double x_offset = 0) {
  BnLayer l;
  l.s = s;
  l.t = t;
  l.C = s[s.rank - 1];
  l.M = s.numel() / l.C;
  l.x = d.rand_plain(rng, t, s, &l.xv, x_lo, x_hi, x_offset);
  l.gamma = d.rand_plain(rng, mpx::DType::F32, mpx::Shape{l.C}, &l.gv, 0.5, 1.5);
  l.beta = d.rand_plain(rng, mpx::DType::F32, mpx::Shape{l.C}, &l.bv);
  l.rm = d.rand_plain(rng, mpx::DType::F32, mpx::Shape{l.C}, &l.rmv);
  l.rv = d.rand_plain(rng, mpx::DType::F32, mpx::Shape{l.C}, &l.rvv, 0.5, 2.0);
  l.sm = d.make(mpx::DType::F32, mpx::Shape{l.C});
  l.si = d.make(mpx::DType::F32, mpx::Shape{l.C});
  l.y = d.make(t, s);
  l.dy = d.rand_plain(rng, t, s, &l.dyv);
  l.dx = d.make(t, s);
  l.dg = d.make(mpx::DType::F32, mpx::Shape{l.C});
  l.db = d.make(mpx::DType::F32, mpx::Shape{l.C});
  return l;
}

}  // namespace support
