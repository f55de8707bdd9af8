// SPDX-License-Identifier: MIT
// Batch normalization on mpx's row loops (bn_rows.h): the statistics, the running averages and
// the coefficients per channel around the four passes, for 16-bit tensors and for a batch norm
// with an activation fused after it (docs/cpu-performance.md, "Batch norm and the activation
// after it"). batch_norm.cpp routes its ops here (ops.h).
#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <memory>
#include <string>

#include "backend/cpu/dnnl_util.h"
#include "backend/cpu/norm/bn_rows.h"
#include "backend/cpu/ops.h"

namespace mpx::cpu {

namespace {

// Plan-key op ids are unique across the CPU backend (batch_norm.cpp has 501-503).
enum RowsOp : int64_t { kRowsFwdTraining = 504, kRowsFwdInference = 505, kRowsBwd = 506 };

/// Records the row loops in the kernels list, once per op, shape, dtype and activation.
void note_rows(Context& ctx, RowsOp op, const char* what, const Tensor& x, Activation act) {
  PlanKey k;
  k << op << x.shape << static_cast<int64_t>(x.dtype) << act_key(act);
  ctx.plan<Plan>(k, [&] {
    auto p = std::make_unique<Plan>();
    p->what = std::string(what) + " for x " + x.shape.str();
    p->impl = fmt::format("mpx:rows {}, {} in cache{}", bn_rows_isa(), dtype_name(x.dtype),
                          act.is_none() ? std::string() : fmt::format(", {} fused", activation_name(act.kind)));
    return p.release();
  });
}

BnRows rows_of(const Tensor& x, Activation act) {
  BnRows a;
  a.C = x.shape[x.shape.rank - 1];
  a.M = x.numel() / a.C;
  a.t = x.dtype;
  a.act = act;
  a.x = x.data;
  return a;
}

/// scale[c] = gamma[c] * invstd[c] from the float32 invstd that the backward pass reads too,
/// so that it recomputes the forward's normalized values bit for bit.
void rows_scale(const Tensor& gamma, const float* invstd, int64_t C, float* scale) {
  for (int64_t c = 0; c < C; ++c)
    scale[c] = static_cast<float>(static_cast<double>(gamma.as<const float>()[c]) * static_cast<double>(invstd[c]));
}

/// Room for `count` period arrays of floats (bn_rows_period) in slot kSlotTmp1.
float* period_arrays(Context& ctx, int64_t C, int count) {
  return ctx.scratch(kSlotTmp1, static_cast<size_t>(count * bn_rows_period(C)));
}

}  // namespace

void bn_forward_training_rows(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                              float momentum, float epsilon, const Tensor& running_mean, const Tensor& running_var,
                              const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& y, Activation act) {
  note_rows(ctx, kRowsFwdTraining, "batch normalization forward training", x, act);
  BnRows a = rows_of(x, act);
  const int64_t C = a.C, P = bn_rows_period(C);
  const int nt = omp_get_max_threads();
  double* part = ctx.scratch_f64(kSlotTmp0, static_cast<size_t>(nt * C + 3 * C));
  double* sum = part + nt * C;
  double* mean = sum + C;
  double* sq = mean + C;
  float* arrays = period_arrays(ctx, C, 3);
  float *mean_p = arrays, *scale_p = arrays + P, *beta_p = arrays + 2 * P;
  float* sm = saved_mean.as<float>();
  float* si = saved_invstd.as<float>();
  bn_rows_sum(a, nullptr, part, sum);
  for (int64_t c = 0; c < C; ++c) {
    mean[c] = sum[c] / static_cast<double>(a.M);
    sm[c] = static_cast<float>(mean[c]);
  }
  // Around the float32 mean m (no cancellation; x - m is exact where x is within 2x of m):
  // sum (x - mean)^2 = sum (x - m)^2 - M (mean - m)^2.
  bn_rows_tile(sm, C, mean_p);
  bn_rows_sum(a, mean_p, part, sq);
  const double unbias = bn_moving_variance_factor(x.shape.rank, a.M);
  for (int64_t c = 0; c < C; ++c) {
    const double delta = mean[c] - static_cast<double>(sm[c]);
    const double v = sq[c] / static_cast<double>(a.M) - delta * delta;
    const double var = v < 0.0 ? 0.0 : v;  // biased, as Keras normalizes; NaN stays NaN
    si[c] = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(epsilon)));
    float& rm = running_mean.as<float>()[c];
    float& rv = running_var.as<float>()[c];
    rm = momentum * rm + (1.0f - momentum) * sm[c];
    rv = momentum * rv + (1.0f - momentum) * static_cast<float>(var * unbias);
  }
  rows_scale(gamma, si, C, scale_p);  // the first C of the array, then repeated
  bn_rows_tile(scale_p, C, scale_p);
  bn_rows_tile(beta.as<const float>(), C, beta_p);
  a.mean = mean_p, a.scale = scale_p, a.beta = beta_p;
  a.out = y.data;
  bn_rows_apply(a);
}

void bn_forward_inference_rows(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var, float epsilon, const Tensor& y,
                               Activation act) {
  note_rows(ctx, kRowsFwdInference, "batch normalization inference", x, act);
  BnRows a = rows_of(x, act);
  const int64_t C = a.C, P = bn_rows_period(C);
  float* arrays = period_arrays(ctx, C, 3);
  float *mean_p = arrays, *scale_p = arrays + P, *beta_p = arrays + 2 * P;
  for (int64_t c = 0; c < C; ++c) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var.as<const float>()[c]) + epsilon);
    scale_p[c] = static_cast<float>(gamma.as<const float>()[c] * invstd);
  }
  bn_rows_tile(scale_p, C, scale_p);
  bn_rows_tile(running_mean.as<const float>(), C, mean_p);
  bn_rows_tile(beta.as<const float>(), C, beta_p);
  a.mean = mean_p, a.scale = scale_p, a.beta = beta_p;
  a.out = y.data;
  bn_rows_apply(a);
}

void bn_backward_rows(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& saved_mean,
                      const Tensor& saved_invstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                      const Tensor& beta, Activation act) {
  note_rows(ctx, kRowsBwd, "batch normalization backward", x, act);
  BnRows a = rows_of(x, act);
  const int64_t C = a.C, P = bn_rows_period(C);
  const float* invstd = saved_invstd.as<const float>();
  float* arrays = period_arrays(ctx, C, 7);
  float *mean_p = arrays, *invstd_p = arrays + P, *scale_p = arrays + 2 * P, *beta_p = arrays + 3 * P;
  float *k_p = arrays + 4 * P, *bm_p = arrays + 5 * P, *gm_p = arrays + 6 * P;
  bn_rows_tile(saved_mean.as<const float>(), C, mean_p);
  bn_rows_tile(invstd, C, invstd_p);
  a.dy = dy.data;
  a.out = dx.data;
  a.mean = mean_p, a.invstd = invstd_p;
  if (!act.is_none()) {
    rows_scale(gamma, invstd, C, scale_p);
    bn_rows_tile(scale_p, C, scale_p);
    bn_rows_tile(beta.as<const float>(), C, beta_p);
    a.scale = scale_p, a.beta = beta_p;
  }
  const int nt = omp_get_max_threads();
  double* part = ctx.scratch_f64(kSlotTmp0, static_cast<size_t>(nt * 2 * C + 2 * C));
  double* sdy = part + nt * 2 * C;
  double* sdyx = sdy + C;
  bn_rows_grad_sums(a, part, sdy, sdyx);
  // dx = k * (g - dbeta/M - (x - mean) * invstd * dgamma/M), k = gamma * invstd (as the plain loops).
  for (int64_t c = 0; c < C; ++c) {
    dbeta.as<float>()[c] = static_cast<float>(sdy[c]);
    dgamma.as<float>()[c] = static_cast<float>(sdyx[c]);
    const double is = invstd[c];
    k_p[c] = static_cast<float>(static_cast<double>(gamma.as<const float>()[c]) * is);
    bm_p[c] = static_cast<float>(sdy[c] / static_cast<double>(a.M));
    gm_p[c] = static_cast<float>(sdyx[c] / static_cast<double>(a.M) * is);
  }
  bn_rows_tile(k_p, C, k_p);
  bn_rows_tile(bm_p, C, bm_p);
  bn_rows_tile(gm_p, C, gm_p);
  a.coef_k = k_p, a.coef_b = bm_p, a.coef_g = gm_p;
  bn_rows_grad_apply(a);
}

}  // namespace mpx::cpu
