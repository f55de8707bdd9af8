// SPDX-License-Identifier: MIT
// Inverted dropout with the counter-based mask of core/rng.h, so that the CPU
// and CUDA backends drop the same elements for the same (seed, offset); the twin
// of cpu/dropout.cpp, bit for bit.
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

// ---- kernels -----------------------------------------------------------------------

// Device copies of mix64 / hash_uniform in core/rng.h (keep the three in step).
__device__ __forceinline__ uint64_t mix64_device(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float hash_uniform_device(uint64_t seed, uint64_t index) {
  return static_cast<float>(mix64_device(seed ^ mix64_device(index)) >> 40) * (1.0f / 16777216.0f);
}

template <typename T>
__global__ void dropout_forward_kernel(const T* __restrict__ x, float rate, float scale, uint64_t seed,
                                       uint64_t offset, uint8_t* __restrict__ mask, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool keep = !(hash_uniform_device(seed, offset + static_cast<uint64_t>(i)) < rate);
    mask[i] = keep ? 1 : 0;
    y[i] = from_float<T>(keep ? __fmul_rn(to_float(x[i]), scale) : 0.0f);
  }
}

template <typename T>
__global__ void dropout_backward_kernel(const T* dy, const uint8_t* __restrict__ mask, float scale, T* dx,
                                        int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx[i] = from_float<T>(mask[i] ? __fmul_rn(to_float(dy[i]), scale) : 0.0f);
}

// ---- launchers ---------------------------------------------------------------------

void dropout_forward(Context& ctx, const Tensor& x, float rate, uint64_t seed, uint64_t offset, const Tensor& mask,
                     const Tensor& y) {
  const float scale = 1.0f / (1.0f - rate);  // on the host, as cpu/dropout.cpp
  const int64_t n = x.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    dropout_forward_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(
        x.as<const T>(), rate, scale, seed, offset, mask.as<uint8_t>(), y.as<T>(), n);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

void dropout_backward(Context& ctx, const Tensor& dy, const Tensor& mask, float rate, const Tensor& dx) {
  const float scale = 1.0f / (1.0f - rate);
  const int64_t n = dy.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(dy.dtype, T, {
    dropout_backward_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(
        dy.as<const T>(), mask.as<const uint8_t>(), scale, dx.as<T>(), n);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

}  // namespace mpx::cuda
