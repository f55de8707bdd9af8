// SPDX-License-Identifier: MIT
// Dense (fully connected) layer: x [N, Cin], w [Cout, Cin] (Keras kernel
// transposed, cuBLAS-friendly), y [N, Cout]. 16-bit as in conv.cpp: oneDNN's native
// 16-bit kernels where the CPU has them (native16.h), else widened to float32.
// oneDNN inner product (bias fused; the activation a post-op where dnnl_util.h's
// exact_post_op says so, else activation_epilogue's pass, which also keeps relu's NaN) with
// the user layouts nc / oi / nc, one cached plan per shape, run on fixed chunks of rows (see
// below); the plain loops stay for MPX_CPU_REFERENCE=1.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "backend/cpu/dnnl_util.h"
#include "backend/cpu/dense/dense_few.h"
#include "backend/cpu/dense/dense_native.h"
#include "backend/cpu/dense/dense_rows.h"
#include "backend/cpu/ops.h"

namespace mpx::cpu {

using namespace dense_detail;

namespace {

// y = x w^T + b (the activation follows in activation_epilogue).
void dense_forward_loops(int64_t N, int64_t Ci, int64_t Co, const float* x, const float* w, const float* b,
                         float* y) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Co; ++o) {
      const float* xi = x + n * Ci;
      const float* wo = w + o * Ci;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < Ci; ++i) acc += xi[i] * wo[i];
      acc += b ? b[o] : 0.0f;
      y[n * Co + o] = acc;
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

// ---- oneDNN inner product (dense_rows.h: why in chunks of kRows rows) -------------------

enum DenseOp : int64_t { kDenseFwd = 201, kDenseBwdData = 202, kDenseBwdWeights = 203, kDenseFew = 204 };

std::string dense_what(const char* op, int64_t N, int64_t Ci, int64_t Co) {
  return std::string(op) + " for x [" + std::to_string(N) + ", " + std::to_string(Ci) + "], w [" +
         std::to_string(Co) + ", " + std::to_string(Ci) + "]";
}

dnnl::inner_product_forward::primitive_desc dense_fwd_pd(Context& ctx, const DenseDescs& d, bool bias,
                                                         Activation fused = Activation::None) {
  // No fused ReLU post-op: oneDNN's ReLU turns NaN into 0 (measured: jit max(x, 0)),
  // and the backend keeps NaN so that check_numerics sees it (exact_post_op, dnnl_util.h).
  return dnnlc::ip_fwd(ctx.engine(), d.src, d.wei, bias ? &d.bias : nullptr, d.dst, make_attr(fused));
}

RowsPlan& dense_fwd_plan(Context& ctx, int64_t Ci, int64_t Co, bool bias, Activation fused) {
  PlanKey k;
  k << kDenseFwd << kRows << Ci << Co << (bias ? 1 : 0) << act_key(fused);
  return ctx.plan<RowsPlan>(k, [&] {
    return dnnl_try(dense_what("inner product forward", kRows, Ci, Co), [&] {
      auto plan = std::make_unique<RowsPlan>();
      const DenseDescs d = dense_descs(kRows, Ci, Co);
      const auto pd = dense_fwd_pd(ctx, d, bias, fused);
      plan->prim = dnnl::inner_product_forward(pd);
      plan->add_arg(ctx, DNNL_ARG_SRC, d.src, pd.src_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_WEIGHTS, d.wei, pd.weights_desc(), false);
      if (bias) plan->args[DNNL_ARG_BIAS] = unbound(d.bias, ctx.engine());
      plan->add_arg(ctx, DNNL_ARG_DST, d.dst, pd.dst_desc(), true);
      plan->set_scratchpad(ctx, pd);
      plan->arg_in = DNNL_ARG_SRC, plan->arg_out = DNNL_ARG_DST, plan->in_cols = Ci, plan->out_cols = Co;
      return plan.release();
    });
  });
}

RowsPlan& dense_bwd_data_plan(Context& ctx, int64_t Ci, int64_t Co) {
  PlanKey k;
  k << kDenseBwdData << kRows << Ci << Co;
  return ctx.plan<RowsPlan>(k, [&] {
    return dnnl_try(dense_what("inner product backward data", kRows, Ci, Co), [&] {
      auto plan = std::make_unique<RowsPlan>();
      const DenseDescs d = dense_descs(kRows, Ci, Co);
      const auto hint = dense_fwd_pd(ctx, d, false);
      const auto pd = dnnlc::ip_bwd_data(ctx.engine(), d.src, d.wei, d.dst, hint, make_attr());
      plan->prim = dnnl::inner_product_backward_data(pd);
      plan->add_arg(ctx, DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_WEIGHTS, d.wei, pd.weights_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_DIFF_SRC, d.src, pd.diff_src_desc(), true);
      plan->set_scratchpad(ctx, pd);
      plan->arg_in = DNNL_ARG_DIFF_DST, plan->arg_out = DNNL_ARG_DIFF_SRC, plan->in_cols = Co, plan->out_cols = Ci;
      return plan.release();
    });
  });
}

DnnlPlan& dense_bwd_weights_plan(Context& ctx, int64_t N, int64_t Ci, int64_t Co, bool bias) {
  PlanKey k;
  k << kDenseBwdWeights << N << Ci << Co << (bias ? 1 : 0);
  return ctx.plan<DnnlPlan>(k, [&] {
    return dnnl_try(dense_what("inner product backward weights", N, Ci, Co), [&] {
      auto plan = std::make_unique<DnnlPlan>();
      const DenseDescs d = dense_descs(N, Ci, Co);
      const auto hint = dense_fwd_pd(ctx, d, bias);
      const auto pd = dnnlc::ip_bwd_weights(ctx.engine(), d.src, d.wei, bias ? &d.bias : nullptr, d.dst, hint,
                                            make_attr());
      plan->prim = dnnl::inner_product_backward_weights(pd);
      plan->add_arg(ctx, DNNL_ARG_SRC, d.src, pd.src_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_DIFF_WEIGHTS, d.wei, pd.diff_weights_desc(), true);
      if (bias) plan->args[DNNL_ARG_DIFF_BIAS] = unbound(d.bias, ctx.engine());
      plan->set_scratchpad(ctx, pd);
      return plan.release();
    });
  });
}

struct DenseFewNoted : Plan {};

/// Whether this pass runs dense_few's loops: its big operand `big` (x, or dx) is 16-bit, the
/// layer has at most kDenseFewMaxOut outputs, and MPX_DENSE_FEW is unset or auto. (Where the
/// CPU has native 16-bit math the native path took the op before.) Records the kernel once per
/// op, shape and dtype.
bool use_dense_few(Context& ctx, DenseOp op, const Tensor& big, int64_t N, int64_t Ci, int64_t Co) {
  // The switch first: a bad value is exit 2 on every net with a dense layer.
  if (!dense_few_enabled() || !is_16bit(big.dtype) || Co > kDenseFewMaxOut || reference_loops()) return false;
  PlanKey k;
  k << kDenseFew << op << N << Ci << Co << static_cast<int64_t>(big.dtype);
  ctx.plan<DenseFewNoted>(k, [&] {
    const char* name = op == kDenseFwd       ? "inner product forward"
                       : op == kDenseBwdData ? "inner product backward data"
                                             : "inner product backward weights";
    ctx.note_kernel(dense_what(name, N, Ci, Co), fmt::format("mpx:few-outputs {}, {} {} in registers", dense_few_isa(),
                                                             dtype_name(big.dtype), op == kDenseBwdData ? "dx" : "x"));
    return new DenseFewNoted;
  });
  return true;
}

}  // namespace

void dense_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                   Activation act, const Tensor& pre) {
  if (dense_native_forward(ctx, x, w, bias, y, act, pre)) return;
  const int64_t N = x.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const float* wf = f32_in(ctx, kSlotW, w);
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  float* yf = f32_out(ctx, kSlotY, y);
  if (use_dense_few(ctx, kDenseFwd, x, N, Ci, Co)) {
    dense_few_forward(N, Ci, Co, x.data, x.dtype, wf, bf, yf);
    activation_epilogue(act, yf, y, pre);
    return;
  }
  const float* xf = f32_in(ctx, kSlotX, x);
  if (reference_loops()) {
    dense_forward_loops(N, Ci, Co, xf, wf, bf, yf);
    activation_epilogue(act, yf, y, pre);
    return;
  }
  const Activation fused = pre.empty() && exact_post_op(act) ? act : Activation::None;
  RowsPlan& plan = dense_fwd_plan(ctx, Ci, Co, bf != nullptr, fused);
  plan.bind(DNNL_ARG_WEIGHTS, wf);
  if (bf) plan.bind(DNNL_ARG_BIAS, bf);
  plan.run_rows(ctx, xf, yf, N);
  activation_epilogue(fused.is_none() ? act : Activation::None, yf, y, pre);
}

void dense_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  if (dense_native_backward_data(ctx, dy, w, dx)) return;
  const int64_t N = dx.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  const float* wf = f32_in(ctx, kSlotW, w);
  if (use_dense_few(ctx, kDenseBwdData, dx, N, Ci, Co)) {
    dense_few_backward_data(N, Ci, Co, dyf, wf, dx.data, dx.dtype);
    return;
  }
  float* dxf = f32_out(ctx, kSlotDX, dx);
  if (reference_loops()) {
    dense_backward_data_loops(N, Ci, Co, dyf, wf, dxf);
  } else {
    RowsPlan& plan = dense_bwd_data_plan(ctx, Ci, Co);
    plan.bind(DNNL_ARG_WEIGHTS, wf);
    plan.run_rows(ctx, dyf, dxf, N);
  }
  f32_commit(dxf, dx);
}

void dense_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db) {
  if (dense_native_backward_weights(ctx, x, dy, dw, db)) return;
  const int64_t N = x.shape[0], Co = dw.shape[0], Ci = dw.shape[1];
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  if (use_dense_few(ctx, kDenseBwdWeights, x, N, Ci, Co)) {
    dense_few_backward_weights(N, Ci, Co, x.data, x.dtype, dyf, dwf, dbf);
  } else if (reference_loops()) {
    dense_backward_weights_loops(N, Ci, Co, f32_in(ctx, kSlotX, x), dyf, dwf, dbf);
  } else {
    run_weight_gradient(ctx, dense_bwd_weights_plan(ctx, N, Ci, Co, dbf != nullptr), f32_in(ctx, kSlotX, x), dyf, dwf,
                        dbf);
  }
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
}

}  // namespace mpx::cpu
