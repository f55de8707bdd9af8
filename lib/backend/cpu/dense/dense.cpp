// SPDX-License-Identifier: MIT
// Dense (fully connected) layer: x [N, Cin], w [Cout, Cin] (Keras kernel
// transposed, cuBLAS-friendly), y [N, Cout]. Which kernel runs is dense_choose.h's answer:
// oneDNN's native 16-bit kernels (dense_native.cpp), mpx's few-output loops (dense_few.h),
// or oneDNN's float32 inner product on widened copies.
// oneDNN inner product (bias fused; the activation a post-op where dnnl_util.h's
// exact_post_op says so, else activation_epilogue's pass, which also keeps relu's NaN) with
// the user layouts nc / oi / nc, one cached plan per shape, run on fixed chunks of rows (see
// below); the plain loops stay for MPX_CPU_REFERENCE=1.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "backend/cpu/dnnl_util.h"
#include "backend/cpu/dense/dense_choose.h"
#include "backend/cpu/dense/dense_few.h"
#include "backend/cpu/dense/dense_loops.h"
#include "backend/cpu/dense/dense_native.h"
#include "backend/cpu/dense/dense_rows.h"
#include "backend/cpu/conv/conv_loops.h"
#include "backend/cpu/ops.h"

namespace mpx::cpu {

using namespace dense_detail;

namespace {

// ---- oneDNN inner product (dense_rows.h: why in chunks of kRows rows) -------------------

enum DenseOp : int64_t {
  kDenseFwd = 201,
  kDenseBwdData = 202,
  kDenseBwdWeights = 203,
  kDenseChoice = 205,
  kDenseBwdBoth = 206,  // both backward passes in one walk (choose_dense_backward)
  kDenseBwdConv = 207,  // ... and a first convolution's weight gradient (choose_dense_conv_backward)
};

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
      plan->set_forward<dnnl::inner_product_forward>(ctx, pd, d.src, d.wei, bias ? &d.bias : nullptr, d.dst);
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
      plan->set_backward_data<dnnl::inner_product_backward_data>(ctx, pd, d.dst, d.wei, d.src);
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
      plan->set_weight_gradient<dnnl::inner_product_backward_weights>(ctx, pd, d.src, d.dst, d.wei,
                                                                      bias ? &d.bias : nullptr);
      return plan.release();
    });
  });
}

struct ChoicePlan : Plan {
  DenseChoice choice;
};

/// The chooser's answer for this op and shape, asked once (then cached with the plans); mpx's
/// few-output loops are recorded in the kernels list then (oneDNN's when their plan is made).
const DenseChoice& choice(Context& ctx, DenseOp op, DenseQuery q) {
  PlanKey k;
  k << kDenseChoice << op << q.N << q.Ci << q.Co << static_cast<int64_t>(q.in) << static_cast<int64_t>(q.big)
    << (q.native_refused ? 1 : 0);
  return ctx.plan<ChoicePlan>(k, [&] {
           // Owned until returned: the chooser throws on a bad switch value (exit 2).
           auto c = std::make_unique<ChoicePlan>();
           c->choice = op == kDenseBwdBoth   ? choose_dense_backward(q)
                       : op == kDenseBwdConv ? choose_dense_conv_backward(q)
                                             : choose_dense(q);
           if (c->choice.kernel == DenseKernel::FewOutputs) {
             const char* name = op == kDenseFwd       ? "inner product forward"
                                : op == kDenseBwdData ? "inner product backward data"
                                : op == kDenseBwdBoth ? "inner product backward weights and data"
                                : op == kDenseBwdConv ? "inner product backward weights and data with the "
                                                        "convolution's weight gradient"
                                                      : "inner product backward weights";
             ctx.note_kernel(dense_what(name, q.N, q.Ci, q.Co), c->choice.name);
           }
           return c.release();
         })
      .choice;
}

DenseQuery query(DensePass pass, int64_t N, int64_t Ci, int64_t Co, DType in, DType big) {
  DenseQuery q;
  q.pass = pass, q.N = N, q.Ci = Ci, q.Co = Co, q.in = in, q.big = big;
  return q;
}

}  // namespace

namespace {

/// Room for `words` 32-bit words of the few-output loops' bfloat16 pairs (DenseFewBf16).
uint32_t* pair_room(Context& ctx, int64_t words) {
  return reinterpret_cast<uint32_t*>(ctx.scratch(kSlotTmp0, static_cast<size_t>(words)));
}

}  // namespace

void dense_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                   Activation act, const Tensor& pre) {
  const int64_t N = x.shape[0], Co = w.shape[0], Ci = w.shape[1];
  DenseQuery q = query(DensePass::Forward, N, Ci, Co, w.dtype, x.dtype);  // w: the layer's dtype
  const DenseChoice* c = &choice(ctx, kDenseFwd, q);
  // A float32 layer's 16-bit x (the input cast folded in) is not a 16-bit op: never native.
  // The few-output loops on bfloat16 dot products count as native 16-bit math (wants_native).
  const bool own16 = c->kernel == DenseKernel::FewOutputs && dense_few_dots_forward(x.dtype, w.dtype, Ci);
  if (x.dtype == w.dtype &&
      dense_native_forward(ctx, x, w, bias, y, act, pre, c->kernel == DenseKernel::Native16, own16))
    return;
  if (c->kernel == DenseKernel::Native16) {
    q.native_refused = true;
    c = &choice(ctx, kDenseFwd, q);
  }
  const float* wf = f32_in(ctx, kSlotW, w);
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  float* yf = f32_out(ctx, kSlotY, y);
  if (c->kernel == DenseKernel::FewOutputs) {
    DenseFewBf16 b16;
    if (dense_few_dots_forward(x.dtype, w.dtype, Ci)) {
      b16.w16 = static_cast<const uint16_t*>(w.data);
      b16.pairs = pair_room(ctx, dense_few_pair_words(Co, Ci));
    }
    dense_few_forward(N, Ci, Co, x.data, x.dtype, wf, bf, yf, b16);
    activation_epilogue(act, yf, y, pre);
    return;
  }
  const float* xf = f32_in(ctx, kSlotX, x);
  if (c->kernel == DenseKernel::Reference) {
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

namespace {

/// dense_backward_data; with `relu_out` (a relu's output, dx's shape and dtype) also that
/// relu's backward: in the few-output loops' registers, else a pass after the product.
void backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx, const Tensor* relu_out) {
  const int64_t N = dx.shape[0], Co = w.shape[0], Ci = w.shape[1];
  DenseQuery q = query(DensePass::BackwardData, N, Ci, Co, dy.dtype, dx.dtype);
  const DenseChoice* c = &choice(ctx, kDenseBwdData, q);
  auto relu_pass = [&] {
    if (relu_out) activation_backward(ctx, Activation::Relu, *relu_out, dx, dx);
  };
  const bool own16 = c->kernel == DenseKernel::FewOutputs && dense_few_dots_backward_data(dy.dtype, w.dtype, dx.dtype);
  if (dx.dtype == dy.dtype && dense_native_backward_data(ctx, dy, w, dx, c->kernel == DenseKernel::Native16, own16))
    return relu_pass();
  if (c->kernel == DenseKernel::Native16) {
    q.native_refused = true;
    c = &choice(ctx, kDenseBwdData, q);
  }
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  const float* wf = f32_in(ctx, kSlotW, w);
  if (c->kernel == DenseKernel::FewOutputs) {
    DenseFewBf16 b16;
    if (dense_few_dots_backward_data(dy.dtype, w.dtype, dx.dtype)) {
      b16.w16 = static_cast<const uint16_t*>(w.data);
      b16.dy16 = static_cast<const uint16_t*>(dy.data);
      b16.pairs = pair_room(ctx, dense_few_pair_words(Co, Ci));
    }
    dense_few_backward_data(N, Ci, Co, dyf, wf, dx.data, dx.dtype, relu_out ? relu_out->data : nullptr, b16);
    return;
  }
  float* dxf = f32_out(ctx, kSlotDX, dx);
  if (c->kernel == DenseKernel::Reference) {
    dense_backward_data_loops(N, Ci, Co, dyf, wf, dxf);
  } else {
    RowsPlan& plan = dense_bwd_data_plan(ctx, Ci, Co);
    plan.bind(DNNL_ARG_WEIGHTS, wf);
    plan.run_rows(ctx, dyf, dxf, N);
  }
  f32_commit(dxf, dx);
  relu_pass();
}

}  // namespace

void dense_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  backward_data(ctx, dy, w, dx, nullptr);
}

void dense_relu_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& x, const Tensor& dx) {
  backward_data(ctx, dy, w, dx, &x);
}

void dense_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db) {
  const int64_t N = x.shape[0], Co = dw.shape[0], Ci = dw.shape[1];
  DenseQuery q = query(DensePass::BackwardWeights, N, Ci, Co, dy.dtype, x.dtype);  // dy: the layer's dtype
  const DenseChoice* c = &choice(ctx, kDenseBwdWeights, q);
  const bool own16 = c->kernel == DenseKernel::FewOutputs && dense_few_dots_backward_weights(x.dtype, dy.dtype);
  if (x.dtype == dy.dtype &&
      dense_native_backward_weights(ctx, x, dy, dw, db, c->kernel == DenseKernel::Native16, own16))
    return;
  if (c->kernel == DenseKernel::Native16) {
    q.native_refused = true;
    c = &choice(ctx, kDenseBwdWeights, q);
  }
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  if (c->kernel == DenseKernel::FewOutputs) {
    DenseFewBf16 b16;
    if (dense_few_dots_backward_weights(x.dtype, dy.dtype)) {
      b16.dy16 = static_cast<const uint16_t*>(dy.data);
      b16.pairs = pair_room(ctx, dense_few_dy_pair_words(N, Co));
    }
    dense_few_backward_weights(N, Ci, Co, x.data, x.dtype, dyf, dwf, dbf, b16);
  } else if (c->kernel == DenseKernel::Reference) {
    dense_backward_weights_loops(N, Ci, Co, f32_in(ctx, kSlotX, x), dyf, dwf, dbf);
  } else {
    run_weight_gradient(ctx, dense_bwd_weights_plan(ctx, N, Ci, Co, dbf != nullptr), f32_in(ctx, kSlotX, x), dyf, dwf,
                        dbf);
  }
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
}

bool dense_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                    const Tensor& db, const Tensor& dx, bool relu) {
  const int64_t N = x.shape[0], Co = dw.shape[0], Ci = dw.shape[1];
  if (N == 0 || Ci == 0) return false;
  const DenseQuery q = query(DensePass::BackwardWeights, N, Ci, Co, dy.dtype, x.dtype);
  if (choice(ctx, kDenseBwdBoth, q).kernel != DenseKernel::FewOutputs) return false;
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  const float* wf = f32_in(ctx, kSlotW, w);
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  dense_few_backward(N, Ci, Co, x.data, x.dtype, dyf, wf, dwf, dbf, dx.data, relu);
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
  return true;
}

bool dense_conv_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                         const Tensor& db, const Conv2dParams& p, const Tensor& conv_x, const Tensor& conv_dw,
                         const Tensor& conv_db) {
  const int64_t N = x.shape[0], Co = dw.shape[0], Ci = dw.shape[1];
  const conv_detail::Geo g = conv_detail::geometry(p, conv_x.shape, conv_dw.shape);
  if (N == 0 || !conv_detail::few_channel_shape(g)) return false;
  const DenseQuery q = query(DensePass::BackwardWeights, N, Ci, Co, dy.dtype, x.dtype);
  if (choice(ctx, kDenseBwdConv, q).kernel != DenseKernel::FewOutputs) return false;
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  const float* wf = f32_in(ctx, kSlotW, w);
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  float* cdw = f32_out(ctx, kSlotTmp1, conv_dw);
  float* cdb = conv_db.empty() ? nullptr : f32_out(ctx, kSlotDX, conv_db);
  double* scratch = ctx.scratch_f64(kSlotTmp0, dense_few_conv_scratch(g, omp_get_max_threads()));
  dense_few_backward_conv(N, Ci, Co, x.data, x.dtype, dyf, wf, dwf, dbf, g, conv_x.data, cdw, cdb,
                          scratch);
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
  f32_commit(cdw, conv_dw);
  if (cdb) f32_commit(cdb, conv_db);
  return true;
}

}  // namespace mpx::cpu
