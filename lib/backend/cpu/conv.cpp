// SPDX-License-Identifier: MIT
// Convolution forward / backward-data / backward-filter, NHWC with KRSC filters.
// 16-bit operands are widened into float32 scratch, the float32 kernel runs,
// and 16-bit outputs are rounded once from the float32 result.
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"

namespace mpx::cpu {

namespace {

struct Geo {
  int64_t N, H, W, C, K, R, S, P, Q;
  int sh, sw, pt, pl;
};

Geo geometry(const Conv2dParams& p, const Shape& x, const Shape& w) {
  Geo g{};
  g.N = x[0], g.H = x[1], g.W = x[2], g.C = x[3];
  g.K = w[0], g.R = w[1], g.S = w[2];
  g.P = p.out_h(static_cast<int>(g.H));
  g.Q = p.out_w(static_cast<int>(g.W));
  g.sh = p.stride_h, g.sw = p.stride_w, g.pt = p.pad_top, g.pl = p.pad_left;
  return g;
}

// ---- plain float32 loops ---------------------------------------------------------

// y[n,p,q,k] = act(b[k] + sum_{r,s,c} x[n, p*sh-pt+r, q*sw-pl+s, c] * w[k,r,s,c])
void conv_forward_loops(const Geo& g, const float* x, const float* w, const float* b, float* y, Activation act) {
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
              for (int64_t c = 0; c < g.C; ++c) acc += xi[c] * wk[c];
              yo[k] += acc;
            }
          }
        }
        if (act == Activation::Relu)
          for (int64_t k = 0; k < g.K; ++k) yo[k] = yo[k] < 0.0f ? 0.0f : yo[k];  // NaN stays NaN
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

}  // namespace

// ---- ops ---------------------------------------------------------------------------

void conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Tensor& y, Activation act) {
  const Geo g = geometry(p, x.shape, w.shape);
  const float* xf = f32_in(ctx, kSlotX, x);
  const float* wf = f32_in(ctx, kSlotW, w);
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  float* yf = f32_out(ctx, kSlotY, y);
  conv_forward_loops(g, xf, wf, bf, yf, act);
  f32_commit(yf, y);
}

void conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                          const Tensor& dx) {
  const Geo g = geometry(p, dx.shape, w.shape);
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  const float* wf = f32_in(ctx, kSlotW, w);
  float* dxf = f32_out(ctx, kSlotDX, dx);
  conv_backward_data_loops(g, dyf, wf, dxf);
  f32_commit(dxf, dx);
}

void conv2d_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                            const Tensor& dw, const Tensor& db) {
  const Geo g = geometry(p, x.shape, dw.shape);
  const float* xf = f32_in(ctx, kSlotX, x);
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  conv_backward_filter_loops(g, xf, dyf, dwf, dbf);
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
}

}  // namespace mpx::cpu
