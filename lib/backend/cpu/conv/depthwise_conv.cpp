// SPDX-License-Identifier: MIT
// Depthwise convolution (Keras DepthwiseConv2D): a grouped convolution with one group per
// input channel, NHWC, filters [C*M, R, S, 1]. The plain loops come first (the reference,
// and what MPX_CPU_REFERENCE=1 runs); then oneDNN's grouped convolution in float32, with
// 16-bit operands widened into float32 scratch and 16-bit outputs rounded once.
#include <memory>
#include <string>

#include "backend/cpu/dnnl_util.h"
#include "backend/cpu/ops.h"

namespace mpx::cpu {

namespace {

/// x [N,H,W,C], w [K = C*M, R, S, 1], y [N,P,Q,K]; output channel k reads input channel k / M.
struct DwGeo {
  int64_t N, H, W, C, M, K, R, S, P, Q;
  int64_t sh, sw, pt, pl;
};

DwGeo dw_geometry(const Conv2dParams& p, const Shape& x, const Shape& w) {
  DwGeo g{};
  g.N = x[0], g.H = x[1], g.W = x[2], g.C = x[3];
  g.K = w[0], g.R = w[1], g.S = w[2];
  g.M = g.K / g.C;
  g.P = p.out_h(static_cast<int>(g.H));
  g.Q = p.out_w(static_cast<int>(g.W));
  g.sh = p.stride_h, g.sw = p.stride_w, g.pt = p.pad_top, g.pl = p.pad_left;
  return g;
}

// ---- the plain loops (float32) ---------------------------------------------------------

void dw_forward_loops(const DwGeo& g, const float* x, const float* w, const float* b, float* y) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t p = 0; p < g.P; ++p)
      for (int64_t q = 0; q < g.Q; ++q)
        for (int64_t k = 0; k < g.K; ++k) {
          const int64_t c = k / g.M;
          float acc = 0.0f;
          for (int64_t r = 0; r < g.R; ++r) {
            const int64_t h = p * g.sh - g.pt + r;
            if (h < 0 || h >= g.H) continue;
            for (int64_t s = 0; s < g.S; ++s) {
              const int64_t v = q * g.sw - g.pl + s;
              if (v < 0 || v >= g.W) continue;
              acc += x[((n * g.H + h) * g.W + v) * g.C + c] * w[(k * g.R + r) * g.S + s];
            }
          }
          y[((n * g.P + p) * g.Q + q) * g.K + k] = acc + (b ? b[k] : 0.0f);
        }
}

void dw_backward_data_loops(const DwGeo& g, const float* dy, const float* w, float* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < g.N; ++n) {  // each image's dx is its own: no two threads add into one element
    float* dxn = dx + n * g.H * g.W * g.C;
    for (int64_t i = 0; i < g.H * g.W * g.C; ++i) dxn[i] = 0.0f;
    for (int64_t p = 0; p < g.P; ++p)
      for (int64_t q = 0; q < g.Q; ++q)
        for (int64_t k = 0; k < g.K; ++k) {
          const float d = dy[((n * g.P + p) * g.Q + q) * g.K + k];
          const int64_t c = k / g.M;
          for (int64_t r = 0; r < g.R; ++r) {
            const int64_t h = p * g.sh - g.pt + r;
            if (h < 0 || h >= g.H) continue;
            for (int64_t s = 0; s < g.S; ++s) {
              const int64_t v = q * g.sw - g.pl + s;
              if (v < 0 || v >= g.W) continue;
              dxn[(h * g.W + v) * g.C + c] += d * w[(k * g.R + r) * g.S + s];
            }
          }
        }
  }
}

void dw_backward_filter_loops(const DwGeo& g, const float* x, const float* dy, float* dw, float* db) {
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < g.K; ++k) {
    const int64_t c = k / g.M;
    for (int64_t r = 0; r < g.R; ++r)
      for (int64_t s = 0; s < g.S; ++s) {
        float acc = 0.0f;
        for (int64_t n = 0; n < g.N; ++n)
          for (int64_t p = 0; p < g.P; ++p) {
            const int64_t h = p * g.sh - g.pt + r;
            if (h < 0 || h >= g.H) continue;
            for (int64_t q = 0; q < g.Q; ++q) {
              const int64_t v = q * g.sw - g.pl + s;
              if (v < 0 || v >= g.W) continue;
              acc += x[((n * g.H + h) * g.W + v) * g.C + c] * dy[((n * g.P + p) * g.Q + q) * g.K + k];
            }
          }
        dw[(k * g.R + r) * g.S + s] = acc;
      }
    if (db) {
      float acc = 0.0f;
      for (int64_t i = 0; i < g.N * g.P * g.Q; ++i) acc += dy[i * g.K + k];
      db[k] = acc;
    }
  }
}

// ---- oneDNN's grouped convolution --------------------------------------------------------

enum DwOp : int64_t { kDwFwd = 131, kDwBwdData = 132, kDwBwdFilter = 133 };

PlanKey dw_key(DwOp op, const Conv2dParams& p, const DwGeo& g, bool bias) {
  PlanKey k;
  k << op << g.N << g.H << g.W << g.C << g.K << g.R << g.S << p.stride_h << p.stride_w << p.pad_top << p.pad_left
    << p.pad_bottom << p.pad_right << (bias ? 1 : 0);
  return k;
}

// x NHWC, w [C*M, R, S, 1] (oneDNN's grouped "gohwi": C groups of M outputs, 1 input), y NHWC.
struct DwDescs {
  dnnl::memory::desc src, wei, wei_any, bias, dst;
  dnnl::memory::dims strides, pad_l, pad_r;
};

DwDescs dw_descs(const Conv2dParams& p, const DwGeo& g) {
  DwDescs d;
  d.src = dnnl::memory::desc({g.N, g.C, g.H, g.W}, dt::f32, tag::nhwc);
  d.wei = dnnl::memory::desc({g.C, g.M, 1, g.R, g.S}, dt::f32, tag::gohwi);
  d.wei_any = dnnl::memory::desc({g.C, g.M, 1, g.R, g.S}, dt::f32, tag::any);  // its JIT kernels' blocked layout
  d.bias = dnnl::memory::desc({g.K}, dt::f32, tag::x);
  d.dst = dnnl::memory::desc({g.N, g.K, g.P, g.Q}, dt::f32, tag::nhwc);
  d.strides = {p.stride_h, p.stride_w};
  d.pad_l = {p.pad_top, p.pad_left};
  d.pad_r = {p.pad_bottom, p.pad_right};
  return d;
}

std::string dw_what(const char* op, const DwGeo& g) {
  return std::string(op) + " for x [" + std::to_string(g.N) + ", " + std::to_string(g.H) + ", " +
         std::to_string(g.W) + ", " + std::to_string(g.C) + "], w [" + std::to_string(g.K) + ", " +
         std::to_string(g.R) + ", " + std::to_string(g.S) + ", 1]";
}

dnnl::convolution_forward::primitive_desc dw_fwd_pd(Context& ctx, const DwDescs& d, bool bias) {
  return dnnlc::conv_fwd(ctx.engine(), d.src, d.wei_any, bias ? &d.bias : nullptr, d.dst, d.strides, d.pad_l,
                         d.pad_r, make_attr());
}

DnnlPlan& dw_fwd_plan(Context& ctx, const Conv2dParams& p, const DwGeo& g, bool bias) {
  return ctx.plan<DnnlPlan>(dw_key(kDwFwd, p, g, bias), [&] {
    return dnnl_try(dw_what("depthwise convolution forward", g), [&] {
      auto plan = std::make_unique<DnnlPlan>();
      const DwDescs d = dw_descs(p, g);
      const auto pd = dw_fwd_pd(ctx, d, bias);
      plan->set_forward<dnnl::convolution_forward>(ctx, pd, d.src, d.wei, bias ? &d.bias : nullptr, d.dst);
      return plan.release();
    });
  });
}

DnnlPlan& dw_bwd_data_plan(Context& ctx, const Conv2dParams& p, const DwGeo& g) {
  return ctx.plan<DnnlPlan>(dw_key(kDwBwdData, p, g, false), [&] {
    return dnnl_try(dw_what("depthwise convolution backward data", g), [&] {
      auto plan = std::make_unique<DnnlPlan>();
      const DwDescs d = dw_descs(p, g);
      const auto hint = dw_fwd_pd(ctx, d, false);
      const auto pd = dnnlc::conv_bwd_data(ctx.engine(), d.src, d.wei_any, d.dst, d.strides, d.pad_l, d.pad_r, hint,
                                           make_attr());
      plan->set_backward_data<dnnl::convolution_backward_data>(ctx, pd, d.dst, d.wei, d.src);
      return plan.release();
    });
  });
}

DnnlPlan& dw_bwd_filter_plan(Context& ctx, const Conv2dParams& p, const DwGeo& g, bool bias) {
  return ctx.plan<DnnlPlan>(dw_key(kDwBwdFilter, p, g, bias), [&] {
    return dnnl_try(dw_what("depthwise convolution backward weights", g), [&] {
      auto plan = std::make_unique<DnnlPlan>();
      const DwDescs d = dw_descs(p, g);
      const auto hint = dw_fwd_pd(ctx, d, bias);
      const auto pd = dnnlc::conv_bwd_weights(ctx.engine(), d.src, d.wei_any, bias ? &d.bias : nullptr, d.dst,
                                              d.strides, d.pad_l, d.pad_r, hint, make_attr());
      plan->set_weight_gradient<dnnl::convolution_backward_weights>(ctx, pd, d.src, d.dst, d.wei,
                                                                    bias ? &d.bias : nullptr);
      return plan.release();
    });
  });
}

}  // namespace

// ---- ops (op_table.inc) -----------------------------------------------------------------

void depthwise_conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w,
                              const Tensor& bias, const Tensor& y, Activation act, const Tensor& pre) {
  const DwGeo g = dw_geometry(p, x.shape, w.shape);
  const float* xf = f32_in(ctx, kSlotX, x);
  const float* wf = f32_in(ctx, kSlotW, w);
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  float* yf = f32_out(ctx, kSlotY, y);
  if (reference_loops()) {
    dw_forward_loops(g, xf, wf, bf, yf);
  } else {
    run_forward(ctx, dw_fwd_plan(ctx, p, g, bf != nullptr), xf, wf, bf, yf);
  }
  activation_epilogue(act, yf, y, pre);  // pre, act and the one rounding of a 16-bit y
}

void depthwise_conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                                    const Tensor& dx) {
  const DwGeo g = dw_geometry(p, dx.shape, w.shape);
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  const float* wf = f32_in(ctx, kSlotW, w);
  float* dxf = f32_out(ctx, kSlotDX, dx);
  if (reference_loops()) {
    dw_backward_data_loops(g, dyf, wf, dxf);
  } else {
    run_backward_data(ctx, dw_bwd_data_plan(ctx, p, g), dyf, wf, dxf);
  }
  f32_commit(dxf, dx);
}

void depthwise_conv2d_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                                      const Tensor& dw, const Tensor& db) {
  const DwGeo g = dw_geometry(p, x.shape, dw.shape);
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  if (g.N == 0) {  // an empty batch has zero gradients
    for (int64_t i = 0; i < dw.numel(); ++i) dwf[i] = 0.0f;
    for (int64_t i = 0; dbf && i < db.numel(); ++i) dbf[i] = 0.0f;
  } else {
    const float* xf = f32_in(ctx, kSlotX, x);
    const float* dyf = f32_in(ctx, kSlotDY, dy);
    if (reference_loops()) {
      dw_backward_filter_loops(g, xf, dyf, dwf, dbf);
    } else {
      run_weight_gradient(ctx, dw_bwd_filter_plan(ctx, p, g, dbf != nullptr), xf, dyf, dwf, dbf);
    }
  }
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
}

}  // namespace mpx::cpu
