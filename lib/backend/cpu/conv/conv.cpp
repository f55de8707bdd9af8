// SPDX-License-Identifier: MIT
// Convolution forward / backward-data / backward-filter, NHWC with KRSC filters. Which
// kernel runs is conv_choose.h's answer; this file runs it: oneDNN's native 16-bit kernels
// (conv_native.cpp), mpx's kernels that convert 16-bit operands themselves (Winograd's
// transforms, the few-channel kernels), or a float32 kernel on widened copies whose 16-bit
// outputs are rounded once from its result.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <omp.h>

#include "backend/cpu/conv/conv_choose.h"
#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/conv/conv_loops.h"
#include "backend/cpu/conv/conv_native.h"
#include "backend/cpu/conv/conv_wgrad.h"
#include "backend/cpu/conv/conv_wgrad_amx.h"
#include "backend/cpu/conv/conv_wgrad_small.h"
#include "backend/cpu/conv/conv_winograd.h"
#include "backend/cpu/dnnl_util.h"
#include "core/error.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/switches.h"

namespace mpx::cpu {

namespace {

using namespace conv_detail;

// ---- oneDNN primitives ----------------------------------------------------------------

enum ConvOp : int64_t {
  kConvFwd = 101,
  kConvBwdData = 102,
  kConvBwdFilter = 103,
  kConvChoice = 110,
  kConvRouted = 111,  // the routed weight gradient's kernels-list entry (conv2d_backward_filter_routed)
  kConvPooled = 112   // the pooled forward's kernels-list entry (conv2d_forward_pooled)
};

PlanKey conv_key(ConvOp op, const Conv2dParams& p, const Geo& g, int64_t flags) {
  PlanKey k;
  k << op << g.N << g.H << g.W << g.C << g.K << g.R << g.S << p.stride_h << p.stride_w << p.pad_top << p.pad_left
    << p.pad_bottom << p.pad_right << flags;
  return k;
}

struct ConvDescs {
  dnnl::memory::desc src, wei, wei_any, bias, dst, src_any, dst_any;
  dnnl::memory::dims strides, pad_l, pad_r;
};

// x NHWC, w KRSC (= oneDNN "ohwi"), y NHWC: the user layouts, used as they are.
ConvDescs conv_descs(const Conv2dParams& p, const Geo& g) {
  ConvDescs d;
  d.src = dnnl::memory::desc({g.N, g.C, g.H, g.W}, dt::f32, tag::nhwc);
  d.wei = dnnl::memory::desc({g.K, g.C, g.R, g.S}, dt::f32, tag::ohwi);
  // With the plain KRSC layout oneDNN 2.6 only has its reference kernel; let it pick the
  // blocked weights layout of its JIT kernels and reorder (K*R*S*C elements, cheap).
  d.wei_any = dnnl::memory::desc({g.K, g.C, g.R, g.S}, dt::f32, tag::any);
  d.bias = dnnl::memory::desc({g.K}, dt::f32, tag::x);
  // Activations in NHWC in place, or in oneDNN's blocked layout (nChw8c on AVX2) with
  // reorders from/to NHWC around the primitive (conv_choose.h decides).
  const bool blk = conv_blocked_layout(g);
  d.src_any = blk ? dnnl::memory::desc({g.N, g.C, g.H, g.W}, dt::f32, tag::any) : d.src;
  d.dst_any = blk ? dnnl::memory::desc({g.N, g.K, g.P, g.Q}, dt::f32, tag::any)
                  : dnnl::memory::desc({g.N, g.K, g.P, g.Q}, dt::f32, tag::nhwc);
  d.dst = dnnl::memory::desc({g.N, g.K, g.P, g.Q}, dt::f32, tag::nhwc);
  d.strides = {p.stride_h, p.stride_w};
  d.pad_l = {p.pad_top, p.pad_left};
  d.pad_r = {p.pad_bottom, p.pad_right};
  return d;
}

std::string conv_what(const char* op, const Geo& g) {
  return std::string(op) + " for x [" + std::to_string(g.N) + ", " + std::to_string(g.H) + ", " +
         std::to_string(g.W) + ", " + std::to_string(g.C) + "], w [" + std::to_string(g.K) + ", " +
         std::to_string(g.R) + ", " + std::to_string(g.S) + ", " + std::to_string(g.C) + "]";
}

dnnl::convolution_forward::primitive_desc conv_fwd_pd(Context& ctx, const ConvDescs& d, bool bias,
                                                      Activation fused = Activation::None) {
  return dnnlc::conv_fwd(ctx.engine(), d.src_any, d.wei_any, bias ? &d.bias : nullptr, d.dst_any, d.strides, d.pad_l,
                         d.pad_r, make_attr(fused));
}

DnnlPlan& conv_fwd_plan(Context& ctx, const Conv2dParams& p, const Geo& g, bool bias, Activation fused) {
  PlanKey key = conv_key(kConvFwd, p, g, bias ? 1 : 0);
  key << act_key(fused);
  return ctx.plan<DnnlPlan>(key, [&] {
    return dnnl_try(conv_what("convolution forward", g), [&] {
      auto plan = std::make_unique<DnnlPlan>();
      const ConvDescs d = conv_descs(p, g);
      const auto pd = conv_fwd_pd(ctx, d, bias, fused);
      plan->set_forward<dnnl::convolution_forward>(ctx, pd, d.src, d.wei, bias ? &d.bias : nullptr, d.dst);
      return plan.release();
    });
  });
}

DnnlPlan& conv_bwd_data_plan(Context& ctx, const Conv2dParams& p, const Geo& g) {
  return ctx.plan<DnnlPlan>(conv_key(kConvBwdData, p, g, 0), [&] {
    return dnnl_try(conv_what("convolution backward data", g), [&] {
      auto plan = std::make_unique<DnnlPlan>();
      const ConvDescs d = conv_descs(p, g);
      const auto hint = conv_fwd_pd(ctx, d, false);
      const auto pd = dnnlc::conv_bwd_data(ctx.engine(), d.src_any, d.wei_any, d.dst_any, d.strides, d.pad_l,
                                           d.pad_r, hint, make_attr());
      plan->set_backward_data<dnnl::convolution_backward_data>(ctx, pd, d.dst, d.wei, d.src);
      return plan.release();
    });
  });
}

// oneDNN bug (AVX2 jit_1x1 backward weights, NHWC source, strided 1x1, few channels), in
// 2.6.3 and still in 3.2 (docs/cpu-performance.md):
// its per-thread copy of the strided source ("rtus") is booked as is*C floats per thread
// but addressed as (ic_b*is + sp)*8 (jit_avx2_1x1_convolution.cpp), so with 2+ threads a
// thread writes into the next one's copy and the last one past it, into the reducer's
// spin-barrier context in the same scratchpad. Measured with plain oneDNN (standalone,
// x [32,26,26,C] -> K, 1x1 stride 2, 2 OpenMP threads, passive or active waits): for C = 3
// and 4, dW ~100% off (relative; C = 4 at each of 8 scratchpad addresses tried); for C = 4,
// K = 8 a hang in that barrier (both threads spinning; its counter overwritten with input
// values) at 13 of 64 scratchpad addresses modulo 4096 -- the random hangs of mpx residual nets
// with a 1x1 stride-2 projection from C < 8. C = 8, 12, 16, 24, 32 measured right; the
// guard covers every C that is not a multiple of 8. With format any oneDNN takes the
// blocked (nChw8c) path of the same kernel, which is right (reorders around it).
bool rtus_nhwc_bwd_weights_bug(const Conv2dParams& p, const Geo& g) {
  return g.R == 1 && g.S == 1 && (p.stride_h > 1 || p.stride_w > 1) && g.C % 8 != 0;
}

DnnlPlan& conv_bwd_filter_plan(Context& ctx, const Conv2dParams& p, const Geo& g, bool bias) {
  return ctx.plan<DnnlPlan>(conv_key(kConvBwdFilter, p, g, bias ? 1 : 0), [&] {
    return dnnl_try(conv_what("convolution backward weights", g), [&] {
      auto plan = std::make_unique<DnnlPlan>();
      ConvDescs d = conv_descs(p, g);
      const bool avoid_nhwc = rtus_nhwc_bwd_weights_bug(p, g);
      if (avoid_nhwc) {
        d.src_any = dnnl::memory::desc({g.N, g.C, g.H, g.W}, dt::f32, tag::any);
        d.dst_any = dnnl::memory::desc({g.N, g.K, g.P, g.Q}, dt::f32, tag::any);
      }
      const auto hint = conv_fwd_pd(ctx, d, bias);
      const auto pd = bias ? dnnlc::conv_bwd_weights(ctx.engine(), avoid_nhwc ? d.src_any : d.src, d.wei_any,
                                                     &d.bias, avoid_nhwc ? d.dst_any : d.dst, d.strides, d.pad_l,
                                                     d.pad_r, hint, make_attr())
                           : dnnlc::conv_bwd_weights(ctx.engine(), d.src_any, d.wei_any, nullptr, d.dst_any,
                                                     d.strides, d.pad_l, d.pad_r, hint, make_attr());
      plan->set_weight_gradient<dnnl::convolution_backward_weights>(ctx, pd, d.src, d.dst, d.wei,
                                                                    bias ? &d.bias : nullptr);
      return plan.release();
    });
  });
}

// ---- the chosen kernel of each op and shape (conv_choose.h) ----------------------------

WgradGeo wgrad_geo(const Geo& g) { return {g.N, g.H, g.W, g.C, g.K, g.R, g.S, g.P, g.Q, g.pt, g.pl}; }

struct ChoicePlan : Plan {
  ConvChoice choice;
};

const char* pass_what(ConvPass pass) {
  return pass == ConvPass::Forward        ? "convolution forward"
         : pass == ConvPass::BackwardData ? "convolution backward data"
                                          : "convolution backward weights";
}

/// The chooser's answer for this op and shape, asked once (then cached with the plans); mpx's
/// own kernels are recorded in the kernels list then (oneDNN's when their plan is made).
const ConvChoice& choice(Context& ctx, ConvQuery q) {
  q.configured = ctx.winograd;
  PlanKey k = conv_key(kConvChoice, q.p, q.g, static_cast<int64_t>(q.pass));
  k << static_cast<int64_t>(q.in) << static_cast<int64_t>(q.out) << act_key(q.act) << (q.keep_pre ? 1 : 0)
    << (q.native_refused ? 1 : 0) << (q.w_bf16 ? 1 : 0) << (q.pooled ? 1 : 0);
  return ctx.plan<ChoicePlan>(k, [&] {
           // Owned until returned: the chooser throws on a bad switch value (exit 2).
           auto c = std::make_unique<ChoicePlan>();
           c->choice = choose_conv(q);
           const ConvKernel kk = c->choice.kernel;
           // (The pooled forward names its own entry: conv2d_forward_pooled.)
           const bool own = kk == ConvKernel::Winograd || kk == ConvKernel::Winograd16 ||
                            kk == ConvKernel::FewChannels || kk == ConvKernel::WgradGemm || kk == ConvKernel::WgradAmx;
           if (own && !q.pooled)
             ctx.note_kernel(conv_what(pass_what(q.pass), q.g), c->choice.name);
           return c.release();
         })
      .choice;
}

ConvQuery query(ConvPass pass, const Conv2dParams& p, const Geo& g, DType in, DType out) {
  ConvQuery q;
  q.pass = pass, q.p = p, q.g = g, q.in = in, q.out = out;
  return q;
}

WinoGeo with_block(WinoGeo wg) {
  wg.tiles_per_block = winograd_tiles_per_block(wg);
  return wg;
}

}  // namespace

// ---- ops ---------------------------------------------------------------------------
// 16-bit operands on oneDNN's native 16-bit kernels where the chooser says so
// (conv_native.cpp); otherwise 16-bit tensors converted in mpx's kernels, or through float32
// scratch (f32_in/f32_out) for the float32 kernels and rounded once on the way out. The plain
// loops (conv_loops.h) run under MPX_CPU_REFERENCE=1 (a suspected oneDNN problem).

void conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Tensor& y, Activation act, const Tensor& pre) {
  const Geo g = geometry(p, x.shape, w.shape);
  ConvQuery q = query(ConvPass::Forward, p, g, x.dtype, y.dtype);
  q.act = act, q.keep_pre = !pre.empty(), q.w_bf16 = w.dtype == DType::BF16;
  const ConvChoice* c = &choice(ctx, q);
  // mpx's few-channel forward on bfloat16 dot products counts as native 16-bit math (wants_native)
  const bool own16 = c->kernel == ConvKernel::FewChannels && fwd_small_dots(x.dtype, q.w_bf16);
  if (conv_native_forward(ctx, p, x, w, bias, y, act, pre, c->kernel == ConvKernel::Native16, own16)) return;
  if (c->kernel == ConvKernel::Native16) {
    q.native_refused = true;
    c = &choice(ctx, q);
  }
  const bool relu = act.kind == ActKind::Relu && pre.empty();  // Winograd's and mpx's relu keep NaN
  const float* wf = f32_in(ctx, kSlotW, w);
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  if (c->kernel == ConvKernel::Winograd16 || c->kernel == ConvKernel::Winograd) {
    const bool direct = c->kernel == ConvKernel::Winograd16;
    const WinoGeo wg = with_block({g.N, g.H, g.W, g.C, g.P, g.Q, g.K, p.pad_top, p.pad_left, c->tile, 0});
    float* u = ctx.scratch(kSlotTmp1, winograd_weight_floats(wg));
    winograd_weights(wg, wf, false, u);
    const void* xin = direct ? x.data : f32_in(ctx, kSlotX, x);
    float* yf = direct ? nullptr : f32_out(ctx, kSlotY, y);
    float* scratch = ctx.scratch(kSlotTmp0, winograd_scratch(wg, omp_get_max_threads()));
    conv_winograd(wg, xin, u, bf, relu, direct ? y.data : yf, scratch, direct ? x.dtype : DType::F32);
    if (!direct) activation_epilogue(relu ? Activation::None : act, yf, y, pre);
    return;
  }
  if (c->kernel == ConvKernel::FewChannels) {
    float* scratch = ctx.scratch(kSlotTmp0, conv_fwd_small_scratch(g, omp_get_max_threads()));
    MPX_CHECK(pre.empty() || pre.dtype == y.dtype);
    conv_fwd_small(g, x.data, wf, bf, act, pre.empty() ? nullptr : pre.data, y.data, x.dtype, scratch,
                   q.w_bf16 ? static_cast<const uint16_t*>(w.data) : nullptr);
    return;
  }
  const float* xf = f32_in(ctx, kSlotX, x);
  float* yf = f32_out(ctx, kSlotY, y);
  if (c->kernel == ConvKernel::Reference) {
    conv_forward_loops(g, xf, wf, bf, yf);
    activation_epilogue(act, yf, y, pre);
    return;
  }
  const Activation fused = conv_post_op(act, pre);
  run_forward(ctx, conv_fwd_plan(ctx, p, g, bf != nullptr, fused), xf, wf, bf, yf);
  activation_epilogue(fused.is_none() ? act : Activation::None, yf, y, pre);
}

namespace {

ConvQuery pooled_query(const Conv2dParams& p, const Geo& g, DType t, bool w_bf16) {
  ConvQuery q = query(ConvPass::Forward, p, g, t, t);
  q.act = Activation::Relu, q.w_bf16 = w_bf16, q.pooled = true;
  return q;
}

}  // namespace

bool conv2d_forward_pools(WinogradMode configured, const Conv2dParams& p, const Shape& x, const Shape& w, DType t) {
  if (x.rank != 4 || w.rank != 4) return false;
  ConvQuery q = pooled_query(p, geometry(p, x, w), t, t == DType::BF16);
  q.configured = configured;
  return choose_conv(q).kernel == ConvKernel::FewChannels;
}

bool conv2d_forward_pooled(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                           const Tensor& y, const FwdPoolRows& pool) {
  const Geo g = geometry(p, x.shape, w.shape);
  const ConvQuery q = pooled_query(p, g, x.dtype, w.dtype == DType::BF16);
  const ConvChoice& c = choice(ctx, q);
  if (c.kernel != ConvKernel::FewChannels) return false;
  // Counted as conv2d_forward counts it: native 16-bit math where it multiplies in bfloat16 pairs
  // (conv_native_forward with the native kernel not wanted only counts the op).
  conv_native_forward(ctx, p, x, w, bias, y, Activation::Relu, Tensor(), false, fwd_small_dots(x.dtype, q.w_bf16));
  PlanKey k = conv_key(kConvPooled, p, g, static_cast<int64_t>(x.dtype));
  ctx.plan<Plan>(k, [&] {  // named once per shape (the plan is only the record)
    ctx.note_kernel(conv_what("convolution forward with max pooling", g),
                    c.name + ", each pooling window's rows pooled in cache, the output never stored");
    return new Plan;
  });
  const float* wf = f32_in(ctx, kSlotW, w);
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  float* scratch = ctx.scratch(kSlotTmp0, conv_fwd_small_pooled_scratch(g, pool.window, omp_get_max_threads()));
  conv_fwd_small_pooled(g, x.data, wf, bf, x.dtype, scratch,
                        q.w_bf16 ? static_cast<const uint16_t*>(w.data) : nullptr, pool);
  return true;
}

void conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                          const Tensor& dx) {
  const Geo g = geometry(p, dx.shape, w.shape);
  ConvQuery q = query(ConvPass::BackwardData, p, g, dy.dtype, dx.dtype);
  const ConvChoice* c = &choice(ctx, q);
  if (conv_native_backward_data(ctx, p, dy, w, dx, c->kernel == ConvKernel::Native16)) return;
  if (c->kernel == ConvKernel::Native16) {
    q.native_refused = true;
    c = &choice(ctx, q);
  }
  const float* wf = f32_in(ctx, kSlotW, w);
  if (c->kernel == ConvKernel::Winograd16 || c->kernel == ConvKernel::Winograd) {
    const bool direct = c->kernel == ConvKernel::Winograd16;
    // dx = dy convolved with w turned by 180 degrees, K in and C out, padding 2 - the forward's.
    const WinoGeo wg = with_block({g.N, g.P, g.Q, g.K, g.H, g.W, g.C, 2 - p.pad_top, 2 - p.pad_left, c->tile, 0});
    float* u = ctx.scratch(kSlotTmp1, winograd_weight_floats(wg));
    winograd_weights(wg, wf, true, u);
    const void* dyin = direct ? dy.data : f32_in(ctx, kSlotDY, dy);
    float* dxf = direct ? nullptr : f32_out(ctx, kSlotDX, dx);
    float* scratch = ctx.scratch(kSlotTmp0, winograd_scratch(wg, omp_get_max_threads()));
    conv_winograd(wg, dyin, u, nullptr, false, direct ? dx.data : dxf, scratch, direct ? dy.dtype : DType::F32);
    if (!direct) f32_commit(dxf, dx);
    return;
  }
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  float* dxf = f32_out(ctx, kSlotDX, dx);
  if (c->kernel == ConvKernel::Reference) {
    conv_backward_data_loops(g, dyf, wf, dxf);
  } else {
    run_backward_data(ctx, conv_bwd_data_plan(ctx, p, g), dyf, wf, dxf);
  }
  f32_commit(dxf, dx);
}

namespace {

/// conv2d_backward_filter; with `rows` (not null) dy's rows come from there instead of dy (an
/// empty tensor then), which only the few-channel kernel takes: false, nothing done, where the
/// chooser gives the shape another kernel. `source` names the rows' origin in the kernels list.
bool backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy, const WgradDyRows* rows,
                     const char* source, const Tensor& dw, const Tensor& db) {
  const Geo g = geometry(p, x.shape, dw.shape);
  ConvQuery q = query(ConvPass::BackwardFilter, p, g, x.dtype, rows ? x.dtype : dy.dtype);
  const ConvChoice* c = &choice(ctx, q);
  if (rows && c->kernel != ConvKernel::FewChannels) return false;
  // mpx's AMX kernel and the few-channel kernel's bfloat16 dot products count as native 16-bit
  // math; not wanted (routed rows: never), conv_native_backward_filter only counts the op
  const bool own16 = c->kernel == ConvKernel::WgradAmx ||
                     (c->kernel == ConvKernel::FewChannels && q.in == q.out && conv_wgrad_small_dots(x.dtype));
  if (conv_native_backward_filter(ctx, p, x, dy, dw, db, c->kernel == ConvKernel::Native16, own16)) return true;
  if (c->kernel == ConvKernel::Native16) {
    q.native_refused = true;
    c = &choice(ctx, q);
  }
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  if (c->kernel == ConvKernel::FewChannels) {
    float* scratch = ctx.scratch(kSlotTmp0, conv_wgrad_small_scratch(g, omp_get_max_threads()));
    if (rows) {
      // Named once per shape beside the weight gradient's own entry (the plan is only the record).
      PlanKey k = conv_key(kConvRouted, p, g, static_cast<int64_t>(x.dtype));
      ctx.plan<Plan>(k, [&] {
        ctx.note_kernel(conv_what(fmt::format("convolution backward weights with {}", source).c_str(), g),
                        c->name + ", dy taken a row at a time as it is routed, never stored");
        return new Plan;
      });
      conv_wgrad_small(g, x.data, *rows, x.dtype, dwf, dbf, scratch);
    } else {
      conv_wgrad_small(g, x.data, dy.data, x.dtype, dwf, dbf, scratch);
    }
  } else if (c->kernel == ConvKernel::WgradAmx) {
    const int threads = omp_get_max_threads();
    const AmxSplit split = conv_wgrad_amx_split(g);
    float* scratch = ctx.scratch(kSlotTmp0, (conv_wgrad_amx_scratch_bytes(g, threads, split) + 3) / 4);
    conv_wgrad_amx(g, static_cast<const uint16_t*>(x.data), static_cast<const uint16_t*>(dy.data), dwf, dbf, scratch,
                   threads, split);
  } else if (c->kernel == ConvKernel::Winograd16 || c->kernel == ConvKernel::Winograd) {
    const bool direct = c->kernel == ConvKernel::Winograd16;
    WinoGeo wg{g.N, g.H, g.W, g.C, g.P, g.Q, g.K, p.pad_top, p.pad_left, c->tile, 0};
    wg.tiles_per_block = winograd_wgrad_tiles_per_block(wg);
    const void* xin = direct ? x.data : f32_in(ctx, kSlotX, x);
    const void* dyin = direct ? dy.data : f32_in(ctx, kSlotDY, dy);
    float* scratch = ctx.scratch(kSlotTmp0, winograd_wgrad_scratch(wg, omp_get_max_threads()));
    conv_winograd_wgrad(wg, xin, dyin, dwf, dbf, scratch, direct ? x.dtype : DType::F32);
  } else {
    const float* xf = f32_in(ctx, kSlotX, x);
    const float* dyf = f32_in(ctx, kSlotDY, dy);
    if (c->kernel == ConvKernel::Reference) {
      conv_backward_filter_loops(g, xf, dyf, dwf, dbf);
    } else if (c->kernel == ConvKernel::WgradGemm) {
      const WgradGeo wg = wgrad_geo(g);
      float* scratch = ctx.scratch(kSlotTmp0, wgrad_gemm_scratch(wg, omp_get_max_threads()));
      conv_wgrad_gemm(wg, xf, dyf, dwf, dbf, scratch);
    } else {
      // The bias gradient is a sum over dy's rows, faster in one vectorised pass than in
      // oneDNN's weight-gradient primitive (docs/cpu-performance.md, "The bias gradient").
      run_weight_gradient(ctx, conv_bwd_filter_plan(ctx, p, g, false), xf, dyf, dwf, nullptr);
      if (dbf) bias_gradient_rows(dyf, g.N * g.P * g.Q, g.K, dbf);
    }
  }
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
  return true;
}

}  // namespace

void conv2d_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                            const Tensor& dw, const Tensor& db) {
  backward_filter(ctx, p, x, dy, nullptr, nullptr, dw, db);
}

bool conv2d_backward_filter_routed(Context& ctx, const Conv2dParams& p, const Tensor& x, const WgradDyRows& rows,
                                   const Tensor& dw, const Tensor& db, const char* source) {
  return backward_filter(ctx, p, x, Tensor(), &rows, source, dw, db);
}

}  // namespace mpx::cpu
