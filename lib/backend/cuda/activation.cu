// SPDX-License-Identifier: MIT
// Elementwise ops: activation forward/backward, the residual add, and the bias +
// activation epilogue / bias gradient that conv.cpp and dense.cpp use where cuDNN/
// cuBLASLt do not fuse them. The twin of cpu/activation.cpp: every activation runs
// through the float32 formulas of core/activation.h, in kernels compiled once per
// activation (with_activation_kind); relu keeps NaN as NaN so check_numerics sees it.
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

// ---- kernels -----------------------------------------------------------------------

template <typename T, ActKind AK>
__global__ void activation_forward_kernel(const T* x, T* y, int64_t n, float alpha) {  // x and y may alias
  const Activation a{AK, alpha};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(activation_value(a, to_float(x[i])));
}

// saved: the forward output or input (backward_reads); dx may alias dy.
template <typename T, ActKind AK>
__global__ void activation_backward_kernel(const T* __restrict__ saved, const T* dy, T* dx, int64_t n, float alpha) {
  const Activation a{AK, alpha};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx[i] = from_float<T>(activation_grad(a, to_float(saved[i]), to_float(dy[i])));
}

template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* y, int64_t n) {  // y may alias a or b
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(__fadd_rn(to_float(a[i]), to_float(b[i])));
}

// y [M, K]: z = y + bias[k]; pre = z; y = act(z). bias and pre may be null.
template <typename T, typename TB, ActKind AK>
__global__ void bias_activation_kernel(T* y, const TB* __restrict__ bias, T* __restrict__ pre, int64_t n, int K,
                                       float alpha) {
  const Activation a{AK, alpha};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = to_float(y[i]);
    if (bias) v = __fadd_rn(v, to_float(bias[i % K]));
    if (pre) pre[i] = from_float<T>(v);
    y[i] = from_float<T>(activation_value(a, v));
  }
}

template <typename T>
__global__ void store_sums_kernel(const double* __restrict__ sums, T* __restrict__ out, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < C) out[c] = from_float<T>(static_cast<float>(sums[c]));
}

// ---- launchers ---------------------------------------------------------------------

void activation_forward(Context& ctx, Activation act, const Tensor& x, const Tensor& y) {
  if (act.is_none()) {
    if (x.data != y.data) copy(ctx, y, x);
    return;
  }
  const int64_t n = x.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, with_activation_kind(act.kind, [&](auto kind) {
    activation_forward_kernel<T, decltype(kind)::value>
        <<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(x.as<const T>(), y.as<T>(), n, act.alpha);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  }));
}

void activation_backward(Context& ctx, Activation act, const Tensor& saved, const Tensor& dy, const Tensor& dx) {
  if (act.is_none()) {
    if (dx.data != dy.data) copy(ctx, dx, dy);
    return;
  }
  const int64_t n = saved.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(saved.dtype, T, with_activation_kind(act.kind, [&](auto kind) {
    activation_backward_kernel<T, decltype(kind)::value><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(
        saved.as<const T>(), dy.as<const T>(), dx.as<T>(), n, act.alpha);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  }));
}

void add(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& y) {
  const int64_t n = a.numel();
  if (n == 0) return;
  MPX_CUDA_DISPATCH_FLOAT(a.dtype, T, {
    add_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(a.as<const T>(), b.as<const T>(),
                                                                           y.as<T>(), n);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

void bias_activation(Context& ctx, const Tensor& y, const Tensor& bias, Activation act, const Tensor& pre) {
  const int64_t n = y.numel();
  if (n == 0 || (bias.empty() && act.is_none() && pre.empty())) return;
  const int K = static_cast<int>(y.shape[y.shape.rank - 1]);
  const DType bt = bias.empty() ? y.dtype : bias.dtype;
  MPX_CUDA_DISPATCH_FLOAT(y.dtype, T, MPX_CUDA_DISPATCH_FLOAT(bt, TB, with_activation_kind(act.kind, [&](auto kind) {
    bias_activation_kernel<T, TB, decltype(kind)::value><<<ctx.grid_for(n, kThreads), kThreads, 0, ctx.stream()>>>(
        y.as<T>(), bias.empty() ? nullptr : bias.as<const TB>(), pre.empty() ? nullptr : pre.as<T>(), n, K,
        act.alpha);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  })));
}

void bias_backward(Context& ctx, const Tensor& dy, const Tensor& db) {
  const int K = static_cast<int>(dy.shape[dy.shape.rank - 1]);
  const int64_t M = K > 0 ? dy.numel() / K : 0;
  if (K == 0) return;
  auto* partial = static_cast<double*>(
      ctx.scratch(kSlotReduce, sizeof(double) * (static_cast<size_t>(channel_groups(M)) * 2 + 1) * K));
  double* sums = partial + static_cast<size_t>(channel_groups(M)) * 2 * K;
  MPX_CUDA_DISPATCH_FLOAT(dy.dtype, T, {
    channel_sums<T, ChannelSum::Sum>(ctx.stream(), dy.as<const T>(), nullptr, nullptr, nullptr, M, K, partial, sums,
                                     nullptr);
  });
  MPX_CUDA_DISPATCH_FLOAT(db.dtype, TB, {
    store_sums_kernel<TB><<<static_cast<unsigned>((K + kThreads - 1) / kThreads), kThreads, 0, ctx.stream()>>>(
        sums, db.as<TB>(), K);
    MPX_CUDA_LAUNCH_CHECK(ctx.stream());
  });
}

}  // namespace mpx::cuda
