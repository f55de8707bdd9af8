// SPDX-License-Identifier: MIT
// Softmax cross-entropy in float32 from float32 logits (max subtracted, so exp
// never overflows), with the loss sum, the correct count and dlogits, all on the
// device (no host synchronisation). The twin of cpu/loss.cpp. A label outside
// [0, K) cannot throw here (the kernel is asynchronous): its row's loss and
// dlogits are NaN, so the step is reported non-finite; the data readers reject such
// labels before they get here. The _scaled variant reads the loss scale from the
// StepState on the device and is otherwise the same kernel, so its dlogits equal the
// host-scaled call's bit for bit.
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ops.h"
#include "backend/step_state.h"

namespace mpx::cuda {

// ---- kernels -----------------------------------------------------------------------

// One warp per row. row_out[n] = {-log p[label], 1 if argmax == label}. The dlogits factor g is
// g_host, or, when st is not null, step_grad_scale(*st, weight) / N computed here with the same
// float operations as the host launcher (grad_scale / float(N)).
// With label smoothing e > 0 the target is (1 - e) onehot + e / K (cpu/loss.cpp's formulas; the
// sum of the logits is a warp reduction, so it may differ from the CPU's in its last bits).
__global__ void softmax_cross_entropy_kernel(const float* __restrict__ z, const int32_t* __restrict__ labels,
                                             int64_t N, int K, float g_host, const StepState* __restrict__ st,
                                             double weight, float2* __restrict__ row_out, float* __restrict__ dz,
                                             float e) {
  const float g = st ? __fdiv_rn(step_grad_scale(*st, weight), static_cast<float>(N)) : g_host;
  const float keep = 1.0f - e, spread = e / static_cast<float>(K);
  const int lane = threadIdx.x % 32;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t n = warp; n < N; n += warps) {
    const float* zi = z + n * K;
    const int32_t y = labels[n];
    // First maximum (strict >, lowest index on ties), as the CPU's sequential scan.
    float m = -INFINITY;
    int arg = K;
    for (int k = lane; k < K; k += 32) {
      const float v = zi[k];
      if (arg == K || v > m) {
        m = v;
        arg = k;
      }
    }
    for (int off = 16; off > 0; off /= 2) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
      const int a2 = __shfl_xor_sync(0xffffffffu, arg, off);
      if (a2 < K && (arg == K || m2 > m || (m2 == m && a2 < arg))) {
        m = m2;
        arg = a2;
      }
    }
    m = __shfl_sync(0xffffffffu, m, 0);  // every lane uses lane 0's values
    arg = __shfl_sync(0xffffffffu, arg, 0);
    float s = 0.0f;
    for (int k = lane; k < K; k += 32) s += expf(zi[k] - m);
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    s = __shfl_sync(0xffffffffu, s, 0);
    float zsum = 0.0f;
    if (e > 0.0f) {
      for (int k = lane; k < K; k += 32) zsum += zi[k];
      for (int off = 16; off > 0; off /= 2) zsum += __shfl_xor_sync(0xffffffffu, zsum, off);
    }
    const bool valid = y >= 0 && y < K;
    if (lane == 0) {
      // -log p[y] = log(s) + (m - z[y]): no large lse minus large logit.
      const float row = e > 0.0f ? logf(s) + (keep * (m - zi[y]) + e * (m - zsum / static_cast<float>(K)))
                                 : logf(s) + (m - zi[y]);
      row_out[n] = valid ? make_float2(row, arg == y ? 1.0f : 0.0f) : make_float2(NAN, 0.0f);
    }
    if (dz) {
      const float inv = 1.0f / s;
      float* d = dz + n * K;
      for (int k = lane; k < K; k += 32)
        d[k] = valid ? g * (expf(zi[k] - m) * inv - ((k == y ? keep : 0.0f) + spread)) : NAN;
    }
  }
}

// One block: sums the rows in double in a fixed order (deterministic).
__global__ void loss_sum_kernel(const float2* __restrict__ row_out, int64_t N, float* __restrict__ loss_sum,
                                float* __restrict__ correct) {
  __shared__ double sl[kThreads];
  __shared__ double sc[kThreads];
  double l = 0.0, c = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    l += row_out[i].x;
    c += row_out[i].y;
  }
  sl[threadIdx.x] = l;
  sc[threadIdx.x] = c;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) {
      sl[threadIdx.x] += sl[threadIdx.x + s];
      sc[threadIdx.x] += sc[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    loss_sum[0] = static_cast<float>(sl[0]);
    correct[0] = static_cast<float>(sc[0]);
  }
}

// ---- launchers ---------------------------------------------------------------------

namespace {
// st == nullptr: g is the factor of dlogits; otherwise the kernel derives it from the StepState.
void launch_softmax_cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, float g,
                                  const StepState* st, double weight, const Tensor& loss_sum_out,
                                  const Tensor& correct_out, const Tensor& dlogits, float e) {
  const int64_t N = logits.shape[0];
  const int K = static_cast<int>(logits.shape[1]);
  auto* rows = static_cast<float2*>(ctx.scratch(kSlotRows, sizeof(float2) * static_cast<size_t>(N > 0 ? N : 1)));
  cudaStream_t stream = ctx.stream();
  if (N > 0) {
    const int64_t threads = N * 32;
    const unsigned grid = ctx.grid_for(threads, kThreads);
    softmax_cross_entropy_kernel<<<grid, kThreads, 0, stream>>>(logits.as<const float>(),
                                                                 labels.as<const int32_t>(), N, K, g, st, weight,
                                                                 rows, dlogits.empty() ? nullptr : dlogits.as<float>(),
                                                                 e);
    MPX_CUDA_LAUNCH_CHECK(stream);
  }
  loss_sum_kernel<<<1, kThreads, 0, stream>>>(rows, N, loss_sum_out.as<float>(), correct_out.as<float>());
  MPX_CUDA_LAUNCH_CHECK(stream);
}
}  // namespace

void softmax_cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, float grad_scale,
                           const Tensor& loss_sum_out, const Tensor& correct_out, const Tensor& dlogits,
                           float label_smoothing) {
  const int64_t N = logits.shape[0];
  const float g = N > 0 ? grad_scale / static_cast<float>(N) : 0.0f;
  launch_softmax_cross_entropy(ctx, logits, labels, g, nullptr, 0.0, loss_sum_out, correct_out, dlogits,
                               label_smoothing);
}

void softmax_cross_entropy_scaled(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& state,
                                  double weight, const Tensor& loss_sum_out, const Tensor& correct_out,
                                  const Tensor& dlogits, float label_smoothing) {
  launch_softmax_cross_entropy(ctx, logits, labels, 0.0f, state.as<const StepState>(), weight, loss_sum_out,
                               correct_out, dlogits, label_smoothing);
}

}  // namespace mpx::cuda
