// SPDX-License-Identifier: MIT
// Convolution forward / backward-data / backward-filter, NHWC with KRSC filters.
// 16-bit operands run on oneDNN's native 16-bit kernels where the CPU has them
// (conv_native.cpp); otherwise Winograd's transforms convert them as they read and write
// (conv_winograd.inc) where Winograd runs, and elsewhere they are widened into float32
// scratch, the float32 kernel runs, and 16-bit outputs are rounded once from its result.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <omp.h>

#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/conv/conv_loops.h"
#include "backend/cpu/conv/conv_native.h"
#include "backend/cpu/conv/conv_wgrad.h"
#include "backend/cpu/conv/conv_wgrad_small.h"
#include "backend/cpu/conv/conv_winograd.h"
#include "backend/cpu/dnnl_util.h"
#include "core/env.h"
#include "core/error.h"
#include "backend/cpu/ops.h"

namespace mpx::cpu {

namespace {

using namespace conv_detail;

// ---- oneDNN primitives ----------------------------------------------------------------

enum ConvOp : int64_t {
  kConvFwd = 101,
  kConvBwdData = 102,
  kConvBwdFilter = 103,
  kConvWgradChoice = 104,
  kConvWgradSmall = 108,
  kConvFwdSmall = 109
};

PlanKey conv_key(ConvOp op, const Conv2dParams& p, const Geo& g, int64_t flags) {
  PlanKey k;
  k << op << g.N << g.H << g.W << g.C << g.K << g.R << g.S << p.stride_h << p.stride_w << p.pad_top << p.pad_left
    << p.pad_bottom << p.pad_right << flags;
  return k;
}

// Activations in NHWC in place, or in oneDNN's blocked layout (nChw8c on AVX2) with
// reorders from/to NHWC around the primitive. Measured on AVX2 (2 threads): blocked is
// ~2x faster for C=64->K=128 3x3 even with the reorders, slower for the first layer
// (C = 1 or 3). Default: blocked when C and K are multiples of 8 and >= 16;
// MPX_CONV_BLOCKED=0/1 forces one or the other.
bool blocked_activations(const Geo& g) {
  static const int force = env_string("MPX_CONV_BLOCKED").empty() ? -1 : env_flag("MPX_CONV_BLOCKED") ? 1 : 0;
  if (force >= 0) return force == 1;
  return g.C >= 16 && g.K >= 16 && g.C % 8 == 0 && g.K % 8 == 0;
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
  const bool blk = blocked_activations(g);
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
      plan->prim = dnnl::convolution_forward(pd);
      plan->add_arg(ctx, DNNL_ARG_SRC, d.src, pd.src_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_WEIGHTS, d.wei, pd.weights_desc(), false);
      if (bias) plan->args[DNNL_ARG_BIAS] = unbound(d.bias, ctx.engine());
      plan->add_arg(ctx, DNNL_ARG_DST, d.dst, pd.dst_desc(), true);
      plan->set_scratchpad(ctx, pd);
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
      plan->prim = dnnl::convolution_backward_data(pd);
      plan->add_arg(ctx, DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_WEIGHTS, d.wei, pd.weights_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_DIFF_SRC, d.src, pd.diff_src_desc(), true);
      plan->set_scratchpad(ctx, pd);
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
      plan->prim = dnnl::convolution_backward_weights(pd);
      plan->add_arg(ctx, DNNL_ARG_SRC, d.src, pd.src_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_DIFF_WEIGHTS, d.wei, pd.diff_weights_desc(), true);
      if (bias) plan->args[DNNL_ARG_DIFF_BIAS] = unbound(d.bias, ctx.engine());
      plan->set_scratchpad(ctx, pd);
      return plan.release();
    });
  });
}

// ---- the weight gradient: oneDNN's kernel or mpx's GEMM one (conv_wgrad.cpp) ---------------

// The weight-gradient kernels: MPX_CONV_WGRAD (wgrad_mode(), conv_wgrad.h) picks among the
// few-channel kernel (use_wgrad_small), oneDNN's, and mpx's GEMM kernel, which "auto" runs
// where wgrad_gemm_rule() (conv_wgrad.cpp) says: a fixed rule by shape and ISA, so that a run
// and its resume compute the same bits (docs/cpu-performance.md).

struct WgradChoice : Plan {
  bool gemm = false;
};

WgradGeo wgrad_geo(const Geo& g) { return {g.N, g.H, g.W, g.C, g.K, g.R, g.S, g.P, g.Q, g.pt, g.pl}; }

void run_wgrad_gemm(Context& ctx, const Geo& g, const float* x, const float* dy, float* dw, float* db) {
  const WgradGeo wg = wgrad_geo(g);
  float* scratch = ctx.scratch(kSlotTmp0, wgrad_gemm_scratch(wg, omp_get_max_threads()));
  conv_wgrad_gemm(wg, x, dy, dw, db, scratch);
}

/// Whether this shape's weight gradient runs the GEMM kernel; the choice is recorded with
/// the kernels on the first call of each shape.
bool use_wgrad_gemm(Context& ctx, const Conv2dParams& p, const Geo& g) {
  const WgradMode mode = wgrad_mode();
  if (mode == WgradMode::Default || mode == WgradMode::OneDnn ||
      !wgrad_gemm_applies(wgrad_geo(g), p.stride_h, p.stride_w))
    return false;
  bool made = false;
  WgradChoice& c = ctx.plan<WgradChoice>(conv_key(kConvWgradChoice, p, g, 0), [&] {
    made = true;
    return new WgradChoice;
  });
  if (!made) return c.gemm;
  c.gemm = mode == WgradMode::Gemm || wgrad_gemm_rule(wgrad_geo(g));
  if (c.gemm)
    ctx.note_kernel(conv_what("convolution backward weights", g),
                    mode == WgradMode::Gemm ? "gemm:sgemm (MPX_CONV_WGRAD=gemm)" : "gemm:sgemm (MPX_CONV_WGRAD=auto)");
  return c.gemm;
}

struct WgradSmallNoted : Plan {};

/// Whether this weight gradient runs conv_wgrad_small's loop: its shapes (the first layers),
/// x and dy of one dtype, and MPX_CONV_WGRAD unset or auto (onednn and gemm ask for those
/// kernels). Records the kernel once per shape and dtype.
bool use_wgrad_small(Context& ctx, const Conv2dParams& p, const Geo& g, const Tensor& x, const Tensor& dy) {
  const WgradMode mode = wgrad_mode();
  if (!(mode == WgradMode::Default || mode == WgradMode::Auto) || reference_loops() || x.dtype != dy.dtype || !conv_wgrad_small_applies(g)) return false;
  ctx.plan<WgradSmallNoted>(conv_key(kConvWgradSmall, p, g, static_cast<int64_t>(x.dtype)), [&] {
    ctx.note_kernel(conv_what("convolution backward weights", g),
                    fmt::format("mpx:few-channels {}{}", conv_wgrad_small_isa(),
                                is_16bit(x.dtype) ? fmt::format(", {} rows widened in cache", dtype_name(x.dtype))
                                                  : std::string()));
    return new WgradSmallNoted;
  });
  return true;
}

struct FwdSmallNoted : Plan {};

/// Whether this forward convolution runs conv_fwd_small's loop: its shapes (the first layers),
/// 16-bit x and y of one dtype (it rounds the output once in cache, where oneDNN's float32
/// kernel needs a separate rounding pass; in float32 oneDNN's kernel is the faster one), no
/// activation other than relu, no pre-activation kept, and MPX_CONV_FORWARD unset or auto.
/// Records the kernel once per shape and dtype.
bool use_fwd_small(Context& ctx, const Conv2dParams& p, const Geo& g, const Tensor& x, const Tensor& y,
                   Activation act, const Tensor& pre) {
  // The switch first: a bad value is exit 2 on every net with a convolution.
  if (!conv_fwd_small_enabled() || !is_16bit(y.dtype) || x.dtype != y.dtype || !pre.empty() ||
      !(act.is_none() || act.kind == ActKind::Relu) || reference_loops() || !conv_fwd_small_applies(g))
    return false;
  ctx.plan<FwdSmallNoted>(conv_key(kConvFwdSmall, p, g, static_cast<int64_t>(x.dtype)), [&] {
    ctx.note_kernel(conv_what("convolution forward", g),
                    fmt::format("mpx:few-channels {}, {} rounded once per row", conv_fwd_small_isa(),
                                dtype_name(x.dtype)));
    return new FwdSmallNoted;
  });
  return true;
}

/// Whether 16-bit activations a and b (of one dtype) can go to the Winograd kernel as they
/// are: no float32 copies, the same bits as the widened path (docs/cpu-performance.md,
/// "16-bit without native math"). Whether Winograd runs for the shape is winograd_tile()'s.
bool wino_direct(const Tensor& a, const Tensor& b) {
  return is_16bit(a.dtype) && a.dtype == b.dtype && !reference_loops();
}

}  // namespace

// ---- ops ---------------------------------------------------------------------------
// 16-bit operands on oneDNN's native 16-bit kernels where the CPU has them (conv_native.cpp);
// otherwise float32 math in oneDNN, 16-bit tensors through float32 scratch (f32_in/f32_out)
// and rounded once on the way out. The plain loops above are kept for
// MPX_CPU_REFERENCE=1 (reference_loops(), context.h: debugging a suspected oneDNN problem).

void conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Tensor& y, Activation act, const Tensor& pre) {
  if (conv_native_forward(ctx, p, x, w, bias, y, act, pre)) return;
  const Geo g = geometry(p, x.shape, w.shape);
  const bool wino_relu = act.kind == ActKind::Relu && pre.empty();  // Winograd's relu keeps NaN
  const float* wf = f32_in(ctx, kSlotW, w);
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  if (wino_direct(x, y) && pre.empty() && (act.is_none() || wino_relu) &&
      winograd_forward(ctx, p, g, x.data, wf, bf, wino_relu, y.data, x.dtype))
    return;
  if (use_fwd_small(ctx, p, g, x, y, act, pre)) {
    float* scratch = ctx.scratch(kSlotTmp0, conv_fwd_small_scratch(g, omp_get_max_threads()));
    conv_fwd_small(g, x.data, wf, bf, act.kind == ActKind::Relu, y.data, x.dtype, scratch);
    return;
  }
  const float* xf = f32_in(ctx, kSlotX, x);
  float* yf = f32_out(ctx, kSlotY, y);
  if (reference_loops()) {
    conv_forward_loops(g, xf, wf, bf, yf);
    activation_epilogue(act, yf, y, pre);
    return;
  }
  if (winograd_forward(ctx, p, g, xf, wf, bf, wino_relu, yf)) {
    activation_epilogue(wino_relu ? Activation::None : act, yf, y, pre);
    return;
  }
  const Activation fused = conv_post_op(act, pre);
  DnnlPlan& plan = conv_fwd_plan(ctx, p, g, bf != nullptr, fused);
  plan.bind(DNNL_ARG_SRC, xf);
  plan.bind(DNNL_ARG_WEIGHTS, wf);
  if (bf) plan.bind(DNNL_ARG_BIAS, bf);
  plan.bind(DNNL_ARG_DST, yf);
  plan.run(ctx);
  activation_epilogue(fused.is_none() ? act : Activation::None, yf, y, pre);
}

void conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                          const Tensor& dx) {
  if (conv_native_backward_data(ctx, p, dy, w, dx)) return;
  const Geo g = geometry(p, dx.shape, w.shape);
  const float* wf = f32_in(ctx, kSlotW, w);
  if (wino_direct(dy, dx) && winograd_backward_data(ctx, p, g, dy.data, wf, dx.data, dy.dtype)) return;
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  float* dxf = f32_out(ctx, kSlotDX, dx);
  if (reference_loops()) {
    conv_backward_data_loops(g, dyf, wf, dxf);
  } else if (!winograd_backward_data(ctx, p, g, dyf, wf, dxf)) {
    DnnlPlan& plan = conv_bwd_data_plan(ctx, p, g);
    plan.bind(DNNL_ARG_DIFF_DST, dyf);
    plan.bind(DNNL_ARG_WEIGHTS, wf);
    plan.bind(DNNL_ARG_DIFF_SRC, dxf);
    plan.run(ctx);
  }
  f32_commit(dxf, dx);
}

void conv2d_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                            const Tensor& dw, const Tensor& db) {
  if (conv_native_backward_filter(ctx, p, x, dy, dw, db)) return;
  const Geo g = geometry(p, x.shape, dw.shape);
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  if (use_wgrad_small(ctx, p, g, x, dy)) {
    float* scratch = ctx.scratch(kSlotTmp0, conv_wgrad_small_scratch(g, omp_get_max_threads()));
    conv_wgrad_small(g, x.data, dy.data, x.dtype, dwf, dbf, scratch);
  } else if (!(wino_direct(x, dy) && winograd_backward_filter(ctx, p, g, x.data, dy.data, dwf, dbf, x.dtype))) {
    const float* xf = f32_in(ctx, kSlotX, x);
    const float* dyf = f32_in(ctx, kSlotDY, dy);
    if (reference_loops()) {
      conv_backward_filter_loops(g, xf, dyf, dwf, dbf);
    } else if (!winograd_backward_filter(ctx, p, g, xf, dyf, dwf, dbf)) {
      if (use_wgrad_gemm(ctx, p, g)) {
        run_wgrad_gemm(ctx, g, xf, dyf, dwf, dbf);
      } else {
        // The bias gradient is a sum over dy's rows, faster in one vectorised pass than in
        // oneDNN's weight-gradient primitive (docs/cpu-performance.md, "The bias gradient").
        run_weight_gradient(ctx, conv_bwd_filter_plan(ctx, p, g, false), xf, dyf, dwf, nullptr);
        if (dbf) bias_gradient_rows(dyf, g.N * g.P * g.Q, g.K, dbf);
      }
    }
  }
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
}

}  // namespace mpx::cpu
