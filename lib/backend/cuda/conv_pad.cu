// SPDX-License-Identifier: MIT
// Explicit padding for convolutions with asymmetric padding (Keras "same" with an
// even kernel or stride > 1), which cuDNN's symmetric pads cannot express, and zero
// channels for 16-bit operands whose channel count is not a multiple of 8
// (conv_geometry.h): conv.cpp pads x (and the filter) into planned buffers, and crops
// the padded gradients back into dx (and dw).
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

// ---- kernels -----------------------------------------------------------------------

// xp [N, Hp, Wp, Cp]: x [N, H, W, C] at rows [top, top+H), columns [left, left+W), channels
// [0, C); zeros elsewhere.
template <typename T>
__global__ void pad_nhwc_kernel(const T* __restrict__ x, T* __restrict__ xp, int64_t N, int64_t H, int64_t W,
                                int64_t C, int64_t Hp, int64_t Wp, int64_t Cp, int top, int left) {
  const int64_t total = N * Hp * Wp * Cp;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % Cp, wp = (i / Cp) % Wp, hp = (i / (Cp * Wp)) % Hp, n = i / (Cp * Wp * Hp);
    const int64_t h = hp - top, w = wp - left;
    xp[i] = (c < C && h >= 0 && h < H && w >= 0 && w < W) ? x[((n * H + h) * W + w) * C + c] : from_float<T>(0.0f);
  }
}

// x [N, H, W, C] = xp [N, Hp, Wp, Cp] at (top, left), channels [0, C).
template <typename T>
__global__ void crop_nhwc_kernel(const T* __restrict__ xp, T* __restrict__ x, int64_t N, int64_t H, int64_t W,
                                 int64_t C, int64_t Hp, int64_t Wp, int64_t Cp, int top, int left) {
  const int64_t total = N * H * W * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, w = (i / C) % W, h = (i / (C * W)) % H, n = i / (C * W * H);
    x[i] = xp[((n * Hp + h + top) * Wp + w + left) * Cp + c];
  }
}

// ---- launchers ---------------------------------------------------------------------

void pad_nhwc(Context& ctx, const Tensor& x, const Tensor& xp, int top, int left) {
  const int64_t n = xp.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    pad_nhwc_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(
        x.as<const T>(), xp.as<T>(), x.shape[0], x.shape[1], x.shape[2], x.shape[3], xp.shape[1], xp.shape[2],
        xp.shape[3], top, left);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

void crop_nhwc(Context& ctx, const Tensor& xp, const Tensor& x, int top, int left) {
  const int64_t n = x.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    crop_nhwc_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(
        xp.as<const T>(), x.as<T>(), x.shape[0], x.shape[1], x.shape[2], x.shape[3], xp.shape[1], xp.shape[2],
        xp.shape[3], top, left);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

}  // namespace mpx::cuda
