// SPDX-License-Identifier: MIT
// Max/average pooling (NHWC, asymmetric padding; average excludes padding from
// the divisor as Keras does; max routes the gradient to the FIRST maximum) and
// global average pooling, forward and backward. Own kernels rather than cuDNN:
// cuDNN wants symmetric padding and does not promise the first-maximum rule. The
// twin of cpu/pool.cpp: max pooling gives the same bits; average pooling sums in
// window order and divides by the count, as the CPU's default path (oneDNN) does,
// which sums in an order of its own, so the two agree within the rounding bound of
// a float32 sum (docs/gpu.md, "What the CUDA tests compare").
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ops.h"
#include "backend/pool_geometry.h"

namespace mpx::cuda {

namespace {

using PGeo = PoolGeometry;  // backend/pool_geometry.h

// "First maximum": strict >, scanning rows then columns; NaN wins and stays (cpu/pool.cpp).
__device__ __forceinline__ bool takes(float v, float m) { return v > m || (isnan(v) && !isnan(m)); }

}  // namespace

// ---- kernels -----------------------------------------------------------------------

// One thread per output element (n, p, q, c).
template <typename T>
__global__ void pool_forward_kernel(PGeo g, bool is_max, const T* __restrict__ x, T* __restrict__ y) {
  const int64_t total = g.N * g.P * g.Q * g.C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % g.C, q = (i / g.C) % g.Q, p = (i / (g.C * g.Q)) % g.P, n = i / (g.C * g.Q * g.P);
    int64_t h0, h1, w0, w1;
    g.window(p, q, h0, h1, w0, w1);
    float acc = is_max ? -INFINITY : 0.0f;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) {
        const float v = to_float(x[((n * g.H + h) * g.W + w) * g.C + c]);
        if (is_max)
          acc = takes(v, acc) ? v : acc;
        else
          acc = __fadd_rn(acc, v);
      }
    if (!is_max) acc = __fdiv_rn(acc, static_cast<float>((h1 - h0) * (w1 - w0)));
    y[i] = from_float<T>(acc);
  }
}

// One thread per input element (n, h, w, c): gathers, in the CPU's (p, q) order, the
// gradient of every window that contains it (max: only where it is the window's first maximum).
template <typename T>
__global__ void pool_backward_kernel(PGeo g, bool is_max, const T* __restrict__ x, const T* __restrict__ dy,
                                     T* __restrict__ dx) {
  const int64_t total = g.N * g.H * g.W * g.C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % g.C, w = (i / g.C) % g.W, h = (i / (g.C * g.W)) % g.H, n = i / (g.C * g.W * g.H);
    // Windows p with p*sh - pt <= h < p*sh - pt + R.
    const int64_t hp = h + g.pt, wq = w + g.pl;
    const int64_t p_lo = hp - g.R + 1 <= 0 ? 0 : (hp - g.R + 1 + g.sh - 1) / g.sh;
    const int64_t p_hi = min(hp / g.sh, g.P - 1);
    const int64_t q_lo = wq - g.S + 1 <= 0 ? 0 : (wq - g.S + 1 + g.sw - 1) / g.sw;
    const int64_t q_hi = min(wq / g.sw, g.Q - 1);
    float acc = 0.0f;
    for (int64_t p = p_lo; p <= p_hi; ++p)
      for (int64_t q = q_lo; q <= q_hi; ++q) {
        int64_t h0, h1, w0, w1;
        g.window(p, q, h0, h1, w0, w1);
        const float gy = to_float(dy[((n * g.P + p) * g.Q + q) * g.C + c]);
        if (is_max) {
          float m = -INFINITY;
          int64_t ah = h0, aw = w0;
          for (int64_t hh = h0; hh < h1; ++hh)
            for (int64_t ww = w0; ww < w1; ++ww) {
              const float v = to_float(x[((n * g.H + hh) * g.W + ww) * g.C + c]);
              if (takes(v, m)) {
                m = v;
                ah = hh;
                aw = ww;
              }
            }
          if (ah == h && aw == w) acc = __fadd_rn(acc, gy);
        } else {
          acc = __fadd_rn(acc, __fdiv_rn(gy, static_cast<float>((h1 - h0) * (w1 - w0))));
        }
      }
    dx[i] = from_float<T>(acc);
  }
}

// One thread per (n, c): the sum over H*W in order, divided by H*W.
template <typename T>
__global__ void global_avg_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t N, int64_t HW,
                                               int64_t C) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    float acc = 0.0f;
    for (int64_t k = 0; k < HW; ++k) acc = __fadd_rn(acc, to_float(x[(n * HW + k) * C + c]));
    y[i] = from_float<T>(__fdiv_rn(acc, static_cast<float>(HW)));
  }
}

template <typename T>
__global__ void global_avg_pool_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, int64_t N, int64_t HW,
                                                int64_t C) {
  const float inv = __fdiv_rn(1.0f, static_cast<float>(HW));
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N * HW * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, n = i / (HW * C);
    dx[i] = from_float<T>(__fmul_rn(to_float(dy[n * C + c]), inv));
  }
}

// ---- launchers ---------------------------------------------------------------------

void pool_forward(Context& ctx, const PoolParams& pp, const Tensor& x, const Tensor& y) {
  const PGeo g = pool_geometry(pp, x.shape);
  const int64_t n = y.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    pool_forward_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(
        g, pp.kind == PoolKind::Max, x.as<const T>(), y.as<T>());
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

void pool_backward(Context& ctx, const PoolParams& pp, const Tensor& x, const Tensor& /*y*/, const Tensor& dy,
                   const Tensor& dx) {
  const PGeo g = pool_geometry(pp, x.shape);
  const int64_t n = dx.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    pool_backward_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(
        g, pp.kind == PoolKind::Max, x.as<const T>(), dy.as<const T>(), dx.as<T>());
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

void global_avg_pool_forward(Context& ctx, const Tensor& x, const Tensor& y) {
  const int64_t N = x.shape[0], HW = x.shape[1] * x.shape[2], C = x.shape[3];
  if (N * C == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    global_avg_pool_forward_kernel<T><<<ctx.grid_for(N * C, kThreads), kThreads, 0, ctx.stream()>>>(
        x.as<const T>(), y.as<T>(), N, HW, C);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

void global_avg_pool_backward(Context& ctx, const Tensor& dy, const Tensor& dx) {
  const int64_t N = dx.shape[0], HW = dx.shape[1] * dx.shape[2], C = dx.shape[3];
  if (N * HW * C == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(dx.dtype, T, {
    global_avg_pool_backward_kernel<T><<<ctx.grid_for(N * HW * C, kThreads), kThreads, 0, ctx.stream()>>>(
        dy.as<const T>(), dx.as<T>(), N, HW, C);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

}  // namespace mpx::cuda
