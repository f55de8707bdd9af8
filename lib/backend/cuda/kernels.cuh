// SPDX-License-Identifier: MIT
// Device helpers shared by the .cu files of the CUDA backend: float32 <-> storage
// conversions (round-to-nearest-even, as core/half.h does on the host), the dtype
// dispatch of launchers, and the deterministic two-stage per-channel reduction
// over rows of an [M, C] matrix (NHWC: channels innermost) used by batch norm and
// the bias gradients.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/context.h"
#include "core/error.h"

namespace mpx::cuda {

// ---- storage conversions -----------------------------------------------------------

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/// Runs the statement with T bound to the storage type of a float dtype.
#define MPX_CUDA_DISPATCH_FLOAT(dtype, T, ...)                               \
  do {                                                                       \
    switch (dtype) {                                                         \
      case ::mpx::DType::F32: {                                              \
        using T = float;                                                     \
        __VA_ARGS__;                                                         \
        break;                                                               \
      }                                                                      \
      case ::mpx::DType::F16: {                                              \
        using T = __half;                                                    \
        __VA_ARGS__;                                                         \
        break;                                                               \
      }                                                                      \
      case ::mpx::DType::BF16: {                                             \
        using T = __nv_bfloat16;                                             \
        __VA_ARGS__;                                                         \
        break;                                                               \
      }                                                                      \
      default:                                                               \
        MPX_CHECK_MSG(false, "CUDA backend: not a float dtype");             \
    }                                                                        \
  } while (0)

constexpr int kThreads = 256;

// ---- per-channel reduction over rows ----------------------------------------------
// Stage 1: grid (ceil(C/32), G), block (32, 8). Thread (tx, ty) of block (bx, by) owns
// channel c = 32 bx + tx and rows by*8+ty, stepping by 8G; it accumulates in float,
// the block combines its 8 row-threads in a fixed order, and writes partial[by][2][C]
// in double. Stage 2 adds the G partials of a channel in order: deterministic.

enum class ChannelSum : int {
  Sum,    // s1 = sum x
  SqDev,  // s1 = sum (x - mean)^2
  Bwd,    // s1 = sum dy, s2 = sum dy * (x - mean) * invstd
};

constexpr int kReduceRowsPerThread = 64;

template <typename T, ChannelSum MODE>
__global__ void channel_partial_sums_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                            const float* __restrict__ mean, const float* __restrict__ invstd,
                                            int64_t M, int C, double* __restrict__ partial) {
  __shared__ float sh1[8][33];
  __shared__ float sh2[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  float s1 = 0.0f, s2 = 0.0f;
  if (c < C) {
    const float mu = MODE == ChannelSum::Sum ? 0.0f : mean[c];
    const float is = MODE == ChannelSum::Bwd ? invstd[c] : 0.0f;
    for (int64_t m = static_cast<int64_t>(blockIdx.y) * 8 + ty; m < M; m += static_cast<int64_t>(gridDim.y) * 8) {
      const float v = to_float(x[m * C + c]);
      if (MODE == ChannelSum::Sum) {
        s1 += v;
      } else if (MODE == ChannelSum::SqDev) {
        const float d = v - mu;
        s1 += d * d;
      } else {
        const float g = to_float(dy[m * C + c]);
        s1 += g;
        s2 += g * ((v - mu) * is);
      }
    }
  }
  sh1[ty][tx] = s1;
  sh2[ty][tx] = s2;
  __syncthreads();
  if (ty == 0 && c < C) {
    double a = 0.0, b = 0.0;
    for (int i = 0; i < 8; ++i) {
      a += sh1[i][tx];
      b += sh2[i][tx];
    }
    partial[(static_cast<int64_t>(blockIdx.y) * 2) * C + c] = a;
    partial[(static_cast<int64_t>(blockIdx.y) * 2 + 1) * C + c] = b;
  }
}

/// Stage 2: out1[c] = sum_g partial[g][0][c], out2 likewise (either may be null).
static __global__ void channel_finalize_kernel(const double* __restrict__ partial, int G, int C,
                                               double* __restrict__ out1, double* __restrict__ out2) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double a = 0.0, b = 0.0;
  for (int g = 0; g < G; ++g) {
    a += partial[(static_cast<int64_t>(g) * 2) * C + c];
    b += partial[(static_cast<int64_t>(g) * 2 + 1) * C + c];
  }
  if (out1) out1[c] = a;
  if (out2) out2[c] = b;
}

/// Number of row groups G for M rows (at most kReduceRowsPerThread rows per thread, G <= 1024).
inline int channel_groups(int64_t M) {
  int64_t g = (M + 8 * kReduceRowsPerThread - 1) / (8 * kReduceRowsPerThread);
  if (g < 1) g = 1;
  if (g > 1024) g = 1024;
  return static_cast<int>(g);
}

/// Both stages: sums of the mode over rows into out1/out2 (device doubles [C]; out2 may be null).
/// `partial` holds at least channel_groups(M) * 2 * C doubles.
template <typename T, ChannelSum MODE>
void channel_sums(cudaStream_t stream, const T* x, const T* dy, const float* mean, const float* invstd, int64_t M,
                  int C, double* partial, double* out1, double* out2) {
  const int G = channel_groups(M);
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(G));
  channel_partial_sums_kernel<T, MODE><<<grid, dim3(32, 8), 0, stream>>>(x, dy, mean, invstd, M, C, partial);
  MPX_CUDA_LAUNCH_CHECK(stream);
  channel_finalize_kernel<<<static_cast<unsigned>((C + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      partial, G, C, out1, out2);
  MPX_CUDA_LAUNCH_CHECK(stream);
}

}  // namespace mpx::cuda
