// SPDX-License-Identifier: MIT
// Dense layers on oneDNN's native 16-bit kernels (dense_native.h): 16-bit operands,
// float32 accumulation, each 16-bit output rounded once; the weight gradient in float32,
// rounded to dw's dtype by f32_commit as on the widened path.
#include "backend/cpu/dense/dense_native.h"

#include <memory>
#include <string>

#include <fmt/format.h>

#include "backend/cpu/dense/dense_rows.h"
#include "backend/cpu/native16.h"

namespace mpx::cpu {

using namespace dense_detail;

namespace {

// The native 16-bit path (native16.h): the same ops on 16-bit operands.
enum DenseNativeOp : int64_t { kNativeFwd = 211, kNativeBwdData = 212, kNativeBwdWeights = 213 };

// ---- the native 16-bit path (native16.h): 16-bit operands, float32 accumulation ----------

PlanKey dense_native_key(DenseNativeOp op, DType t, int64_t N, int64_t Ci, int64_t Co, int64_t flags) {
  PlanKey k;
  k << op << static_cast<int64_t>(t) << N << Ci << Co << flags;
  return k;
}

std::string dense_native_what(const char* op, DType t, int64_t N, int64_t Ci, int64_t Co) {
  return fmt::format("{} {} for x [{}, {}], w [{}, {}]", op, dtype_name(t), N, Ci, Co, Ci);
}

}  // namespace

bool dense_native_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                          Activation act, const Tensor& pre, bool wanted, bool own16) {
  const DType t = x.dtype;
  const int64_t N = x.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const Activation fused = pre.empty() && exact_post_op(act) ? act : Activation::None;
  // 16-bit output straight from oneDNN when no epilogue is left (conv_native.cpp does the same).
  const bool direct = pre.empty() && (act.is_none() || !fused.is_none());
  PlanKey key = dense_native_key(kNativeFwd, t, kRows, Ci, Co, (bias.empty() ? 0 : 1) | (direct ? 2 : 0));
  key << act_key(fused);
  if (!wants_native(ctx, t, key, wanted, own16)) return false;
  RowsPlan& plan = ctx.plan<RowsPlan>(key, [&] {
    return make_native<RowsPlan>(ctx, dense_native_what("inner product forward", t, kRows, Ci, Co), [&](RowsPlan& pl) {
      const DenseDescs d = dense_descs(kRows, Ci, Co, dnnl_dtype(t), dnnl_dtype(t), direct ? dnnl_dtype(t) : dt::f32);
      const auto pd = dnnlc::ip_fwd(ctx.engine(), d.src, d.wei_any, bias.empty() ? nullptr : &d.bias, d.dst,
                                    make_attr(fused));
      if (is_reference_impl(pd.impl_info_str())) return std::string(pd.impl_info_str());
      pl.set_forward<dnnl::inner_product_forward>(ctx, pd, d.src, d.wei, !bias.empty() ? &d.bias : nullptr, d.dst);
      pl.arg_in = DNNL_ARG_SRC, pl.arg_out = DNNL_ARG_DST, pl.in_cols = Ci, pl.out_cols = Co;
      pl.in_size = dtype_size(t), pl.out_size = direct ? dtype_size(t) : sizeof(float);
      return pl.impl;
    });
  });
  if (!native_usable(ctx, t, key, plan)) return false;
  plan.bind(DNNL_ARG_WEIGHTS, w.data);
  if (!bias.empty()) plan.bind(DNNL_ARG_BIAS, f32_in(ctx, kSlotB, bias));
  float* yf = direct ? nullptr : f32_out(ctx, kSlotY, y);
  plan.run_rows(ctx, x.data, direct ? y.data : static_cast<void*>(yf), N);
  if (!direct) activation_epilogue(fused.is_none() ? act : Activation::None, yf, y, pre);
  return true;
}

bool dense_native_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx, bool wanted,
                                bool own16) {
  const DType t = dy.dtype;
  const int64_t N = dx.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const PlanKey key = dense_native_key(kNativeBwdData, t, kRows, Ci, Co, 0);
  if (!wants_native(ctx, t, key, wanted, own16)) return false;
  RowsPlan& plan = ctx.plan<RowsPlan>(key, [&] {
    const std::string what = dense_native_what("inner product backward data", t, kRows, Ci, Co);
    return make_native<RowsPlan>(ctx, what, [&](RowsPlan& pl) {
      const DenseDescs d = dense_descs(kRows, Ci, Co, dnnl_dtype(t), dnnl_dtype(t), dnnl_dtype(t));
      const auto hint = dnnlc::ip_fwd(ctx.engine(), d.src, d.wei_any, nullptr, d.dst, make_attr());
      const auto pd = dnnlc::ip_bwd_data(ctx.engine(), d.src, d.wei_any, d.dst, hint, make_attr());
      if (is_reference_impl(pd.impl_info_str())) return std::string(pd.impl_info_str());
      pl.set_backward_data<dnnl::inner_product_backward_data>(ctx, pd, d.dst, d.wei, d.src);
      pl.arg_in = DNNL_ARG_DIFF_DST, pl.arg_out = DNNL_ARG_DIFF_SRC, pl.in_cols = Co, pl.out_cols = Ci;
      pl.in_size = pl.out_size = dtype_size(t);
      return pl.impl;
    });
  });
  if (!native_usable(ctx, t, key, plan)) return false;
  plan.bind(DNNL_ARG_WEIGHTS, w.data);
  plan.run_rows(ctx, dy.data, dx.data, N);
  return true;
}

bool dense_native_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                   const Tensor& db, bool wanted, bool own16) {
  const DType t = x.dtype;
  const int64_t N = x.shape[0], Co = dw.shape[0], Ci = dw.shape[1];
  const PlanKey key = dense_native_key(kNativeBwdWeights, t, N, Ci, Co, db.empty() ? 0 : 1);
  if (!wants_native(ctx, t, key, wanted, own16)) return false;
  NativePlan& plan = ctx.plan<NativePlan>(key, [&] {
    const std::string what = dense_native_what("inner product backward weights", t, N, Ci, Co);
    return make_native<NativePlan>(ctx, what, [&](NativePlan& pl) {
      // float32 weight gradient, rounded to dw's dtype below (as on the widened path).
      const DenseDescs d = dense_descs(N, Ci, Co, dnnl_dtype(t), dt::f32, dnnl_dtype(t));
      const DenseDescs h = dense_descs(N, Ci, Co, dnnl_dtype(t), dnnl_dtype(t), dnnl_dtype(t));
      const auto hint = dnnlc::ip_fwd(ctx.engine(), h.src, h.wei_any, db.empty() ? nullptr : &h.bias, h.dst,
                                      make_attr());
      const dnnl::memory::desc* bias = db.empty() ? nullptr : &d.bias;
      const auto pd = dnnlc::ip_bwd_weights(ctx.engine(), d.src, d.wei_any, bias, d.dst, hint, make_attr());
      return fill_weight_gradient<dnnl::inner_product_backward_weights>(ctx, pl, pd, d.src, d.dst, d.wei, bias);
    });
  });
  return run_native_weight_gradient(ctx, plan, t, key, x, dy, dw, db);
}

}  // namespace mpx::cpu
