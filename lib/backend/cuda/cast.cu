// SPDX-License-Identifier: MIT
// Casts between float dtypes (one rounding to nearest-even: __float2half_rn,
// __float2bfloat16_rn) and the input normalization uint8 HWC -> (x/255 - mean) / std
// in the first layer's dtype; the twin of cpu/cast.cpp, bit for bit.
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

// ---- kernels -----------------------------------------------------------------------

template <typename TS, typename TD>
__global__ void cast_kernel(const TS* __restrict__ src, TD* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_float<TD>(to_float(src[i]));  // 16 -> float is exact: one rounding
}

// y = x * a[c] + b[c] with a = 1/(255 std[c]), b = -mean[c]/std[c]: the CPU's float32
// expressions with explicit _rn intrinsics so that nvcc contracts nothing into an FMA.
template <typename T>
__global__ void normalize_input_kernel(const uint8_t* __restrict__ x, const float* __restrict__ mean,
                                       const float* __restrict__ stdv, T* __restrict__ y, int64_t n, int C) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % C);
    const float a = __fdiv_rn(1.0f, __fmul_rn(255.0f, stdv[c]));
    const float b = __fdiv_rn(-mean[c], stdv[c]);
    y[i] = from_float<T>(__fadd_rn(__fmul_rn(static_cast<float>(x[i]), a), b));
  }
}

// ---- launchers ---------------------------------------------------------------------

void cast(Context& ctx, const Tensor& src, const Tensor& dst) {
  if (src.dtype == dst.dtype) {
    copy(ctx, dst, src);
    return;
  }
  const int64_t n = src.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(src.dtype, TS, MPX_CUDA_DISPATCH_FLOAT(dst.dtype, TD, {
    cast_kernel<TS, TD><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(src.as<const TS>(),
                                                                                 dst.as<TD>(), n);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  }));
}

void normalize_input(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& std, const Tensor& y) {
  const int C = static_cast<int>(x.shape[x.shape.rank - 1]);
  const int64_t n = x.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(y.dtype, T, {
    normalize_input_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(
        x.as<const uint8_t>(), mean.as<const float>(), std.as<const float>(), y.as<T>(), n, C);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

}  // namespace mpx::cuda
