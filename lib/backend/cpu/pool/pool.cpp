// SPDX-License-Identifier: MIT
// Max/average pooling (NHWC, asymmetric padding; average excludes padding from
// the divisor as Keras does) and global average pooling, forward and backward.
//
// Average pooling (pooling_avg_exclude_padding) forward/backward and global average
// pooling forward (average pooling with an H x W window) run oneDNN pooling, one cached
// plan per shape; global average pooling backward stays a broadcast loop (faster).
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

namespace {

// 16-bit global average pooling: each thread widens a block of an image's rows into a buffer
// that stays in its cache and sums it there, so the input is read once and no float32 copy of
// it is written (docs/cpu-performance.md, "16-bit without native math"). Each block's rows are
// summed first, then the blocks in order: float32 sums of at most kGapRows terms, and the
// result does not depend on the thread count.
constexpr int64_t kGapRows = 32;

void gap_forward_16(Context& ctx, const Tensor& x, const Tensor& y) {
  const int64_t N = x.shape[0], HW = x.shape[1] * x.shape[2], C = x.shape[3];
  const size_t per_thread = static_cast<size_t>((kGapRows + 1) * C + 16);
  float* bufs = ctx.scratch(kSlotTmp0, per_thread * static_cast<size_t>(omp_get_max_threads()));
  float* yf = f32_out(ctx, kSlotY, y);
  const float inv = 1.0f / static_cast<float>(HW);
  const size_t esize = dtype_size(x.dtype);
#pragma omp parallel
  {
    float* rows = bufs + per_thread * static_cast<size_t>(omp_get_thread_num());
    float* part = rows + kGapRows * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* yo = yf + n * C;
      for (int64_t c = 0; c < C; ++c) yo[c] = 0.0f;
      for (int64_t i0 = 0; i0 < HW; i0 += kGapRows) {
        const int64_t nr = std::min(kGapRows, HW - i0);
        convert(static_cast<const char*>(x.data) + static_cast<size_t>((n * HW + i0) * C) * esize, x.dtype, rows,
                DType::F32, static_cast<size_t>(nr * C));
        for (int64_t c = 0; c < C; ++c) part[c] = rows[c];
        for (int64_t r = 1; r < nr; ++r) {
          const float* xr = rows + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) part[c] += xr[c];
        }
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yo[c] += part[c];
      }
      for (int64_t c = 0; c < C; ++c) yo[c] *= inv;
    }
  }
  f32_commit(yf, y);
}

}  // namespace

void global_avg_pool_forward(Context& ctx, const Tensor& x, const Tensor& y) {
  const int64_t N = x.shape[0], HW = x.shape[1] * x.shape[2], C = x.shape[3];
  if (is_16bit(x.dtype) && !reference_loops()) {
    gap_forward_16(ctx, x, y);
    return;
  }
  const float* xf = f32_in(ctx, kSlotX, x);
  float* yf = f32_out(ctx, kSlotY, y);
  if (!reference_loops()) {
    avg_pool_dnnl(ctx, gap_geo(x.shape), xf, yf, false);
    f32_commit(yf, y);
    return;
  }
  const float inv = 1.0f / static_cast<float>(HW);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* yo = yf + n * C;
    for (int64_t c = 0; c < C; ++c) yo[c] = 0.0f;
    for (int64_t i = 0; i < HW; ++i) {
      const float* xi = xf + (n * HW + i) * C;
      for (int64_t c = 0; c < C; ++c) yo[c] += xi[c];
    }
    for (int64_t c = 0; c < C; ++c) yo[c] *= inv;
  }
  f32_commit(yf, y);
}

namespace {

// A 16-bit value is > 0 when it is positive, not zero and not NaN (inf_bits: the dtype's
// +infinity, 0x7F80 bfloat16, 0x7C00 float16).
/// All ones where the 16-bit value with bits b is > 0, else 0.
inline uint16_t pos16_mask(uint16_t b, uint16_t inf_bits) {
  return static_cast<uint16_t>(-static_cast<int>((static_cast<int16_t>(b) > 0) & (b <= inf_bits)));
}

// The masked rows in 16-byte vectors, which every x86-64 has (this file is built for the
// baseline): the compiler does not vectorize the selects by itself.
using v4f = float __attribute__((vector_size(16)));
using v4i = int32_t __attribute__((vector_size(16)));
using v8u = uint16_t __attribute__((vector_size(16)));
using v8s = int16_t __attribute__((vector_size(16)));
template <class V, class T>
inline V vld(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
inline void vst(T* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

/// d = y > 0 ? g * inv : 0 over c values (float32).
inline void masked_row_f32(const float* y, const float* g, float inv, float* d, int64_t C) {
  int64_t c = 0;
  for (; c + 4 <= C; c += 4) {
    const v4f gv = vld<v4f>(g + c) * inv;
    const v4i m = vld<v4f>(y + c) > 0.0f;
    vst(d + c, reinterpret_cast<v4f>(reinterpret_cast<v4i>(gv) & m));
  }
  for (; c < C; ++c) d[c] = y[c] > 0.0f ? g[c] * inv : 0.0f;
}

/// d = y > 0 ? r : 0 over c 16-bit values, on the bits.
inline void masked_row_16(const uint16_t* y, const uint16_t* r, uint16_t inf_bits, uint16_t* d, int64_t C) {
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    const v8u yv = vld<v8u>(y + c);
    const v8u m = reinterpret_cast<v8u>((reinterpret_cast<v8s>(yv) > 0) & reinterpret_cast<v8s>(yv <= inf_bits));
    vst(d + c, vld<v8u>(r + c) & m);
  }
  for (; c < C; ++c) d[c] = r[c] & pos16_mask(y[c], inf_bits);
}

/// dx = dy / HW, and 0 where relu_out (the relu's output, dx's shape and dtype) is not > 0.
void gap_backward(Context& ctx, const Tensor& dy, const Tensor& dx, const Tensor* relu_out) {
  const int64_t N = dx.shape[0], HW = dx.shape[1] * dx.shape[2], C = dx.shape[3];
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  // Always ours: a broadcast write of dy/HW. oneDNN's pooling backward with an H x W window
  // took ~2.1x as long at the CIFAR shape [256, 32, 32, 128] (45-48 ms vs 20-23 ms, 2 threads).
  const float inv = 1.0f / static_cast<float>(HW);
  if (dx.dtype != DType::F32) {
    // 16-bit: each image's row dy/HW rounded once, then copied to its HW positions (the same
    // values as rounding the float32 broadcast, without writing and converting it).
    const size_t row = static_cast<size_t>(C) * dtype_size(dx.dtype);
    float* rows = ctx.scratch(kSlotTmp0, static_cast<size_t>(N * C));
    for (int64_t i = 0; i < N * C; ++i) rows[i] = dyf[i] * inv;
    float* r16_buf = ctx.scratch(kSlotTmp1, (static_cast<size_t>(N) * row + 3) / 4);
    convert(rows, DType::F32, r16_buf, dx.dtype, static_cast<size_t>(N * C));
    const char* r16 = reinterpret_cast<const char*>(r16_buf);
    if (relu_out) {  // each row's values where the relu was active (a select on the bits)
      const uint16_t inf_bits = dx.dtype == DType::BF16 ? 0x7F80 : 0x7C00;
      const auto* rb = reinterpret_cast<const uint16_t*>(r16);
      const auto* yb = static_cast<const uint16_t*>(relu_out->data);
      auto* db = static_cast<uint16_t*>(dx.data);
#pragma omp parallel for collapse(2) schedule(static)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i)
          masked_row_16(yb + (n * HW + i) * C, rb + n * C, inf_bits, db + (n * HW + i) * C, C);
      return;
    }
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i)
        std::memcpy(static_cast<char*>(dx.data) + static_cast<size_t>(n * HW + i) * row,
                    r16 + static_cast<size_t>(n) * row, row);
    return;
  }
  float* dxf = f32_out(ctx, kSlotDX, dx);
  const float* yf = relu_out ? static_cast<const float*>(relu_out->data) : nullptr;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) {
      float* d = dxf + (n * HW + i) * C;
      const float* g = dyf + n * C;
      if (yf) {
        masked_row_f32(yf + (n * HW + i) * C, g, inv, d, C);
      } else {
        for (int64_t c = 0; c < C; ++c) d[c] = g[c] * inv;
      }
    }
  f32_commit(dxf, dx);
}

}  // namespace

void global_avg_pool_backward(Context& ctx, const Tensor& dy, const Tensor& dx) { gap_backward(ctx, dy, dx, nullptr); }

void global_avg_pool_relu_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  gap_backward(ctx, dy, dx, &x);
}

}  // namespace mpx::cpu
