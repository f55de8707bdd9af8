// SPDX-License-Identifier: MIT
// Convolutions on oneDNN's native 16-bit kernels (conv_native.h). Operands stay 16-bit,
// oneDNN accumulates in float32 and rounds each 16-bit output once; the weight gradient
// comes out in float32 and is rounded to dw's dtype by f32_commit, as on the widened path.
#include "backend/cpu/conv/conv_native.h"

#include <memory>
#include <string>

#include <fmt/format.h>

#include "backend/cpu/conv/conv_loops.h"
#include "backend/cpu/dnnl_util.h"
#include "backend/cpu/native16.h"

namespace mpx::cpu {

namespace {

using namespace conv_detail;

enum NativeOp : int64_t { kNativeFwd = 121, kNativeBwdData = 122, kNativeBwdFilter = 123 };

PlanKey native_key(NativeOp op, const Conv2dParams& p, const Geo& g, DType t, int64_t flags) {
  PlanKey k;
  k << op << static_cast<int64_t>(t) << g.N << g.H << g.W << g.C << g.K << g.R << g.S << p.stride_h << p.stride_w
    << p.pad_top << p.pad_left << p.pad_bottom << p.pad_right << flags;
  return k;
}

std::string native_what(const char* op, DType t, const Geo& g) {
  return fmt::format("{} {} for x [{}, {}, {}, {}], w [{}, {}, {}, {}]", op, dtype_name(t), g.N, g.H, g.W, g.C, g.K,
                     g.R, g.S, g.C);
}

/// NHWC activations and KRSC weights as they are in memory (oneDNN's brgconv kernels take
/// NHWC directly); weights reordered into the kernel's blocked layout.
struct Descs {
  dnnl::memory::desc src, wei, wei_any, bias, dst;
  dnnl::memory::dims strides, pad_l, pad_r;
};

Descs descs(const Conv2dParams& p, const Geo& g, dt src_t, dt wei_t, dt dst_t) {
  Descs d;
  d.src = dnnl::memory::desc({g.N, g.C, g.H, g.W}, src_t, tag::nhwc);
  d.wei = dnnl::memory::desc({g.K, g.C, g.R, g.S}, wei_t, tag::ohwi);
  d.wei_any = dnnl::memory::desc({g.K, g.C, g.R, g.S}, wei_t, tag::any);
  d.bias = dnnl::memory::desc({g.K}, dt::f32, tag::x);
  d.dst = dnnl::memory::desc({g.N, g.K, g.P, g.Q}, dst_t, tag::nhwc);
  d.strides = {p.stride_h, p.stride_w};
  d.pad_l = {p.pad_top, p.pad_left};
  d.pad_r = {p.pad_bottom, p.pad_right};
  return d;
}

dnnl::convolution_forward::primitive_desc fwd_pd(Context& ctx, const Descs& d, bool bias, Activation fused) {
  return dnnlc::conv_fwd(ctx.engine(), d.src, d.wei_any, bias ? &d.bias : nullptr, d.dst, d.strides, d.pad_l,
                         d.pad_r, make_attr(fused));
}

}  // namespace

Activation conv_post_op(Activation act, const Tensor& pre) {
  if (!pre.empty()) return Activation::None;
  return act.kind == ActKind::Relu || exact_post_op(act) ? act : Activation::None;
}

bool conv_native_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                         const Tensor& y, Activation act, const Tensor& pre, bool wanted, bool own16) {
  const DType t = x.dtype;
  const Geo g = geometry(p, x.shape, w.shape);
  const Activation fused = conv_post_op(act, pre);
  // The output in 16 bits straight from oneDNN when nothing is left to do after it;
  // otherwise in float32 scratch for activation_epilogue, which rounds once.
  const bool direct = pre.empty() && (act.is_none() || !fused.is_none());
  PlanKey key = native_key(kNativeFwd, p, g, t, (bias.empty() ? 0 : 1) | (direct ? 2 : 0));
  key << act_key(fused);
  if (!wants_native(ctx, t, key, wanted, own16)) return false;
  const std::string what = native_what("convolution forward", t, g);
  NativePlan& plan = ctx.plan<NativePlan>(key, [&] {
    return make_native<NativePlan>(ctx, what, [&](NativePlan& pl) {
      const Descs d = descs(p, g, dnnl_dtype(t), dnnl_dtype(t), direct ? dnnl_dtype(t) : dt::f32);
      const auto pd = fwd_pd(ctx, d, !bias.empty(), fused);
      if (is_reference_impl(pd.impl_info_str())) return std::string(pd.impl_info_str());
      pl.set_forward<dnnl::convolution_forward>(ctx, pd, d.src, d.wei, !bias.empty() ? &d.bias : nullptr, d.dst);
      return pl.impl;
    });
  });
  if (!native_usable(ctx, t, key, plan)) return false;
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  float* yf = direct ? nullptr : f32_out(ctx, kSlotY, y);
  run_forward(ctx, plan, x.data, w.data, bf, direct ? y.data : yf);
  if (!direct) activation_epilogue(fused.is_none() ? act : Activation::None, yf, y, pre);
  return true;
}

bool conv_native_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                               const Tensor& dx, bool wanted) {
  const DType t = dy.dtype;
  const Geo g = geometry(p, dx.shape, w.shape);
  const PlanKey key = native_key(kNativeBwdData, p, g, t, 0);
  if (!wants_native(ctx, t, key, wanted)) return false;
  const std::string what = native_what("convolution backward data", t, g);
  NativePlan& plan = ctx.plan<NativePlan>(key, [&] {
    return make_native<NativePlan>(ctx, what, [&](NativePlan& pl) {
      const Descs d = descs(p, g, dnnl_dtype(t), dnnl_dtype(t), dnnl_dtype(t));
      const auto hint = fwd_pd(ctx, d, false, Activation::None);
      const auto pd = dnnlc::conv_bwd_data(ctx.engine(), d.src, d.wei_any, d.dst, d.strides, d.pad_l, d.pad_r, hint,
                                           make_attr());
      if (is_reference_impl(pd.impl_info_str())) return std::string(pd.impl_info_str());
      pl.set_backward_data<dnnl::convolution_backward_data>(ctx, pd, d.dst, d.wei, d.src);
      return pl.impl;
    });
  });
  if (!native_usable(ctx, t, key, plan)) return false;
  run_backward_data(ctx, plan, dy.data, w.data, dx.data);
  return true;
}

bool conv_native_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                                 const Tensor& dw, const Tensor& db, bool wanted, bool own16) {
  const DType t = x.dtype;
  const Geo g = geometry(p, x.shape, dw.shape);
  const PlanKey key = native_key(kNativeBwdFilter, p, g, t, db.empty() ? 0 : 1);
  if (!wants_native(ctx, t, key, wanted, own16)) return false;
  const std::string what = native_what("convolution backward weights", t, g);
  NativePlan& plan = ctx.plan<NativePlan>(key, [&] {
    return make_native<NativePlan>(ctx, what, [&](NativePlan& pl) {
      // float32 weight gradient: dw's dtype (float32 or t) is reached by one rounding below.
      const Descs d = descs(p, g, dnnl_dtype(t), dt::f32, dnnl_dtype(t));
      const Descs h = descs(p, g, dnnl_dtype(t), dnnl_dtype(t), dnnl_dtype(t));
      const auto hint = fwd_pd(ctx, h, !db.empty(), Activation::None);
      const dnnl::memory::desc* bias = db.empty() ? nullptr : &d.bias;
      const auto pd = dnnlc::conv_bwd_weights(ctx.engine(), d.src, d.wei_any, bias, d.dst, d.strides, d.pad_l,
                                              d.pad_r, hint, make_attr());
      return fill_weight_gradient<dnnl::convolution_backward_weights>(ctx, pl, pd, d.src, d.dst, d.wei, bias);
    });
  });
  return run_native_weight_gradient(ctx, plan, t, key, x, dy, dw, db);
}

}  // namespace mpx::cpu
