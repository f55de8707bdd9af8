// SPDX-License-Identifier: MIT
// Batch normalization over N,H,W per channel (NHWC: channels innermost).
// Statistics, gamma/beta and running statistics are float32; x/y/dx/dy are in the
// compute dtype. Both normalize with the biased batch variance; the moving variance
// takes it times bn_moving_variance_factor() (backend.h: unbiased on [N,H,W,C] input, as
// tf-keras 2). The math runs in oneDNN's batch_normalization primitives (float32;
// 16-bit tensors go through float32 scratch and are rounded once on the way out),
// one cached plan per shape (and epsilon). The plain loops below (sums accumulated in
// double per thread) run under MPX_CPU_REFERENCE=1, and for the shapes where oneDNN has
// no JIT kernel (on AVX2: C not a multiple of 4), where they are 3-4x faster than its
// plain C++ one. oneDNN sums in float32: at training sizes (2^18 rows per channel) the
// statistics and gradients are ~1e-5 off the float64 reference where the loops are
// ~1e-7 off (bench/batch_norm_bench precision). 16-bit tensors, and every batch norm with an
// activation fused after it, run mpx's row loops instead (batch_norm_rows.cpp): they read and
// write the tensor's own dtype in cache, with no float32 copy, and sum in double like the
// plain loops.
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backend/cpu/dnnl_util.h"
#include "backend/cpu/ops.h"

namespace mpx::cpu {

namespace {

// ---- plain loops (MPX_CPU_REFERENCE=1; shapes without a oneDNN JIT kernel) -------------

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

void bn_forward_training_loops(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
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
  const double unbias = bn_moving_variance_factor(x.shape.rank, M);
  for (int64_t c = 0; c < C; ++c) {
    const double var = sq[c] / static_cast<double>(M);  // biased: Keras normalizes with it
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(epsilon));
    saved_mean.as<float>()[c] = static_cast<float>(mean[c]);
    saved_invstd.as<float>()[c] = static_cast<float>(invstd);
    float& rm = running_mean.as<float>()[c];
    float& rv = running_var.as<float>()[c];
    rm = momentum * rm + (1.0f - momentum) * static_cast<float>(mean[c]);
    rv = momentum * rv + (1.0f - momentum) * static_cast<float>(var * unbias);
    scale[c] = static_cast<float>(gamma.as<const float>()[c] * invstd);
  }
  affine(ctx, xf, saved_mean.as<const float>(), scale, beta.as<const float>(), M, C, y);
}

void bn_forward_inference_loops(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
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

void bn_backward_loops(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma,
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

// ---- oneDNN primitives -----------------------------------------------------------------
// Forward training writes the batch mean into saved_mean and the (biased) batch
// variance into saved_invstd, which is then turned into 1/sqrt(var + eps) in place while
// the running statistics are updated. The backward primitive wants mean and variance:
// it gets var' = 1/invstd^2 with epsilon 0 in its descriptor, so that it normalizes by
// exactly 1/sqrt(var') = invstd without knowing the forward epsilon, and without a
// cancellation when epsilon >> var (var' is var + eps, never var alone).

// Plan-key op ids are unique across the CPU backend (dense.cpp has 201-203).
enum BnOp : int64_t { kBnFwdTraining = 501, kBnFwdInference = 502, kBnBwd = 503 };

const dnnl::normalization_flags kScaleShift =
    dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;

// x [N,H,W,C] as oneDNN {N,C,H,W} in nhwc; x [M,C] as {M,C,1,1} in nhwc, the same bytes:
// with the 2-D "nc" layout oneDNN 2.6 only has its plain ncsp kernel (20-30x slower).
dnnl::memory::desc bn_data_md(const Shape& s) {
  if (s.rank == 4) return dnnl::memory::desc({s[0], s[3], s[1], s[2]}, dt::f32, tag::nhwc);
  const int64_t C = s[s.rank - 1];
  return dnnl::memory::desc({s.numel() / C, C, 1, 1}, dt::f32, tag::nhwc);
}

// A batch-norm plan; `onednn` is false where oneDNN has no JIT kernel for the shape
// (on AVX2: C not a multiple of 4, where its plain C++ nspc kernel measured 2-4x slower
// than our loops): then the op runs our loops for that shape.
struct BnPlan : DnnlPlan {
  bool onednn = true;
};
template <typename PD>
bool has_jit_kernel(const PD& pd) {
  return std::string(pd.impl_info_str()).find("jit") != std::string::npos;
}

PlanKey bn_key(BnOp op, const Shape& s, float epsilon) {
  uint32_t eps_bits = 0;
  std::memcpy(&eps_bits, &epsilon, sizeof eps_bits);
  PlanKey k;
  k << op << s << static_cast<int64_t>(eps_bits);
  return k;
}

std::string bn_what(const char* op, const Shape& s) { return std::string(op) + " for x " + s.str(); }

/// Whether the op runs on mpx's row loops (batch_norm_rows.cpp): a 16-bit tensor or an
/// activation fused after it.
bool on_rows(const Tensor& x, Activation act) { return is_16bit(x.dtype) || !act.is_none(); }

BnPlan& bn_forward_plan(Context& ctx, const Shape& s, float epsilon, bool training) {
  return ctx.plan<BnPlan>(bn_key(training ? kBnFwdTraining : kBnFwdInference, s, epsilon), [&] {
    return dnnl_try(bn_what(training ? "batch normalization forward training" : "batch normalization inference", s),
                    [&] {
                      auto plan = std::make_unique<BnPlan>();
                      const dnnl::memory::desc md = bn_data_md(s);
                      const auto pd = dnnlc::bn_fwd(
                          ctx.engine(), training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference,
                          md, epsilon, training ? kScaleShift : kScaleShift | dnnl::normalization_flags::use_global_stats,
                          make_attr());
                      plan->onednn = has_jit_kernel(pd);
                      if (!plan->onednn) return plan.release();
                      plan->prim = dnnl::batch_normalization_forward(pd);
                      const dnnl::engine& eng = ctx.engine();
                      plan->args[DNNL_ARG_SRC] = unbound(pd.src_desc(), eng);
                      plan->args[DNNL_ARG_DST] = unbound(pd.dst_desc(), eng);
                      plan->args[DNNL_ARG_SCALE] = unbound(pd.weights_desc(), eng);
                      plan->args[DNNL_ARG_SHIFT] = unbound(pd.weights_desc(), eng);
                      plan->args[DNNL_ARG_MEAN] = unbound(pd.mean_desc(), eng);
                      plan->args[DNNL_ARG_VARIANCE] = unbound(pd.variance_desc(), eng);
                      plan->set_scratchpad(ctx, pd);
                      return plan.release();
                    });
  });
}

BnPlan& bn_backward_plan(Context& ctx, const Shape& s) {
  return ctx.plan<BnPlan>(bn_key(kBnBwd, s, 0.0f), [&] {
    return dnnl_try(bn_what("batch normalization backward", s), [&] {
      auto plan = std::make_unique<BnPlan>();
      const dnnl::memory::desc md = bn_data_md(s);
      const auto hint =
          dnnlc::bn_fwd(ctx.engine(), dnnl::prop_kind::forward_training, md, 0.0f, kScaleShift, dnnl::primitive_attr());
      const auto pd = dnnlc::bn_bwd(ctx.engine(), md, 0.0f, kScaleShift, hint, make_attr());
      plan->onednn = has_jit_kernel(pd);
      if (!plan->onednn) return plan.release();
      plan->prim = dnnl::batch_normalization_backward(pd);
      const dnnl::engine& eng = ctx.engine();
      plan->args[DNNL_ARG_SRC] = unbound(pd.src_desc(), eng);
      plan->args[DNNL_ARG_DIFF_DST] = unbound(pd.diff_dst_desc(), eng);
      plan->args[DNNL_ARG_SCALE] = unbound(pd.weights_desc(), eng);
      // oneDNN 2.6 refuses to execute without a shift argument (use_shift), though the
      // backward math never reads it; oneDNN 3.x refuses to execute with one.
      if (!dnnlc::kV3) plan->args[DNNL_ARG_SHIFT] = unbound(pd.weights_desc(), eng);
      plan->args[DNNL_ARG_MEAN] = unbound(pd.mean_desc(), eng);
      plan->args[DNNL_ARG_VARIANCE] = unbound(pd.variance_desc(), eng);
      plan->args[DNNL_ARG_DIFF_SRC] = unbound(pd.diff_src_desc(), eng);
      plan->args[DNNL_ARG_DIFF_SCALE] = unbound(pd.diff_weights_desc(), eng);
      plan->args[DNNL_ARG_DIFF_SHIFT] = unbound(pd.diff_weights_desc(), eng);
      plan->set_scratchpad(ctx, pd);
      return plan.release();
    });
  });
}

}  // namespace

void batch_norm_forward_training(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 float momentum, float epsilon, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& saved_mean, const Tensor& saved_invstd,
                                 const Tensor& y, Activation act) {
  if (on_rows(x, act)) {
    bn_forward_training_rows(ctx, x, gamma, beta, momentum, epsilon, running_mean, running_var, saved_mean,
                             saved_invstd, y, act);
    return;
  }
  BnPlan* plan = reference_loops() ? nullptr : &bn_forward_plan(ctx, x.shape, epsilon, true);
  if (!plan || !plan->onednn) {
    bn_forward_training_loops(ctx, x, gamma, beta, momentum, epsilon, running_mean, running_var, saved_mean,
                              saved_invstd, y);
    return;
  }
  const int64_t C = x.shape[x.shape.rank - 1];
  const float* xf = f32_in(ctx, kSlotX, x);
  float* yf = f32_out(ctx, kSlotY, y);
  float* mean = saved_mean.as<float>();
  float* var = saved_invstd.as<float>();  // the batch variance, turned into invstd below
  plan->bind(DNNL_ARG_SRC, xf);
  plan->bind(DNNL_ARG_DST, yf);
  plan->bind(DNNL_ARG_SCALE, gamma.data);
  plan->bind(DNNL_ARG_SHIFT, beta.data);
  plan->bind(DNNL_ARG_MEAN, mean);
  plan->bind(DNNL_ARG_VARIANCE, var);
  plan->run(ctx);
  f32_commit(yf, y);
  float* rm = running_mean.as<float>();
  float* rv = running_var.as<float>();
  const double unbias = bn_moving_variance_factor(x.shape.rank, x.numel() / C);
  for (int64_t c = 0; c < C; ++c) {
    const float v = var[c];  // biased: Keras normalizes with it; the moving variance is unbiased on 4-D input
    rm[c] = momentum * rm[c] + (1.0f - momentum) * mean[c];
    rv[c] = momentum * rv[c] + (1.0f - momentum) * static_cast<float>(static_cast<double>(v) * unbias);
    var[c] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(v) + static_cast<double>(epsilon)));
  }
}

void batch_norm_forward_inference(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, float epsilon,
                                  const Tensor& y, Activation act) {
  if (on_rows(x, act)) {
    bn_forward_inference_rows(ctx, x, gamma, beta, running_mean, running_var, epsilon, y, act);
    return;
  }
  BnPlan* plan = reference_loops() ? nullptr : &bn_forward_plan(ctx, x.shape, epsilon, false);
  if (!plan || !plan->onednn) {
    bn_forward_inference_loops(ctx, x, gamma, beta, running_mean, running_var, epsilon, y);
    return;
  }
  const float* xf = f32_in(ctx, kSlotX, x);
  float* yf = f32_out(ctx, kSlotY, y);
  plan->bind(DNNL_ARG_SRC, xf);
  plan->bind(DNNL_ARG_DST, yf);
  plan->bind(DNNL_ARG_SCALE, gamma.data);
  plan->bind(DNNL_ARG_SHIFT, beta.data);
  plan->bind(DNNL_ARG_MEAN, running_mean.data);
  plan->bind(DNNL_ARG_VARIANCE, running_var.data);
  plan->run(ctx);
  f32_commit(yf, y);
}

void batch_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                         const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx,
                         const Tensor& dgamma, const Tensor& dbeta, const Tensor& beta, Activation act) {
  if (on_rows(x, act)) {
    bn_backward_rows(ctx, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta, beta, act);
    return;
  }
  BnPlan* plan = reference_loops() ? nullptr : &bn_backward_plan(ctx, x.shape);
  if (!plan || !plan->onednn) {
    bn_backward_loops(ctx, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
    return;
  }
  const int64_t C = x.shape[x.shape.rank - 1];
  const float* xf = f32_in(ctx, kSlotX, x);
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  float* dxf = f32_out(ctx, kSlotDX, dx);
  const float* invstd = saved_invstd.as<const float>();
  float* var = ctx.scratch(kSlotTmp0, static_cast<size_t>(C));  // var + eps of the forward pass
  for (int64_t c = 0; c < C; ++c) {
    const double is = invstd[c];
    var[c] = static_cast<float>(1.0 / (is * is));
  }
  plan->bind(DNNL_ARG_SRC, xf);
  plan->bind(DNNL_ARG_DIFF_DST, dyf);
  plan->bind(DNNL_ARG_SCALE, gamma.data);
  if (!dnnlc::kV3) plan->bind(DNNL_ARG_SHIFT, gamma.data);  // not read (bn_backward_plan); any [C] float32
  plan->bind(DNNL_ARG_MEAN, saved_mean.data);
  plan->bind(DNNL_ARG_VARIANCE, var);
  plan->bind(DNNL_ARG_DIFF_SRC, dxf);
  plan->bind(DNNL_ARG_DIFF_SCALE, dgamma.data);
  plan->bind(DNNL_ARG_DIFF_SHIFT, dbeta.data);
  plan->run(ctx);
  f32_commit(dxf, dx);
}
}  // namespace mpx::cpu
