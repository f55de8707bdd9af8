// SPDX-License-Identifier: MIT
// Straightforward float64 reference implementations of the Backend ops, for the
// tests: obviously correct loops over NHWC tensors held as std::vector<double>
// (the values of the SAME 16-bit/32-bit inputs the backend sees, widened).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/backend.h"

namespace ref {

using Vec = std::vector<double>;
using mpx::Activation;
using mpx::Conv2dParams;
using mpx::PoolParams;

/// The activations as Keras writes them, in float64 (erf, tanh, exp from <cmath>).
inline double act_fn(Activation a, double v) {
  const double pi = 3.14159265358979323846;
  switch (a.kind) {
    case mpx::ActKind::None: return v;
    case mpx::ActKind::Relu: return v < 0 ? 0.0 : v;
    case mpx::ActKind::LeakyRelu: return v < 0 ? static_cast<double>(a.alpha) * v : v;
    case mpx::ActKind::Gelu: return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    case mpx::ActKind::GeluTanh: return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (v + 0.044715 * v * v * v)));
    case mpx::ActKind::Silu: return v / (1.0 + std::exp(-v));  // v * sigmoid(v)
    case mpx::ActKind::Scale: return static_cast<double>(a.alpha) * v;
  }
  return v;
}

/// d act / dv in float64 (relu and leaky_relu take the left derivative at 0, as TensorFlow does).
inline double act_grad(Activation a, double v) {
  const double pi = 3.14159265358979323846;
  switch (a.kind) {
    case mpx::ActKind::None: return 1.0;
    case mpx::ActKind::Relu: return v > 0 ? 1.0 : 0.0;
    case mpx::ActKind::LeakyRelu: return v > 0 ? 1.0 : static_cast<double>(a.alpha);
    case mpx::ActKind::Gelu:
      return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * pi);
    case mpx::ActKind::GeluTanh: {
      const double c = std::sqrt(2.0 / pi), u = c * (v + 0.044715 * v * v * v), t = std::tanh(u);
      return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * v * v);
    }
    case mpx::ActKind::Silu: {
      const double s = 1.0 / (1.0 + std::exp(-v));
      return s * (1.0 + v * (1.0 - s));
    }
    case mpx::ActKind::Scale: return static_cast<double>(a.alpha);
  }
  return 1.0;
}

// ---- convolution: x [N,H,W,C], w [K,R,S,C], y [N,P,Q,K] ----------------------------
struct ConvDims {
  int64_t N, H, W, C, K, R, S, P, Q;
};
inline ConvDims conv_dims(const Conv2dParams& p, int64_t N, int64_t H, int64_t W, int64_t C, int64_t K) {
  return {N, H, W, C, K, p.R, p.S, p.out_h(static_cast<int>(H)), p.out_w(static_cast<int>(W))};
}

inline Vec conv2d_forward(const Conv2dParams& p, const ConvDims& d, const Vec& x, const Vec& w, const Vec* b,
                          Activation act) {
  Vec y(static_cast<size_t>(d.N * d.P * d.Q * d.K));
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t oh = 0; oh < d.P; ++oh)
      for (int64_t ow = 0; ow < d.Q; ++ow)
        for (int64_t k = 0; k < d.K; ++k) {
          double acc = b ? (*b)[static_cast<size_t>(k)] : 0.0;
          for (int64_t r = 0; r < d.R; ++r)
            for (int64_t s = 0; s < d.S; ++s) {
              const int64_t ih = oh * p.stride_h - p.pad_top + r, iw = ow * p.stride_w - p.pad_left + s;
              if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W) continue;
              for (int64_t c = 0; c < d.C; ++c)
                acc += x[static_cast<size_t>(((n * d.H + ih) * d.W + iw) * d.C + c)] *
                       w[static_cast<size_t>(((k * d.R + r) * d.S + s) * d.C + c)];
            }
          y[static_cast<size_t>(((n * d.P + oh) * d.Q + ow) * d.K + k)] = act_fn(act, acc);
        }
  return y;
}

inline Vec conv2d_backward_data(const Conv2dParams& p, const ConvDims& d, const Vec& dy, const Vec& w) {
  Vec dx(static_cast<size_t>(d.N * d.H * d.W * d.C), 0.0);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t oh = 0; oh < d.P; ++oh)
      for (int64_t ow = 0; ow < d.Q; ++ow)
        for (int64_t k = 0; k < d.K; ++k)
          for (int64_t r = 0; r < d.R; ++r)
            for (int64_t s = 0; s < d.S; ++s) {
              const int64_t ih = oh * p.stride_h - p.pad_top + r, iw = ow * p.stride_w - p.pad_left + s;
              if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W) continue;
              for (int64_t c = 0; c < d.C; ++c)
                dx[static_cast<size_t>(((n * d.H + ih) * d.W + iw) * d.C + c)] +=
                    dy[static_cast<size_t>(((n * d.P + oh) * d.Q + ow) * d.K + k)] *
                    w[static_cast<size_t>(((k * d.R + r) * d.S + s) * d.C + c)];
            }
  return dx;
}

/// Returns dw [K,R,S,C]; db [K] into *db when given.
inline Vec conv2d_backward_filter(const Conv2dParams& p, const ConvDims& d, const Vec& x, const Vec& dy, Vec* db) {
  Vec dw(static_cast<size_t>(d.K * d.R * d.S * d.C), 0.0);
  if (db) db->assign(static_cast<size_t>(d.K), 0.0);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t oh = 0; oh < d.P; ++oh)
      for (int64_t ow = 0; ow < d.Q; ++ow)
        for (int64_t k = 0; k < d.K; ++k) {
          const double g = dy[static_cast<size_t>(((n * d.P + oh) * d.Q + ow) * d.K + k)];
          if (db) (*db)[static_cast<size_t>(k)] += g;
          for (int64_t r = 0; r < d.R; ++r)
            for (int64_t s = 0; s < d.S; ++s) {
              const int64_t ih = oh * p.stride_h - p.pad_top + r, iw = ow * p.stride_w - p.pad_left + s;
              if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W) continue;
              for (int64_t c = 0; c < d.C; ++c)
                dw[static_cast<size_t>(((k * d.R + r) * d.S + s) * d.C + c)] +=
                    g * x[static_cast<size_t>(((n * d.H + ih) * d.W + iw) * d.C + c)];
            }
        }
  return dw;
}

// ---- depthwise convolution: x [N,H,W,C], w [C*M,R,S,1], y [N,P,Q,C*M] ------------------
// Output channel k = c*M + m filters input channel c = k / M (d.K = C*M).

inline Vec depthwise_conv2d_forward(const Conv2dParams& p, const ConvDims& d, const Vec& x, const Vec& w,
                                    const Vec* b, Activation act) {
  const int64_t M = d.K / d.C;
  Vec y(static_cast<size_t>(d.N * d.P * d.Q * d.K));
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t oh = 0; oh < d.P; ++oh)
      for (int64_t ow = 0; ow < d.Q; ++ow)
        for (int64_t k = 0; k < d.K; ++k) {
          double acc = b ? (*b)[static_cast<size_t>(k)] : 0.0;
          for (int64_t r = 0; r < d.R; ++r)
            for (int64_t s = 0; s < d.S; ++s) {
              const int64_t ih = oh * p.stride_h - p.pad_top + r, iw = ow * p.stride_w - p.pad_left + s;
              if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W) continue;
              acc += x[static_cast<size_t>(((n * d.H + ih) * d.W + iw) * d.C + k / M)] *
                     w[static_cast<size_t>((k * d.R + r) * d.S + s)];
            }
          y[static_cast<size_t>(((n * d.P + oh) * d.Q + ow) * d.K + k)] = act_fn(act, acc);
        }
  return y;
}

inline Vec depthwise_conv2d_backward_data(const Conv2dParams& p, const ConvDims& d, const Vec& dy, const Vec& w) {
  const int64_t M = d.K / d.C;
  Vec dx(static_cast<size_t>(d.N * d.H * d.W * d.C), 0.0);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t oh = 0; oh < d.P; ++oh)
      for (int64_t ow = 0; ow < d.Q; ++ow)
        for (int64_t k = 0; k < d.K; ++k)
          for (int64_t r = 0; r < d.R; ++r)
            for (int64_t s = 0; s < d.S; ++s) {
              const int64_t ih = oh * p.stride_h - p.pad_top + r, iw = ow * p.stride_w - p.pad_left + s;
              if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W) continue;
              dx[static_cast<size_t>(((n * d.H + ih) * d.W + iw) * d.C + k / M)] +=
                  dy[static_cast<size_t>(((n * d.P + oh) * d.Q + ow) * d.K + k)] *
                  w[static_cast<size_t>((k * d.R + r) * d.S + s)];
            }
  return dx;
}

/// Returns dw [C*M,R,S,1]; db [C*M] into *db when given.
inline Vec depthwise_conv2d_backward_filter(const Conv2dParams& p, const ConvDims& d, const Vec& x, const Vec& dy,
                                            Vec* db) {
  const int64_t M = d.K / d.C;
  Vec dw(static_cast<size_t>(d.K * d.R * d.S), 0.0);
  if (db) db->assign(static_cast<size_t>(d.K), 0.0);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t oh = 0; oh < d.P; ++oh)
      for (int64_t ow = 0; ow < d.Q; ++ow)
        for (int64_t k = 0; k < d.K; ++k) {
          const double g = dy[static_cast<size_t>(((n * d.P + oh) * d.Q + ow) * d.K + k)];
          if (db) (*db)[static_cast<size_t>(k)] += g;
          for (int64_t r = 0; r < d.R; ++r)
            for (int64_t s = 0; s < d.S; ++s) {
              const int64_t ih = oh * p.stride_h - p.pad_top + r, iw = ow * p.stride_w - p.pad_left + s;
              if (ih < 0 || ih >= d.H || iw < 0 || iw >= d.W) continue;
              dw[static_cast<size_t>((k * d.R + r) * d.S + s)] +=
                  g * x[static_cast<size_t>(((n * d.H + ih) * d.W + iw) * d.C + k / M)];
            }
        }
  return dw;
}

// ---- dense: x [N,Ci], w [Co,Ci], y [N,Co] --------------------------------------------
inline Vec dense_forward(int64_t N, int64_t Ci, int64_t Co, const Vec& x, const Vec& w, const Vec* b,
                         Activation act) {
  Vec y(static_cast<size_t>(N * Co));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Co; ++o) {
      double acc = b ? (*b)[static_cast<size_t>(o)] : 0.0;
      for (int64_t i = 0; i < Ci; ++i) acc += x[static_cast<size_t>(n * Ci + i)] * w[static_cast<size_t>(o * Ci + i)];
      y[static_cast<size_t>(n * Co + o)] = act_fn(act, acc);
    }
  return y;
}
inline Vec dense_backward_data(int64_t N, int64_t Ci, int64_t Co, const Vec& dy, const Vec& w) {
  Vec dx(static_cast<size_t>(N * Ci), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Co; ++o)
      for (int64_t i = 0; i < Ci; ++i)
        dx[static_cast<size_t>(n * Ci + i)] += dy[static_cast<size_t>(n * Co + o)] * w[static_cast<size_t>(o * Ci + i)];
  return dx;
}
inline Vec dense_backward_weights(int64_t N, int64_t Ci, int64_t Co, const Vec& x, const Vec& dy, Vec* db) {
  Vec dw(static_cast<size_t>(Co * Ci), 0.0);
  if (db) db->assign(static_cast<size_t>(Co), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Co; ++o) {
      const double g = dy[static_cast<size_t>(n * Co + o)];
      if (db) (*db)[static_cast<size_t>(o)] += g;
      for (int64_t i = 0; i < Ci; ++i) dw[static_cast<size_t>(o * Ci + i)] += g * x[static_cast<size_t>(n * Ci + i)];
    }
  return dw;
}

// ---- pooling -------------------------------------------------------------------------
/// y; for max pooling also the flat index of the first maximum of each output in *arg.
inline Vec pool_forward(const PoolParams& p, int64_t N, int64_t H, int64_t W, int64_t C, const Vec& x,
                        std::vector<int64_t>* arg = nullptr) {
  const int64_t P = p.out_h(static_cast<int>(H)), Q = p.out_w(static_cast<int>(W));
  Vec y(static_cast<size_t>(N * P * Q * C));
  if (arg) arg->assign(y.size(), -1);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < P; ++oh)
      for (int64_t ow = 0; ow < Q; ++ow)
        for (int64_t c = 0; c < C; ++c) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          int64_t at = -1, count = 0;
          for (int64_t r = 0; r < p.R; ++r)
            for (int64_t s = 0; s < p.S; ++s) {
              const int64_t ih = oh * p.stride_h - p.pad_top + r, iw = ow * p.stride_w - p.pad_left + s;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              const int64_t i = ((n * H + ih) * W + iw) * C + c;
              const double v = x[static_cast<size_t>(i)];
              if (at < 0 || v > best) {
                best = v;
                at = i;
              }
              sum += v;
              ++count;
            }
          const size_t o = static_cast<size_t>(((n * P + oh) * Q + ow) * C + c);
          y[o] = p.kind == mpx::PoolKind::Max ? best : sum / static_cast<double>(count);
          if (arg) (*arg)[o] = at;
        }
  return y;
}

inline Vec pool_backward(const PoolParams& p, int64_t N, int64_t H, int64_t W, int64_t C, const Vec& x,
                         const Vec& dy) {
  const int64_t P = p.out_h(static_cast<int>(H)), Q = p.out_w(static_cast<int>(W));
  Vec dx(static_cast<size_t>(N * H * W * C), 0.0);
  std::vector<int64_t> arg;
  pool_forward(p, N, H, W, C, x, &arg);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < P; ++oh)
      for (int64_t ow = 0; ow < Q; ++ow)
        for (int64_t c = 0; c < C; ++c) {
          const size_t o = static_cast<size_t>(((n * P + oh) * Q + ow) * C + c);
          if (p.kind == mpx::PoolKind::Max) {
            dx[static_cast<size_t>(arg[o])] += dy[o];
            continue;
          }
          std::vector<int64_t> in;
          for (int64_t r = 0; r < p.R; ++r)
            for (int64_t s = 0; s < p.S; ++s) {
              const int64_t ih = oh * p.stride_h - p.pad_top + r, iw = ow * p.stride_w - p.pad_left + s;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              in.push_back(((n * H + ih) * W + iw) * C + c);
            }
          for (int64_t i : in) dx[static_cast<size_t>(i)] += dy[o] / static_cast<double>(in.size());
        }
  return dx;
}

inline Vec global_avg_pool_forward(int64_t N, int64_t HW, int64_t C, const Vec& x) {
  Vec y(static_cast<size_t>(N * C), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i)
      for (int64_t c = 0; c < C; ++c) y[static_cast<size_t>(n * C + c)] += x[static_cast<size_t>((n * HW + i) * C + c)] / static_cast<double>(HW);
  return y;
}
inline Vec global_avg_pool_backward(int64_t N, int64_t HW, int64_t C, const Vec& dy) {
  Vec dx(static_cast<size_t>(N * HW * C));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i)
      for (int64_t c = 0; c < C; ++c) dx[static_cast<size_t>((n * HW + i) * C + c)] = dy[static_cast<size_t>(n * C + c)] / static_cast<double>(HW);
  return dx;
}

// ---- batch normalization over rows of [M, C] -------------------------------------------
struct BnForward {
  Vec y, mean, invstd, var;
  Vec var_unbiased;  // sum (x - mean)^2 / (M - 1): what tf-keras 2's moving variance takes on 4-D input
};
inline BnForward batch_norm_forward_training(int64_t M, int64_t C, const Vec& x, const Vec& gamma, const Vec& beta,
                                             double eps) {
  BnForward r;
  r.mean.assign(static_cast<size_t>(C), 0.0);
  r.var.assign(static_cast<size_t>(C), 0.0);
  r.var_unbiased.assign(static_cast<size_t>(C), 0.0);
  r.invstd.resize(static_cast<size_t>(C));
  r.y.resize(x.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) r.mean[static_cast<size_t>(c)] += x[static_cast<size_t>(m * C + c)] / static_cast<double>(M);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const double d = x[static_cast<size_t>(m * C + c)] - r.mean[static_cast<size_t>(c)];
      r.var[static_cast<size_t>(c)] += d * d / static_cast<double>(M);
      r.var_unbiased[static_cast<size_t>(c)] += d * d / static_cast<double>(M > 1 ? M - 1 : 1);
    }
  for (int64_t c = 0; c < C; ++c) r.invstd[static_cast<size_t>(c)] = 1.0 / std::sqrt(r.var[static_cast<size_t>(c)] + eps);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(m * C + c), k = static_cast<size_t>(c);
      r.y[i] = (x[i] - r.mean[k]) * r.invstd[k] * gamma[k] + beta[k];
    }
  return r;
}
inline Vec batch_norm_forward_inference(int64_t M, int64_t C, const Vec& x, const Vec& gamma, const Vec& beta,
                                        const Vec& rmean, const Vec& rvar, double eps) {
  Vec y(x.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(m * C + c), k = static_cast<size_t>(c);
      y[i] = (x[i] - rmean[k]) / std::sqrt(rvar[k] + eps) * gamma[k] + beta[k];
    }
  return y;
}
struct BnBackward {
  Vec dx, dgamma, dbeta;
};
inline BnBackward batch_norm_backward(int64_t M, int64_t C, const Vec& x, const Vec& dy, const Vec& gamma,
                                      const Vec& mean, const Vec& invstd) {
  BnBackward r;
  r.dgamma.assign(static_cast<size_t>(C), 0.0);
  r.dbeta.assign(static_cast<size_t>(C), 0.0);
  r.dx.resize(x.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(m * C + c), k = static_cast<size_t>(c);
      r.dbeta[k] += dy[i];
      r.dgamma[k] += dy[i] * (x[i] - mean[k]) * invstd[k];
    }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(m * C + c), k = static_cast<size_t>(c);
      const double xhat = (x[i] - mean[k]) * invstd[k];
      r.dx[i] = gamma[k] * invstd[k] / static_cast<double>(M) *
                (static_cast<double>(M) * dy[i] - r.dbeta[k] - xhat * r.dgamma[k]);
    }
  return r;
}

// ---- softmax cross-entropy -------------------------------------------------------------
struct SoftmaxCe {
  double loss_sum = 0, correct = 0;
  Vec dlogits;
};
inline SoftmaxCe softmax_cross_entropy(int64_t N, int64_t K, const Vec& z, const std::vector<int32_t>& labels,
                                       double grad_scale) {
  SoftmaxCe r;
  r.dlogits.resize(z.size());
  for (int64_t n = 0; n < N; ++n) {
    double m = -std::numeric_limits<double>::infinity();
    int64_t arg = 0;
    for (int64_t k = 0; k < K; ++k)
      if (z[static_cast<size_t>(n * K + k)] > m) {
        m = z[static_cast<size_t>(n * K + k)];
        arg = k;
      }
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += std::exp(z[static_cast<size_t>(n * K + k)] - m);
    const int32_t y = labels[static_cast<size_t>(n)];
    r.loss_sum += m + std::log(s) - z[static_cast<size_t>(n * K + y)];
    r.correct += arg == y ? 1 : 0;
    for (int64_t k = 0; k < K; ++k)
      r.dlogits[static_cast<size_t>(n * K + k)] =
          grad_scale * (std::exp(z[static_cast<size_t>(n * K + k)] - m) / s - (k == y ? 1.0 : 0.0)) / static_cast<double>(N);
  }
  return r;
}

}  // namespace ref
