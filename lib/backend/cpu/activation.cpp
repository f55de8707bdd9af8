// SPDX-License-Identifier: MIT
// Elementwise ops: activation forward/backward (backward from the forward
// output y) and the residual add. relu keeps NaN as NaN so check_numerics sees it.
#include "backend/cpu/ops.h"

namespace mpx::cpu {

void activation_forward(Activation act, const Tensor& x, const Tensor& y) {
  if (act == Activation::None) {
    if (x.data != y.data) copy(y, x);
    return;
  }
  for_blocks(x.numel(), [&](int64_t off, int64_t n) {
    float bx[kBlock], by[kBlock];
    const float* xi = load_block(x, off, n, bx);
    float* yo = out_block(y, off, by);
    for (int64_t i = 0; i < n; ++i) yo[i] = xi[i] < 0.0f ? 0.0f : xi[i];
    store_block(yo, y, off, n);
  });
}

void activation_backward(Activation act, const Tensor& y, const Tensor& dy, const Tensor& dx) {
  if (act == Activation::None) {
    if (dx.data != dy.data) copy(dx, dy);
    return;
  }
  for_blocks(y.numel(), [&](int64_t off, int64_t n) {
    float by[kBlock], bdy[kBlock], bdx[kBlock];
    const float* yi = load_block(y, off, n, by);
    const float* dyi = load_block(dy, off, n, bdy);
    float* dxo = out_block(dx, off, bdx);
    for (int64_t i = 0; i < n; ++i) dxo[i] = yi[i] > 0.0f ? dyi[i] : 0.0f;
    store_block(dxo, dx, off, n);
  });
}

void add(const Tensor& a, const Tensor& b, const Tensor& y) {
  for_blocks(a.numel(), [&](int64_t off, int64_t n) {
    float ba[kBlock], bb[kBlock], bo[kBlock];
    const float* ai = load_block(a, off, n, ba);
    const float* bi = load_block(b, off, n, bb);
    float* yo = out_block(y, off, bo);
    for (int64_t i = 0; i < n; ++i) yo[i] = ai[i] + bi[i];
    store_block(yo, y, off, n);
  });
}

}  // namespace mpx::cpu
