// SPDX-License-Identifier: MIT
// Max/average pooling (NHWC, asymmetric padding; average excludes padding from
// the divisor as Keras does), forward and backward; global average pooling is in
// global_pool.cpp.
//
// Average pooling (pooling_avg_exclude_padding) forward/backward and global average
// pooling's float32 forward (average pooling with an H x W window) run oneDNN pooling, one
// cached plan per shape.
// Average pooling backward measured 1.3-1.6x the time of our loop (2x2/2 on
// [256, 26, 26, 32]: ~12 ms vs ~8-9.5 ms, 2 threads); no config uses average pooling,
// and oneDNN is the project's choice for CPU primitives, so it is the default (MPX_CPU_REFERENCE=1: the loop). Max
// pooling stays ours: oneDNN 2.6's max pooling drops NaN (a window holding NaN yields
// the largest other value, and dy goes there) and yields -FLT_MAX for a window of
// -inf, while the backend's rule is "first maximum, NaN wins" (backend.h) so that
// check_numerics sees a NaN. (Ties do go to the first maximum in oneDNN as well.) It is
// also slower at the smoke shape [256, 26, 26, 32], 2x2/2, 2 threads: forward_training
// ~36 ms vs ~8 ms here, backward (forward again for the workspace, then backward)
// ~64-68 ms vs ~46-64 ms here.
// MPX_CPU_REFERENCE=1 keeps the plain loops for everything.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include <omp.h>

#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/conv/conv_wgrad_small.h"
#include "backend/cpu/dnnl_util.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/pool/pool_tiled.h"
#include "backend/pool_geometry.h"

namespace mpx::cpu {

namespace {

using PGeo = PoolGeometry;  // backend/pool_geometry.h

constexpr int64_t kChan = 256;  // channels per max-pool backward chunk (stack arrays)

// "First maximum": strict >, scanning rows then columns; NaN wins and stays.
inline bool takes(float v, float m) { return v > m || (std::isnan(v) && !std::isnan(m)); }

// ---- max pooling with non-overlapping windows (stride = window, no padding) ---------
// The common case (Keras MaxPooling2D default). Every input position belongs to at
// most one window, so backward writes each dx element exactly once (dy at the window's
// first maximum, 0 elsewhere, 0 for the rows/columns no window covers) instead of a
// memset plus a scatter, and both directions run over channels in branch-free loops
// the compiler vectorizes. Same "first maximum, NaN wins" rule as takes().

// Every window must lie inside the image: with padding at the bottom/right (Keras "same"
// on an odd size, e.g. 7x7 -> 4x4) the last window would read past the row or the image.
bool tiled_max(const PoolParams& p, const PGeo& g) {
  return p.kind == PoolKind::Max && g.sh == g.R && g.sw == g.S && g.pt == 0 && g.pl == 0 && g.R * g.S <= 64 &&
         g.P * g.R <= g.H && g.Q * g.S <= g.W;
}

namespace base {
#include "backend/cpu/pool/pool_tiled.inc"
}  // namespace base


// The widest build cpuid allows (AVX-512F, else AVX2), unless MPX_CPU_BASELINE=1 (tests
// compare the builds) or MPX_CPU_POOL_ISA=avx2 (caps it at AVX2).
enum class PoolIsa { Base, Avx2, Avx512 };
PoolIsa pool_isa() {  // the switches (switches.h) are read at each call: the tests switch them
  static const PoolIsa hw = __builtin_cpu_supports("avx") && __builtin_cpu_supports("avx2")
                                ? (__builtin_cpu_supports("avx512f") ? PoolIsa::Avx512 : PoolIsa::Avx2)
                                : PoolIsa::Base;
  if (hw == PoolIsa::Base || pool_baseline()) return PoolIsa::Base;
  if (hw == PoolIsa::Avx512 && pool_capped_avx2()) return PoolIsa::Avx2;
  return hw;
}

void tiled_max_forward_dispatch(const PGeo& g, const void* x, void* y, DType dt, uint8_t* argmax = nullptr) {
  const TiledGeo t{g.N, g.H, g.W, g.C, g.P, g.Q, g.R, g.S};
  switch (pool_isa()) {
    case PoolIsa::Avx512: return avx512::tiled_max_forward(t, x, y, dt, argmax);
    case PoolIsa::Avx2: return avx2::tiled_max_forward(t, x, y, dt, argmax);
    case PoolIsa::Base: return base::tiled_max_forward(t, x, y, dt, argmax);
  }
}

void tiled_max_backward_argmax_dispatch(const PGeo& g, const void* y, const uint8_t* argmax, const void* dy,
                                        void* dx, bool relu, DType dt) {
  const TiledGeo t{g.N, g.H, g.W, g.C, g.P, g.Q, g.R, g.S};
  switch (pool_isa()) {
    case PoolIsa::Avx512: return avx512::tiled_max_backward_argmax(t, y, argmax, dy, dx, relu, dt);
    case PoolIsa::Avx2: return avx2::tiled_max_backward_argmax(t, y, argmax, dy, dx, relu, dt);
    case PoolIsa::Base: return base::tiled_max_backward_argmax(t, y, argmax, dy, dx, relu, dt);
  }
}

void tiled_max_backward_dispatch(const PGeo& g, const void* x, const void* dy, void* dx, bool relu, DType dt) {
  const TiledGeo t{g.N, g.H, g.W, g.C, g.P, g.Q, g.R, g.S};
  switch (pool_isa()) {
    case PoolIsa::Avx512: return avx512::tiled_max_backward(t, x, dy, dx, relu, dt);
    case PoolIsa::Avx2: return avx2::tiled_max_backward(t, x, dy, dx, relu, dt);
    case PoolIsa::Base: return base::tiled_max_backward(t, x, dy, dx, relu, dt);
  }
}

// ---- oneDNN average pooling ------------------------------------------------------------

enum PoolOp : int64_t { kAvgPoolFwd = 401, kAvgPoolBwd = 402 };

/// x [N,H,W,C] and y [N,P,Q,C] in NHWC (the user layout, used in place: oneDNN's jit
/// pooling runs on nhwc directly).
struct AvgGeo {
  int64_t N, H, W, C, P, Q, R, S, sh, sw, pt, pl, pb, pr;
};

AvgGeo avg_geo(const PoolParams& p, const PGeo& g) {
  return {g.N, g.H, g.W, g.C, g.P, g.Q, g.R, g.S, g.sh, g.sw, g.pt, g.pl, p.pad_bottom, p.pad_right};
}

/// Global average pooling: one H x W window per image, y [N, C] = [N, 1, 1, C].
AvgGeo gap_geo(const Shape& x) {
  return {x[0], x[1], x[2], x[3], 1, 1, x[1], x[2], 1, 1, 0, 0, 0, 0};  // stride 1: any, one window
}

std::string avg_what(const char* op, const AvgGeo& a) {
  return std::string(op) + " for x [" + std::to_string(a.N) + ", " + std::to_string(a.H) + ", " +
         std::to_string(a.W) + ", " + std::to_string(a.C) + "], window " + std::to_string(a.R) + "x" +
         std::to_string(a.S) + ", stride " + std::to_string(a.sh) + "x" + std::to_string(a.sw);
}

DnnlPlan& avg_pool_plan(Context& ctx, const AvgGeo& a, bool backward) {
  PlanKey k;
  k << (backward ? kAvgPoolBwd : kAvgPoolFwd) << a.N << a.H << a.W << a.C << a.R << a.S << a.sh << a.sw << a.pt
    << a.pl << a.pb << a.pr;
  return ctx.plan<DnnlPlan>(k, [&] {
    return dnnl_try(avg_what(backward ? "average pooling backward" : "average pooling forward", a), [&] {
      auto plan = std::make_unique<DnnlPlan>();
      const dnnl::memory::desc src({a.N, a.C, a.H, a.W}, dt::f32, tag::nhwc);
      const dnnl::memory::desc dst({a.N, a.C, a.P, a.Q}, dt::f32, tag::nhwc);
      const dnnl::memory::dims strides{a.sh, a.sw}, kernel{a.R, a.S}, pad_l{a.pt, a.pl}, pad_r{a.pb, a.pr};
      const auto alg = dnnl::algorithm::pooling_avg_exclude_padding;  // Keras: padding not in the divisor
      const auto fwd = dnnlc::pool_fwd(ctx.engine(), alg, src, dst, strides, kernel, pad_l, pad_r, make_attr());
      if (!backward) {
        plan->prim = dnnl::pooling_forward(fwd);
        plan->add_arg(ctx, DNNL_ARG_SRC, src, fwd.src_desc(), false);
        plan->add_arg(ctx, DNNL_ARG_DST, dst, fwd.dst_desc(), true);
        plan->set_scratchpad(ctx, fwd);
      } else {
        const auto bwd = dnnlc::pool_bwd(ctx.engine(), alg, src, dst, strides, kernel, pad_l, pad_r, fwd, make_attr());
        plan->prim = dnnl::pooling_backward(bwd);
        plan->add_arg(ctx, DNNL_ARG_DIFF_DST, dst, bwd.diff_dst_desc(), false);
        plan->add_arg(ctx, DNNL_ARG_DIFF_SRC, src, bwd.diff_src_desc(), true);
        plan->set_scratchpad(ctx, bwd);
      }
      return plan.release();
    });
  });
}

void avg_pool_dnnl(Context& ctx, const AvgGeo& a, const float* in, float* out, bool backward) {
  DnnlPlan& plan = avg_pool_plan(ctx, a, backward);
  plan.bind(backward ? DNNL_ARG_DIFF_DST : DNNL_ARG_SRC, in);
  plan.bind(backward ? DNNL_ARG_DIFF_SRC : DNNL_ARG_DST, out);
  plan.run(ctx);
}

}  // namespace

void gap_forward_bf16_dispatch(int64_t N, int64_t HW, int64_t C, const uint16_t* x, float* y) {
  switch (pool_isa()) {
    case PoolIsa::Avx512: return avx512::gap_forward_bf16(N, HW, C, x, y);
    case PoolIsa::Avx2: return avx2::gap_forward_bf16(N, HW, C, x, y);
    case PoolIsa::Base: return base::gap_forward_bf16(N, HW, C, x, y);
  }
}

void global_avg_pool_dnnl(Context& ctx, const Shape& x, const float* xf, float* yf) {
  avg_pool_dnnl(ctx, gap_geo(x), xf, yf, false);
}

bool max_pool_keeps_argmax(const PoolParams& pp, const Shape& x) {
  return pp.kind == PoolKind::Max && !reference_loops() && tiled_max(pp, pool_geometry(pp, x));
}

// Backend::pool_forward and the backward ops checked the geometry (max_pool_keeps_argmax), the
// argmax's dtype and shape and the tensors' common dtype before calling these.
void max_pool_forward_argmax(const PoolParams& pp, const Tensor& x, const Tensor& y, const Tensor& argmax) {
  tiled_max_forward_dispatch(pool_geometry(pp, x.shape), x.data, y.data, x.dtype, static_cast<uint8_t*>(argmax.data));
}

void max_pool_backward_argmax(const PoolParams& pp, const Tensor& y, const Tensor& argmax, const Tensor& dy,
                              const Tensor& dx, bool relu_input) {
  tiled_max_backward_argmax_dispatch(pool_geometry(pp, dx.shape), y.data, static_cast<const uint8_t*>(argmax.data),
                                     dy.data, dx.data, relu_input, dx.dtype);
}

namespace {

/// What max_pool_conv_backward's rows are routed from, and the build that routes them.
struct PoolRoute {
  using RowFn = void (*)(const TiledGeo&, const void*, const uint8_t*, const void*, void*, int64_t, int64_t, bool,
                         DType);
  TiledGeo t;
  const void *y, *dy;
  const uint8_t* argmax;
  DType dt;
  RowFn row;
};

/// WgradDyRows::fill: row `row` of the pooling's dx (image row / H, its row row % H), relu included.
void route_row(const void* ctx, int64_t row, void* dst) {
  const auto& r = *static_cast<const PoolRoute*>(ctx);
  r.row(r.t, r.y, r.argmax, r.dy, dst, row / r.t.H, row % r.t.H, true, r.dt);
}

}  // namespace

bool max_pool_conv_backward(Context& ctx, const PoolParams& pp, const Tensor& x, const Tensor& y, const Tensor& dy,
                            const Tensor& argmax, const Conv2dParams& cp, const Tensor& conv_x, const Tensor& conv_dw,
                            const Tensor& conv_db) {
  if (argmax.empty()) return false;
  const PGeo g = pool_geometry(pp, x.shape);
  const PoolIsa isa = pool_isa();
  const PoolRoute r{{g.N, g.H, g.W, g.C, g.P, g.Q, g.R, g.S},
                    y.data,
                    dy.data,
                    static_cast<const uint8_t*>(argmax.data),
                    x.dtype,
                    isa == PoolIsa::Avx512 ? &avx512::tiled_max_backward_argmax_row
                    : isa == PoolIsa::Avx2 ? &avx2::tiled_max_backward_argmax_row
                                           : &base::tiled_max_backward_argmax_row};
  return conv2d_backward_filter_routed(ctx, cp, conv_x, WgradDyRows{&route_row, &r}, conv_dw, conv_db,
                                       "max pooling's backward");
}

namespace {

/// What conv_max_pool_forward's windows are pooled into, and the build that pools them.
struct PoolSink {
  using RowFn = void (*)(const TiledGeo&, const void*, void*, uint8_t*, DType);
  TiledGeo row;  // one output row's geometry: N = P = 1, H = R
  char* y;
  uint8_t* argmax;  // null: no window positions (an evaluation's forward)
  int64_t y_row_bytes, argmax_row;
  DType dt;
  RowFn fn;
};

/// FwdPoolRows::take: output row `row` (image row / P, its row row % P) from its R input rows.
void pool_rows(const void* ctx, int64_t row, const void* src) {
  const auto& k = *static_cast<const PoolSink*>(ctx);
  k.fn(k.row, src, k.y + row * k.y_row_bytes, k.argmax ? k.argmax + row * k.argmax_row : nullptr, k.dt);
}

}  // namespace

bool conv_max_pool_forward_fuses(WinogradMode configured, const Conv2dParams& cp, const Shape& x, const Shape& w,
                                 DType t, const PoolParams& pp, const Shape& conv_y) {
  return max_pool_keeps_argmax(pp, conv_y) && conv2d_forward_pools(configured, cp, x, w, t);
}

bool conv_max_pool_forward(Context& ctx, const Conv2dParams& cp, const Tensor& x, const Tensor& w, const Tensor& bias,
                           const Tensor& conv_y, const PoolParams& pp, const Tensor& y, const Tensor& argmax) {
  if (!max_pool_keeps_argmax(pp, conv_y.shape)) return false;  // the tiled kernels' windows
  const PGeo g = pool_geometry(pp, conv_y.shape);
  const PoolIsa isa = pool_isa();
  const PoolSink k{{1, g.R, g.W, g.C, 1, g.Q, g.R, g.S},
                   static_cast<char*>(y.data),
                   argmax.empty() ? nullptr : static_cast<uint8_t*>(argmax.data),
                   g.Q * g.C * static_cast<int64_t>(dtype_size(y.dtype)),
                   g.Q * g.C,
                   y.dtype,
                   isa == PoolIsa::Avx512 ? &avx512::tiled_max_forward_row
                   : isa == PoolIsa::Avx2 ? &avx2::tiled_max_forward_row
                                          : &base::tiled_max_forward_row};
  return conv2d_forward_pooled(ctx, cp, x, w, bias, conv_y, FwdPoolRows{&pool_rows, &k, g.P, g.R});
}

void pool_forward(Context& ctx, const PoolParams& pp, const Tensor& x, const Tensor& y) {
  const PGeo g = pool_geometry(pp, x.shape);
  if (tiled_max(pp, g) && !reference_loops() && x.dtype == y.dtype) {  // 16-bit too: no copies
    tiled_max_forward_dispatch(g, x.data, y.data, x.dtype);
    return;
  }
  const float* xf = f32_in(ctx, kSlotX, x);
  float* yf = f32_out(ctx, kSlotY, y);
  if (pp.kind == PoolKind::Avg && !reference_loops()) {
    avg_pool_dnnl(ctx, avg_geo(pp, g), xf, yf, false);
    f32_commit(yf, y);
    return;
  }
  const bool is_max = pp.kind == PoolKind::Max;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t p = 0; p < g.P; ++p)
      for (int64_t q = 0; q < g.Q; ++q) {
        int64_t h0, h1, w0, w1;
        g.window(p, q, h0, h1, w0, w1);
        float* yo = yf + ((n * g.P + p) * g.Q + q) * g.C;
        for (int64_t c = 0; c < g.C; ++c) yo[c] = is_max ? -std::numeric_limits<float>::infinity() : 0.0f;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) {
            const float* xi = xf + ((n * g.H + h) * g.W + w) * g.C;
            if (is_max) {
              for (int64_t c = 0; c < g.C; ++c) yo[c] = takes(xi[c], yo[c]) ? xi[c] : yo[c];
            } else {
              for (int64_t c = 0; c < g.C; ++c) yo[c] += xi[c];
            }
          }
        if (!is_max) {
          const float inv = 1.0f / static_cast<float>((h1 - h0) * (w1 - w0));
          for (int64_t c = 0; c < g.C; ++c) yo[c] *= inv;
        }
      }
  f32_commit(yf, y);
}

void pool_backward(Context& ctx, const PoolParams& pp, const Tensor& x, const Tensor& /*y*/, const Tensor& dy,
                   const Tensor& dx, bool relu_input) {
  MPX_CHECK(!relu_input || pp.kind == PoolKind::Max);
  const PGeo g = pool_geometry(pp, x.shape);
  if (tiled_max(pp, g) && !reference_loops() && x.dtype == dy.dtype && dy.dtype == dx.dtype) {  // 16-bit too
    tiled_max_backward_dispatch(g, x.data, dy.data, dx.data, relu_input, x.dtype);
    return;
  }
  const float* xf = pp.kind == PoolKind::Max ? f32_in(ctx, kSlotX, x) : nullptr;
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  float* dxf = f32_out(ctx, kSlotDX, dx);
  if (pp.kind == PoolKind::Avg && !reference_loops()) {
    avg_pool_dnnl(ctx, avg_geo(pp, g), dyf, dxf, true);
    f32_commit(dxf, dx);
    return;
  }
  const bool is_max = pp.kind == PoolKind::Max;
  const int64_t img = g.H * g.W * g.C;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < g.N; ++n) {
    std::memset(dxf + n * img, 0, sizeof(float) * static_cast<size_t>(img));
    for (int64_t p = 0; p < g.P; ++p)
      for (int64_t q = 0; q < g.Q; ++q) {
        int64_t h0, h1, w0, w1;
        g.window(p, q, h0, h1, w0, w1);
        const float* dyo = dyf + ((n * g.P + p) * g.Q + q) * g.C;
        if (is_max) {
          // The maximum is recomputed from x with the forward rule (first maximum wins),
          // channels innermost so that the scan is contiguous.
          for (int64_t c0 = 0; c0 < g.C; c0 += kChan) {
            const int64_t nc = std::min<int64_t>(kChan, g.C - c0);
            float best[kChan];
            int64_t at[kChan];
            for (int64_t c = 0; c < nc; ++c) {
              best[c] = -std::numeric_limits<float>::infinity();
              at[c] = ((n * g.H + h0) * g.W + w0) * g.C + c0 + c;
            }
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) {
                const int64_t base = ((n * g.H + h) * g.W + w) * g.C + c0;
                for (int64_t c = 0; c < nc; ++c)
                  if (takes(xf[base + c], best[c])) {
                    best[c] = xf[base + c];
                    at[c] = base + c;
                  }
              }
            // relu_input: the relu's backward too (0 where x <= 0, NaN included), applied to
            // each contribution, which gives the same bits as masking the sum afterwards.
            for (int64_t c = 0; c < nc; ++c)
              if (!relu_input || xf[at[c]] > 0.0f) dxf[at[c]] += dyo[c0 + c];
          }
        } else {
          const float inv = 1.0f / static_cast<float>((h1 - h0) * (w1 - w0));
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
              float* d = dxf + ((n * g.H + h) * g.W + w) * g.C;
              for (int64_t c = 0; c < g.C; ++c) d[c] += dyo[c] * inv;
            }
        }
      }
  }
  f32_commit(dxf, dx);
}

}  // namespace mpx::cpu
