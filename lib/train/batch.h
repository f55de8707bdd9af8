// SPDX-License-Identifier: MIT
// The input, label, loss and logit-gradient buffers of one batch, planned once
// on the backend (no allocation in the step loop).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace mpx {

struct BatchBuffers {
  Buffer x, y, scalars, dlogits;
  int64_t max_batch = 0;
  int H = 0, W = 0, C = 0, K = 0;

  BatchBuffers(Backend& be, int64_t B, int H_, int W_, int C_, int K_) : max_batch(B), H(H_), W(W_), C(C_), K(K_) {
    x = be.alloc(static_cast<size_t>(B * H * W * C), "input batch");
    y = be.alloc(static_cast<size_t>(B) * 4, "labels");
    scalars = be.alloc(64, "loss and accuracy");
    dlogits = be.alloc(static_cast<size_t>(B * K) * 4, "logit gradients");
  }
  Tensor images(int64_t n) const { return x.view(DType::U8, Shape{n, H, W, C}); }
  Tensor labels(int64_t n) const { return y.view(DType::I32, Shape{n}); }
  Tensor loss() const { return Tensor(scalars.data(), DType::F32, Shape{1}); }
  Tensor correct() const { return Tensor(static_cast<char*>(scalars.data()) + 4, DType::F32, Shape{1}); }
  Tensor dl(int64_t n) const { return dlogits.view(DType::F32, Shape{n, K}); }
};

}  // namespace mpx
