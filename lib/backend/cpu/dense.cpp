// SPDX-License-Identifier: MIT
// Dense (fully connected) layer: x [N, Cin], w [Cout, Cin] (Keras kernel
// transposed, cuBLAS-friendly), y [N, Cout]. 16-bit as in conv.cpp.
#include <cstring>

#include "backend/cpu/ops.h"

namespace mpx::cpu {

namespace {

void dense_forward_loops(int64_t N, int64_t Ci, int64_t Co, const float* x, const float* w, const float* b,
                         float* y, Activation act) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Co; ++o) {
      const float* xi = x + n * Ci;
      const float* wo = w + o * Ci;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < Ci; ++i) acc += xi[i] * wo[i];
      acc += b ? b[o] : 0.0f;
      y[n * Co + o] = (act == Activation::Relu && acc < 0.0f) ? 0.0f : acc;
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

}  // namespace

void dense_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                   Activation act) {
  const int64_t N = x.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const float* xf = f32_in(ctx, kSlotX, x);
  const float* wf = f32_in(ctx, kSlotW, w);
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  float* yf = f32_out(ctx, kSlotY, y);
  dense_forward_loops(N, Ci, Co, xf, wf, bf, yf, act);
  f32_commit(yf, y);
}

void dense_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  const int64_t N = dx.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  const float* wf = f32_in(ctx, kSlotW, w);
  float* dxf = f32_out(ctx, kSlotDX, dx);
  dense_backward_data_loops(N, Ci, Co, dyf, wf, dxf);
  f32_commit(dxf, dx);
}

void dense_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db) {
  const int64_t N = x.shape[0], Co = dw.shape[0], Ci = dw.shape[1];
  const float* xf = f32_in(ctx, kSlotX, x);
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  dense_backward_weights_loops(N, Ci, Co, xf, dyf, dwf, dbf);
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
}

}  // namespace mpx::cpu
