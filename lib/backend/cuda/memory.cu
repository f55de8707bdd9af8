// SPDX-License-Identifier: MIT
// Memory ops of the CUDA backend (fill, copy); the twin of cpu/memory.cpp. The
// Context (stream, handles, scratch) is in context.cpp.
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ops.h"
#include "core/half.h"

namespace mpx::cuda {

// ---- kernels -----------------------------------------------------------------------

template <typename T>
__global__ void fill_kernel(T* __restrict__ p, T v, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

// ---- launchers ---------------------------------------------------------------------

namespace {
template <typename T>
void fill_as(Context& ctx, const Tensor& t, T v) {
  const int64_t n = t.numel();
  if (n == 0) return;
  fill_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(t.as<T>(), v, n);
  MPX_CUDA_LAUNCH_CHECK(ctx.stream());
}
}  // namespace

void fill(Context& ctx, const Tensor& dst, float value) {
  // The value is rounded on the host with the same code as the CPU backend (core/half.h).
  switch (dst.dtype) {
    case DType::F32: fill_as<float>(ctx, dst, value); break;
    case DType::F16: fill_as<uint16_t>(ctx, dst, f32_to_f16(value)); break;
    case DType::BF16: fill_as<uint16_t>(ctx, dst, f32_to_bf16(value)); break;
    case DType::I32: fill_as<int32_t>(ctx, dst, static_cast<int32_t>(value)); break;
    case DType::U8: fill_as<uint8_t>(ctx, dst, static_cast<uint8_t>(value)); break;
  }
}

void copy(Context& ctx, const Tensor& dst, const Tensor& src) {
  if (dst.data == src.data || dst.bytes() == 0) return;
  MPX_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, ctx.stream()));
}

}  // namespace mpx::cuda
