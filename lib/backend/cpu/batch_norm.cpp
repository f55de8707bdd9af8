// SPDX-License-Identifier: MIT
// Batch normalization over N,H,W per channel (NHWC: channels innermost).
// Statistics, gamma/beta and running statistics are float32 (sums accumulated
// in double per thread); x/y/dx/dy are in the compute dtype.
#include <omp.h>

#include <cmath>

#include "backend/cpu/ops.h"

namespace mpx::cpu {

namespace {

// Per-channel sums over rows of a [M, C] matrix, in double: out1 += f1(row), out2 += f2(row).
// Threads accumulate private partials in part (nt * 2C doubles) and reduce them.
template <typename F>
void channel_sums(int64_t M, int64_t C, double* part, double* out1, double* out2, F&& row_fn) {
  const int nt = omp_get_max_threads();
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    double* s1 = part + static_cast<int64_t>(t) * 2 * C;
    double* s2 = s1 + C;
    for (int64_t c = 0; c < 2 * C; ++c) s1[c] = 0.0;
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) row_fn(m, s1, s2);
  }
  for (int64_t c = 0; c < C; ++c) {
    double a = 0, b = 0;
    for (int t = 0; t < nt; ++t) {
      a += part[static_cast<int64_t>(t) * 2 * C + c];
      b += part[static_cast<int64_t>(t) * 2 * C + C + c];
    }
    out1[c] = a;
    out2[c] = b;
  }
}

// y = (x - mean[c]) * scale[c] + beta[c] in float32, rounded once into y's dtype
// (centered first: no cancellation when |mean| >> std).
void affine(Context& ctx, const float* xf, const float* mean, const float* scale, const float* beta, int64_t M,
            int64_t C, const Tensor& y) {
  float* yf = f32_out(ctx, kSlotY, y);
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const float* xi = xf + m * C;
    float* yo = yf + m * C;
    for (int64_t c = 0; c < C; ++c) yo[c] = (xi[c] - mean[c]) * scale[c] + beta[c];
  }
  f32_commit(yf, y);
}

}  // namespace

void batch_norm_forward_training(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 float momentum, float epsilon, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& saved_mean, const Tensor& saved_invstd,
                                 const Tensor& y) {
  const int64_t C = x.shape[x.shape.rank - 1], M = x.numel() / C;
  const float* xf = f32_in(ctx, kSlotX, x);
  const int nt = omp_get_max_threads();
  double* part = ctx.scratch_f64(kSlotTmp0, static_cast<size_t>(nt * 2 * C + 4 * C));
  double* sum = part + nt * 2 * C;
  double* sq = sum + C;
  double* mean = sq + C;
  double* unused = mean + C;
  channel_sums(M, C, part, sum, unused, [&](int64_t m, double* s1, double*) {
    const float* xi = xf + m * C;
    for (int64_t c = 0; c < C; ++c) s1[c] += xi[c];
  });
  for (int64_t c = 0; c < C; ++c) mean[c] = sum[c] / static_cast<double>(M);
  // Second pass around the mean (no cancellation).
  channel_sums(M, C, part, sq, unused, [&](int64_t m, double* s1, double*) {
    const float* xi = xf + m * C;
    for (int64_t c = 0; c < C; ++c) {
      const double d = xi[c] - mean[c];
      s1[c] += d * d;
    }
  });
  float* scale = ctx.scratch(kSlotTmp1, static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const double var = sq[c] / static_cast<double>(M);  // biased, as Keras normalizes
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(epsilon));
    saved_mean.as<float>()[c] = static_cast<float>(mean[c]);
    saved_invstd.as<float>()[c] = static_cast<float>(invstd);
    float& rm = running_mean.as<float>()[c];
    float& rv = running_var.as<float>()[c];
    rm = momentum * rm + (1.0f - momentum) * static_cast<float>(mean[c]);
    rv = momentum * rv + (1.0f - momentum) * static_cast<float>(var);
    scale[c] = static_cast<float>(gamma.as<const float>()[c] * invstd);
  }
  affine(ctx, xf, saved_mean.as<const float>(), scale, beta.as<const float>(), M, C, y);
}

void batch_norm_forward_inference(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, float epsilon,
                                  const Tensor& y) {
  const int64_t C = x.shape[x.shape.rank - 1], M = x.numel() / C;
  const float* xf = f32_in(ctx, kSlotX, x);
  float* scale = ctx.scratch(kSlotTmp1, static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var.as<const float>()[c]) + epsilon);
    scale[c] = static_cast<float>(gamma.as<const float>()[c] * invstd);
  }
  affine(ctx, xf, running_mean.as<const float>(), scale, beta.as<const float>(), M, C, y);
}

void batch_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                         const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx,
                         const Tensor& dgamma, const Tensor& dbeta) {
  const int64_t C = x.shape[x.shape.rank - 1], M = x.numel() / C;
  const float* xf = f32_in(ctx, kSlotX, x);
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  const float* mean = saved_mean.as<const float>();
  const float* invstd = saved_invstd.as<const float>();
  const int nt = omp_get_max_threads();
  double* part = ctx.scratch_f64(kSlotTmp0, static_cast<size_t>(nt * 2 * C + 2 * C));
  double* sdy = part + nt * 2 * C;
  double* sdyx = sdy + C;
  // dbeta = sum dy; dgamma = sum dy * xhat.
  channel_sums(M, C, part, sdy, sdyx, [&](int64_t m, double* s1, double* s2) {
    const float* xi = xf + m * C;
    const float* gi = dyf + m * C;
    for (int64_t c = 0; c < C; ++c) {
      s1[c] += gi[c];
      s2[c] += static_cast<double>(gi[c]) * ((xi[c] - mean[c]) * invstd[c]);
    }
  });
  // dx = k * (dy - dbeta/M - (x - mean) * invstd * dgamma/M), k = gamma * invstd.
  float* coef = ctx.scratch(kSlotTmp1, static_cast<size_t>(3 * C));
  for (int64_t c = 0; c < C; ++c) {
    dbeta.as<float>()[c] = static_cast<float>(sdy[c]);
    dgamma.as<float>()[c] = static_cast<float>(sdyx[c]);
    const double k = static_cast<double>(gamma.as<const float>()[c]) * invstd[c];
    const double gm = sdyx[c] / static_cast<double>(M);
    const double bm = sdy[c] / static_cast<double>(M);
    const double is = invstd[c];
    coef[c] = static_cast<float>(k);
    coef[C + c] = static_cast<float>(bm);
    coef[2 * C + c] = static_cast<float>(gm * is);
  }
  float* dxf = f32_out(ctx, kSlotDX, dx);
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const float* xi = xf + m * C;
    const float* gi = dyf + m * C;
    float* d = dxf + m * C;
    for (int64_t c = 0; c < C; ++c) d[c] = coef[c] * (gi[c] - coef[C + c] - (xi[c] - mean[c]) * coef[2 * C + c]);
  }
  f32_commit(dxf, dx);
}

}  // namespace mpx::cpu
