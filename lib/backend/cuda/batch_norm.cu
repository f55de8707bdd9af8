// SPDX-License-Identifier: MIT
// Batch normalization over N,H,W per channel (NHWC: channels innermost), with
// float32 statistics and parameters and x/y/dx/dy in the compute dtype. Normalizing
// uses the biased batch variance; the moving variance takes it times
// bn_moving_variance_factor() (backend.h): unbiased (m / (m - 1)) on [N,H,W,C] input and
// biased on [N,C], as tf-keras 2 (docs/keras-parity.md), the same as cpu/batch_norm.cpp.
// Own kernels rather than cuDNN's: cuDNN's running variance is the unbiased one for every
// shape (what PyTorch's and TensorFlow's GPU paths rely on; the cuDNN 9 header does not say
// it), which is wrong for [N,C], and cuDNN refuses epsilon < 1e-5. Sums are deterministic two-stage
// reductions (kernels.cuh), finished in double like the CPU twin. An activation after the
// normalization (the ops' `act`) is applied in the affine kernel and its gradient recomputed
// from x in the backward, as the CPU's row loops do (docs/cpu-performance.md, "Batch norm and
// the activation after it").
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

// ---- kernels -----------------------------------------------------------------------

__global__ void bn_mean_kernel(const double* __restrict__ sum, int64_t M, int C, float* __restrict__ saved_mean) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < C) saved_mean[c] = static_cast<float>(sum[c] / static_cast<double>(M));
}

// Biased variance, invstd, the Keras moving averages (the variance times `unbias`,
// bn_moving_variance_factor()) and the scale gamma * invstd.
__global__ void bn_finalize_training_kernel(const double* __restrict__ sq, int64_t M, int C, float momentum,
                                            float epsilon, double unbias, const float* __restrict__ gamma,
                                            const float* __restrict__ saved_mean, float* __restrict__ saved_invstd,
                                            float* __restrict__ running_mean, float* __restrict__ running_var,
                                            float* __restrict__ scale) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const double var = sq[c] / static_cast<double>(M);  // biased: Keras normalizes with it
  const double invstd = 1.0 / sqrt(var + static_cast<double>(epsilon));
  saved_invstd[c] = static_cast<float>(invstd);
  const float om = __fsub_rn(1.0f, momentum);
  running_mean[c] = __fadd_rn(__fmul_rn(momentum, running_mean[c]), __fmul_rn(om, saved_mean[c]));
  running_var[c] = __fadd_rn(__fmul_rn(momentum, running_var[c]), __fmul_rn(om, static_cast<float>(var * unbias)));
  // From the float32 invstd the backward reads too: it recomputes the normalized values
  // (a fused activation's input) bit for bit.
  scale[c] = static_cast<float>(static_cast<double>(gamma[c]) * static_cast<double>(saved_invstd[c]));
}

// scale[c] = gamma[c] * invstd[c] from the saved float32 invstd (the backward's recomputation).
__global__ void bn_saved_scale_kernel(const float* __restrict__ gamma, const float* __restrict__ invstd, int C,
                                      float* __restrict__ scale) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < C) scale[c] = static_cast<float>(static_cast<double>(gamma[c]) * static_cast<double>(invstd[c]));
}

__global__ void bn_inference_scale_kernel(const float* __restrict__ gamma, const float* __restrict__ running_var,
                                          float epsilon, int C, float* __restrict__ scale) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const double invstd = 1.0 / sqrt(static_cast<double>(running_var[c]) + static_cast<double>(epsilon));
  scale[c] = static_cast<float>(static_cast<double>(gamma[c]) * invstd);
}

// z = (x - mean[c]) * scale[c] + beta[c] in float32 (centered first).
__device__ __forceinline__ float bn_normalized(float x, const float* mean, const float* scale, const float* beta,
                                               int c) {
  return __fadd_rn(__fmul_rn(__fsub_rn(x, mean[c]), scale[c]), beta[c]);
}

// y = z rounded once; with an activation (AK not None) y = act(z rounded to T) rounded once,
// the bits of the affine kernel followed by activation_forward_kernel.
template <typename T, ActKind AK>
__global__ void bn_affine_kernel(const T* __restrict__ x, const float* __restrict__ mean,
                                 const float* __restrict__ scale, const float* __restrict__ beta, T* __restrict__ y,
                                 int64_t n, int C, float alpha) {
  const Activation a{AK, alpha};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % C);
    const T z = from_float<T>(bn_normalized(to_float(x[i]), mean, scale, beta, c));
    y[i] = AK == ActKind::None ? z : from_float<T>(activation_value(a, to_float(z)));
  }
}

// The gradient before a fused activation: g = act'(saved) dy rounded once, saved being z
// recomputed as bn_affine_kernel computes it (or act(z) where the backward reads the output).
template <typename T, ActKind AK>
__global__ void bn_activation_grad_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                          const float* __restrict__ mean, const float* __restrict__ scale,
                                          const float* __restrict__ beta, T* __restrict__ g, int64_t n, int C,
                                          float alpha) {
  const Activation a{AK, alpha};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % C);
    float saved = to_float(from_float<T>(bn_normalized(to_float(x[i]), mean, scale, beta, c)));
    if (backward_reads(AK) != ActSaved::Input) saved = to_float(from_float<T>(activation_value(a, saved)));
    g[i] = from_float<T>(activation_grad(a, saved, to_float(dy[i])));
  }
}

// dbeta, dgamma and the coefficients of dx = k * (dy - dbeta/M - (x - mean) * invstd * dgamma/M).
__global__ void bn_backward_coef_kernel(const double* __restrict__ sdy, const double* __restrict__ sdyx, int64_t M,
                                        int C, const float* __restrict__ gamma, const float* __restrict__ invstd,
                                        float* __restrict__ dgamma, float* __restrict__ dbeta,
                                        float* __restrict__ coef) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  dbeta[c] = static_cast<float>(sdy[c]);
  dgamma[c] = static_cast<float>(sdyx[c]);
  const double is = invstd[c];
  const double k = static_cast<double>(gamma[c]) * is;
  const double gm = sdyx[c] / static_cast<double>(M);
  const double bm = sdy[c] / static_cast<double>(M);
  coef[c] = static_cast<float>(k);
  coef[C + c] = static_cast<float>(bm);
  coef[2 * C + c] = static_cast<float>(gm * is);
}

template <typename T>
__global__ void bn_backward_dx_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                      const float* __restrict__ mean, const float* __restrict__ coef,
                                      T* __restrict__ dx, int64_t n, int C) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % C);
    const float xc = __fsub_rn(to_float(x[i]), mean[c]);
    const float inner = __fsub_rn(__fsub_rn(to_float(dy[i]), coef[C + c]), __fmul_rn(xc, coef[2 * C + c]));
    dx[i] = from_float<T>(__fmul_rn(coef[c], inner));
  }
}

// ---- launchers ---------------------------------------------------------------------

namespace {

struct BnScratch {
  double* partial;  // channel_groups(M) * 2 * C
  double* s1;       // C
  double* s2;       // C
  float* f;         // 4 * C (scale, or dx coefficients and the scale)
};

BnScratch bn_scratch(Context& ctx, int64_t M, int C) {
  BnScratch s{};
  s.partial = static_cast<double*>(
      ctx.scratch(kSlotReduce, sizeof(double) * static_cast<size_t>(channel_groups(M)) * 2 * static_cast<size_t>(C)));
  auto* coef = static_cast<char*>(ctx.scratch(kSlotCoef, (2 * sizeof(double) + 4 * sizeof(float)) * C));
  s.s1 = reinterpret_cast<double*>(coef);
  s.s2 = s.s1 + C;
  s.f = reinterpret_cast<float*>(s.s2 + C);
  return s;
}

unsigned channel_blocks(int C) { return static_cast<unsigned>((C + kThreads - 1) / kThreads); }

}  // namespace

void batch_norm_forward_training(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 float momentum, float epsilon, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& saved_mean, const Tensor& saved_invstd,
                                 const Tensor& y, Activation act) {
  const int C = static_cast<int>(x.shape[x.shape.rank - 1]);
  const int64_t n = x.numel(), M = C > 0 ? n / C : 0;
  if (n == 0) return;
  const BnScratch s = bn_scratch(ctx, M, C);
  cudaStream_t st = ctx.stream();
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    const T* xp = x.as<const T>();
    channel_sums<T, ChannelSum::Sum>(st, xp, nullptr, nullptr, nullptr, M, C, s.partial, s.s1, nullptr);
    bn_mean_kernel<<<channel_blocks(C), kThreads, 0, st>>>(s.s1, M, C, saved_mean.as<float>());
    MPX_CUDA_LAUNCH_CHECK(st);
    // Second pass around the mean (no cancellation).
    channel_sums<T, ChannelSum::SqDev>(st, xp, nullptr, saved_mean.as<const float>(), nullptr, M, C, s.partial,
                                       s.s2, nullptr);
    const double unbias = bn_moving_variance_factor(x.shape.rank, M);
    bn_finalize_training_kernel<<<channel_blocks(C), kThreads, 0, st>>>(
        s.s2, M, C, momentum, epsilon, unbias, gamma.as<const float>(), saved_mean.as<const float>(),
        saved_invstd.as<float>(), running_mean.as<float>(), running_var.as<float>(), s.f);
    MPX_CUDA_LAUNCH_CHECK(st);
    with_activation_kind(act.kind, [&](auto k) {
      bn_affine_kernel<T, decltype(k)::value><<<ctx.grid_for(n, kThreads), kThreads, 0, st>>>(
          xp, saved_mean.as<const float>(), s.f, beta.as<const float>(), y.as<T>(), n, C, act.alpha);
    });
    MPX_CUDA_LAUNCH_CHECK(st);
  });
}

void batch_norm_forward_inference(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, float epsilon,
                                  const Tensor& y, Activation act) {
  const int C = static_cast<int>(x.shape[x.shape.rank - 1]);
  const int64_t n = x.numel();
  if (n == 0) return;
  auto* scale = static_cast<float*>(ctx.scratch(kSlotCoef, sizeof(float) * static_cast<size_t>(C)));
  cudaStream_t st = ctx.stream();
  bn_inference_scale_kernel<<<channel_blocks(C), kThreads, 0, st>>>(gamma.as<const float>(),
                                                                      running_var.as<const float>(), epsilon, C, scale);
  MPX_CUDA_LAUNCH_CHECK(st);
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    with_activation_kind(act.kind, [&](auto k) {
      bn_affine_kernel<T, decltype(k)::value><<<ctx.grid_for(n, kThreads), kThreads, 0, st>>>(
          x.as<const T>(), running_mean.as<const float>(), scale, beta.as<const float>(), y.as<T>(), n, C,
          act.alpha);
    });
    MPX_CUDA_LAUNCH_CHECK(st);
  });
}

void batch_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma,
                         const Tensor& saved_mean, const Tensor& saved_invstd, const Tensor& dx,
                         const Tensor& dgamma, const Tensor& dbeta, const Tensor& beta, Activation act) {
  const int C = static_cast<int>(x.shape[x.shape.rank - 1]);
  const int64_t n = x.numel(), M = C > 0 ? n / C : 0;
  if (n == 0) return;
  const BnScratch s = bn_scratch(ctx, M, C);
  cudaStream_t st = ctx.stream();
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    const T* g = dy.as<const T>();
    if (!act.is_none()) {  // the activation's backward first, into scratch
      T* gs = static_cast<T*>(ctx.scratch(kSlotBnGrad, sizeof(T) * static_cast<size_t>(n)));
      float* scale = s.f + 3 * C;
      bn_saved_scale_kernel<<<channel_blocks(C), kThreads, 0, st>>>(gamma.as<const float>(),
                                                                      saved_invstd.as<const float>(), C, scale);
      MPX_CUDA_LAUNCH_CHECK(st);
      with_activation_kind(act.kind, [&](auto k) {
        bn_activation_grad_kernel<T, decltype(k)::value><<<ctx.grid_for(n, kThreads), kThreads, 0, st>>>(
            x.as<const T>(), dy.as<const T>(), saved_mean.as<const float>(), scale, beta.as<const float>(), gs, n, C,
            act.alpha);
      });
      MPX_CUDA_LAUNCH_CHECK(st);
      g = gs;
    }
    channel_sums<T, ChannelSum::Bwd>(st, x.as<const T>(), g, saved_mean.as<const float>(),
                                     saved_invstd.as<const float>(), M, C, s.partial, s.s1, s.s2);
    bn_backward_coef_kernel<<<channel_blocks(C), kThreads, 0, st>>>(s.s1, s.s2, M, C, gamma.as<const float>(),
                                                                      saved_invstd.as<const float>(),
                                                                      dgamma.as<float>(), dbeta.as<float>(), s.f);
    MPX_CUDA_LAUNCH_CHECK(st);
    bn_backward_dx_kernel<T><<<ctx.grid_for(n, kThreads), kThreads, 0, st>>>(
        x.as<const T>(), g, saved_mean.as<const float>(), s.f, dx.as<T>(), n, C);
    MPX_CUDA_LAUNCH_CHECK(st);
  });
}

}  // namespace mpx::cuda
