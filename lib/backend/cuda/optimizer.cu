// SPDX-License-Identifier: MIT
// The fused passes over the flat float32 arenas: unscale-and-check (one kernel,
// one device flag, one 4-byte read back), the optimizer update (SGD/momentum/
// Nesterov, Adam, AdamW, AMSGrad; Keras formulas) that also writes the rounded 16-bit
// compute copy, and tensor statistics. The twin of cpu/optimizer.cpp: every
// float32 operation is an explicit _rn intrinsic in the CPU's order, so that nvcc
// contracts nothing into an FMA and the results are bit for bit the CPU's.
//
// The step without host synchronisation (the *_state launchers) runs the same kernels with
// the scale, the verdict, lr and Adam's t read from a StepState and an lr word in device
// memory: nothing is read back, nothing waits for the host, and every launch can be captured
// into a CUDA graph.
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/step_math.h"
#include "backend/step_state.h"

namespace mpx::cuda {

// ---- kernels -----------------------------------------------------------------------

// inv_scale from the host, or, when st is not null, step_inv_scale(*st, world) computed here.
__global__ void unscale_and_check_kernel(float* __restrict__ g, float inv_scale, const StepState* st, int world,
                                         int64_t n, int* bad) {
  const float inv = st ? step_inv_scale(*st, world) : inv_scale;
  int local = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = __fmul_rn(g[i], inv);
    g[i] = v;
    local |= isfinite(v) ? 0 : 1;
  }
  if (__syncthreads_or(local) && threadIdx.x == 0) *bad = 1;  // benign race: every writer writes 1
}

// The verdict of unscale_and_check_state: finite when no gradient was bad and the loss is finite.
__global__ void step_verdict_kernel(StepState* st, const float* __restrict__ loss_sum) {
  st->finite = (st->bad == 0 && step_isfinite(*loss_sum)) ? 1 : 0;
}

// The hyper-parameters an optimizer kernel reads from device memory in the step without host
// synchronisation: the StepState (verdict, applied_total) and lr. Null st: the host's values.
struct DeviceStep {
  const StepState* st = nullptr;
  const float* lr = nullptr;
  float lr_scale = 1.0f;  // OptimizerStep::lr_scale
};

// Per block, when d.st is set: thread 0 reads the verdict and lr (and derives Adam's lr_t for
// t = applied_total + 1); false for every thread of the block when the step is skipped.
// Otherwise lr and lr_t keep the host's values.
__device__ __forceinline__ bool device_step(const DeviceStep& d, bool adam, float b1, float b2, float& lr,
                                            float& lr_t) {
  if (!d.st) return true;  // uniform over the grid
  __shared__ float sh_lr, sh_lr_t;
  __shared__ int sh_go;
  if (threadIdx.x == 0) {
    sh_go = d.st->finite != 0;
    if (sh_go) {
      sh_lr = __fmul_rn(*d.lr, d.lr_scale);
      sh_lr_t = adam ? adam_lr_t(sh_lr, b1, b2, d.st->applied_total + 1) : 0.0f;
    }
  }
  __syncthreads();
  if (!sh_go) return false;
  lr = sh_lr;
  lr_t = sh_lr_t;
  return true;
}

// The 16-bit compute copy (copy_kind 0: none, 1: float16, 2: bfloat16).
__device__ __forceinline__ void store_copy(void* copy, int copy_kind, int64_t i, float w) {
  if (copy_kind == 1)
    static_cast<__half*>(copy)[i] = __float2half_rn(w);
  else if (copy_kind == 2)
    static_cast<__nv_bfloat16*>(copy)[i] = __float2bfloat16_rn(w);
}

__global__ void sgd_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m, float lr,
                           float wd, float mom, bool use_m, bool nesterov, void* copy, int copy_kind, int64_t n,
                           DeviceStep dev) {
  float unused = 0.0f;
  if (!device_step(dev, false, 0.0f, 0.0f, lr, unused)) return;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float wi = w[i];
    float gi = g[i];
    if (wd != 0.0f) gi = __fadd_rn(gi, __fmul_rn(wd, wi));
    if (use_m) {
      const float vi = __fsub_rn(__fmul_rn(mom, m[i]), __fmul_rn(lr, gi));
      m[i] = vi;
      wi = __fadd_rn(wi, nesterov ? __fsub_rn(__fmul_rn(mom, vi), __fmul_rn(lr, gi)) : vi);
    } else {
      wi = __fsub_rn(wi, __fmul_rn(lr, gi));
    }
    w[i] = wi;
    store_copy(copy, copy_kind, i, wi);
  }
}

// Keras Adam/AdamW: w -= lr_t * m / (sqrt(v) + eps), lr_t from the host (double, as the CPU) or
// from device_step (step_math.h). kAmsgrad (Keras amsgrad=True): the denominator takes
// v_hat = max(v_hat, v), kept in vh (null otherwise).
template <bool kAmsgrad>
__global__ void adam_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, float* __restrict__ vh, float lr, float lr_t, float wd, float b1,
                            float b2, float eps, bool adamw, void* copy, int copy_kind, int64_t n, DeviceStep dev) {
  if (!device_step(dev, true, b1, b2, lr, lr_t)) return;
  const float ob1 = __fsub_rn(1.0f, b1), ob2 = __fsub_rn(1.0f, b2);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float wi = w[i];
    float gi = g[i];
    if (wd != 0.0f) {
      if (adamw)
        wi = __fsub_rn(wi, __fmul_rn(__fmul_rn(lr, wd), wi));
      else
        gi = __fadd_rn(gi, __fmul_rn(wd, wi));
    }
    const float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(ob1, gi));
    const float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(ob2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    float vd = vi;
    if constexpr (kAmsgrad) {
      const float hi = vh[i];
      vd = hi >= vi ? hi : vi;  // a NaN v wins, as on the CPU
      vh[i] = vd;
    }
    wi = __fsub_rn(wi, __fdiv_rn(__fmul_rn(lr_t, mi), __fadd_rn(__fsqrt_rn(vd), eps)));
    w[i] = wi;
    store_copy(copy, copy_kind, i, wi);
  }
}

struct StatsPartial {
  float mn, mx;
  double sum_abs;
  unsigned long long n_inf, n_nan, n_zero;
};

template <typename T>
__global__ void stats_kernel(const T* __restrict__ x, int64_t n, StatsPartial* __restrict__ out) {
  __shared__ StatsPartial sh[kThreads];
  StatsPartial p{INFINITY, -INFINITY, 0.0, 0, 0, 0};
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = to_float(x[i]);
    if (isnan(v)) {
      ++p.n_nan;
    } else if (isinf(v)) {
      ++p.n_inf;
    } else {
      if (v == 0.0f) ++p.n_zero;
      p.mn = fminf(p.mn, v);
      p.mx = fmaxf(p.mx, v);
      p.sum_abs += fabsf(v);
    }
  }
  sh[threadIdx.x] = p;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) {
      StatsPartial& a = sh[threadIdx.x];
      const StatsPartial& b = sh[threadIdx.x + s];
      a.mn = fminf(a.mn, b.mn);
      a.mx = fmaxf(a.mx, b.mx);
      a.sum_abs += b.sum_abs;
      a.n_inf += b.n_inf;
      a.n_nan += b.n_nan;
      a.n_zero += b.n_zero;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sh[0];
}

// ---- launchers ---------------------------------------------------------------------

bool unscale_and_check(Context& ctx, const Tensor& grads, float inv_scale) {
  const int64_t n = grads.numel();
  cudaStream_t st = ctx.stream();
  MPX_CUDA_CHECK(cudaMemsetAsync(ctx.device_flag(), 0, sizeof(int), st));
  if (n > 0) {
    unscale_and_check_kernel<<<ctx.grid_for(n, kThreads), kThreads, 0, st>>>(grads.as<float>(), inv_scale, nullptr,
                                                                              1, n, ctx.device_flag());
    MPX_CUDA_LAUNCH_CHECK(st);
  }
  MPX_CUDA_CHECK(cudaMemcpyAsync(ctx.host_flag(), ctx.device_flag(), sizeof(int), cudaMemcpyDeviceToHost, st));
  MPX_CUDA_CHECK(cudaStreamSynchronize(st));
  return *ctx.host_flag() == 0;
}

namespace {
// optimizer_step with the host's lr and t (dev.st null) or the device's (dev.st, dev.lr).
void launch_optimizer(Context& ctx, const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                      const std::vector<Tensor>& states, const Tensor& compute_copy, DeviceStep dev) {
  const int64_t n = master.numel();
  if (n == 0) return;
  // The state arenas in core/optimizer_kind.h's order (nullptr where absent).
  auto arena = [&](size_t i) { return i < states.size() && !states[i].empty() ? states[i].as<float>() : nullptr; };
  float* m = arena(0);
  float* v = arena(1);
  void* copy = compute_copy.empty() ? nullptr : compute_copy.data;
  const int copy_kind = compute_copy.empty() ? 0 : compute_copy.dtype == DType::F16 ? 1 : 2;
  MPX_CHECK_MSG(compute_copy.empty() || is_16bit(compute_copy.dtype), "optimizer_step: compute copy must be 16-bit");
  cudaStream_t st = ctx.stream();
  const unsigned grid = ctx.grid_for(n, kThreads);

  if (s.kind == OptimizerStep::Kind::Sgd) {
    const bool use_m = s.momentum != 0.0f && m;
    sgd_kernel<<<grid, kThreads, 0, st>>>(master.as<float>(), grads.as<const float>(), m, s.lr, s.weight_decay,
                                          s.momentum, use_m, s.nesterov, copy, copy_kind, n, dev);
    MPX_CUDA_LAUNCH_CHECK(st);
    return;
  }
  // lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t), in double on the host exactly as cpu/optimizer.cpp
  // (with the device's lr and t, the kernel computes it: device_step).
  float lr_t = 0.0f;
  if (!dev.st) {
    const double t = static_cast<double>(s.t);
    const double b1t = std::pow(static_cast<double>(s.beta1), t), b2t = std::pow(static_cast<double>(s.beta2), t);
    lr_t = static_cast<float>(static_cast<double>(s.lr) * std::sqrt(1.0 - b2t) / (1.0 - b1t));
  }
  MPX_CHECK_MSG(m && v, "optimizer_step: Adam needs both state arenas");
  const bool adamw = s.kind == OptimizerStep::Kind::AdamW;
  if (s.kind == OptimizerStep::Kind::Amsgrad) {
    float* vh = arena(2);
    MPX_CHECK_MSG(vh, "optimizer_step: AMSGrad needs its third state arena");
    adam_kernel<true><<<grid, kThreads, 0, st>>>(master.as<float>(), grads.as<const float>(), m, v, vh, s.lr, lr_t,
                                                 s.weight_decay, s.beta1, s.beta2, s.epsilon, adamw, copy,
                                                 copy_kind, n, dev);
  } else {
    adam_kernel<false><<<grid, kThreads, 0, st>>>(master.as<float>(), grads.as<const float>(), m, v, nullptr, s.lr,
                                                  lr_t, s.weight_decay, s.beta1, s.beta2, s.epsilon, adamw, copy,
                                                  copy_kind, n, dev);
  }
  MPX_CUDA_LAUNCH_CHECK(st);
}
}  // namespace

void optimizer_step(Context& ctx, const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                    const std::vector<Tensor>& states, const Tensor& compute_copy) {
  launch_optimizer(ctx, s, master, grads, states, compute_copy, DeviceStep{});
}

// ---- the step without host synchronisation ---------------------------------------

__global__ void loss_scale_update_kernel(StepState* st, LossScaleRule rule, const float* __restrict__ loss_sum,
                                         const float* __restrict__ correct, int64_t n) {
  step_state_update(*st, rule, *loss_sum, *correct, n);
}

void unscale_and_check_state(Context& ctx, const Tensor& grads, const Tensor& loss_sum, const Tensor& state,
                             int world) {
  auto* stp = state.as<StepState>();
  int* bad = reinterpret_cast<int*>(static_cast<char*>(state.data) + offsetof(StepState, bad));
  static_assert(sizeof(int) == sizeof(StepState::bad), "StepState::bad is the kernel's int flag");
  cudaStream_t st = ctx.stream();
  MPX_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), st));
  const int64_t n = grads.empty() ? 0 : grads.numel();
  if (n > 0) {
    unscale_and_check_kernel<<<ctx.grid_for(n, kThreads), kThreads, 0, st>>>(grads.as<float>(), 0.0f, stp, world,
                                                                              n, bad);
    MPX_CUDA_LAUNCH_CHECK(st);
  }
  step_verdict_kernel<<<1, 1, 0, st>>>(stp, loss_sum.as<const float>());
  MPX_CUDA_LAUNCH_CHECK(st);
}

void optimizer_step_state(Context& ctx, const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                          const std::vector<Tensor>& states, const Tensor& compute_copy, const Tensor& state,
                          const Tensor& lr_dev) {
  DeviceStep dev;
  dev.st = state.as<const StepState>();
  dev.lr = lr_dev.as<const float>();
  dev.lr_scale = s.lr_scale;
  launch_optimizer(ctx, s, master, grads, states, compute_copy, dev);
}

void loss_scale_update_state(Context& ctx, const Tensor& state, const LossScaleRule& rule, const Tensor& loss_sum,
                             const Tensor& correct, int64_t n) {
  cudaStream_t st = ctx.stream();
  loss_scale_update_kernel<<<1, 1, 0, st>>>(state.as<StepState>(), rule, loss_sum.as<const float>(),
                                            correct.as<const float>(), n);
  MPX_CUDA_LAUNCH_CHECK(st);
}

TensorStats stats(Context& ctx, const Tensor& x) {
  const int64_t total = x.numel();
  TensorStats r;
  r.count = total;
  if (total == 0) return r;
  const unsigned grid = std::min<unsigned>(ctx.grid_for(total, kThreads), 1024u);
  auto* parts = static_cast<StatsPartial*>(ctx.scratch(kSlotRows, sizeof(StatsPartial) * grid));
  cudaStream_t st = ctx.stream();
  MPX_CUDA_DISPATCH_FLOAT(x.dtype, T, {
    stats_kernel<T><<<grid, kThreads, 0, st>>>(x.as<const T>(), total, parts);
    MPX_CUDA_LAUNCH_CHECK(st);
  });
  std::vector<StatsPartial> host(grid);
  MPX_CUDA_CHECK(cudaMemcpyAsync(host.data(), parts, sizeof(StatsPartial) * grid, cudaMemcpyDeviceToHost, st));
  MPX_CUDA_CHECK(cudaStreamSynchronize(st));
  double mn = std::numeric_limits<double>::infinity(), mx = -std::numeric_limits<double>::infinity(), sum_abs = 0;
  for (const StatsPartial& p : host) {
    mn = std::min<double>(mn, p.mn);
    mx = std::max<double>(mx, p.mx);
    sum_abs += p.sum_abs;
    r.n_inf += static_cast<int64_t>(p.n_inf);
    r.n_nan += static_cast<int64_t>(p.n_nan);
    r.n_zero += static_cast<int64_t>(p.n_zero);
  }
  const int64_t finite = total - r.n_inf - r.n_nan;
  if (finite > 0) {
    r.min = mn;
    r.max = mx;
    r.mean_abs = sum_abs / static_cast<double>(finite);
  }
  return r;
}

}  // namespace mpx::cuda
