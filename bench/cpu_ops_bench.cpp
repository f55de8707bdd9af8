// SPDX-License-Identifier: MIT
// Milliseconds per call of the CPU backend's convolutions (forward, backward-data,
// backward-filter) at the shapes of the smoke net and the CIFAR reference net, in
// float32 and bfloat16, then the rest of the smoke step (max pool, dense 5408->10,
// ReLU backward).
//   cpu_ops_bench [--cpu-time]
// --cpu-time reports process CPU time instead of wall time (on a shared, loaded
// machine run it with OMP_NUM_THREADS=1 to get the compute cost). Compare oneDNN
// with mpx's loops by running it again under MPX_CPU_REFERENCE=1.
#include <cstdio>
#include <cstring>

#include "bench/bench_util.h"

using namespace mpx;

namespace {

bool g_cpu_time = false;

template <typename F>
double time_ms(F&& f, int reps) {
  return bench::mean_ms(f, reps, g_cpu_time);
}

void bench_conv(bench::CpuDev& d, const char* name, DType t, int64_t N, int64_t H, int64_t W, int64_t C, int64_t K,
                const Conv2dParams& p, bool need_dx, int reps) {
  Rng rng(5);
  const int64_t P = p.out_h(static_cast<int>(H)), Q = p.out_w(static_cast<int>(W));
  Tensor x = d.rand(rng, t, Shape{N, H, W, C});
  Tensor w = d.rand(rng, t, Shape{K, p.R, p.S, C});
  Tensor b = d.rand(rng, DType::F32, Shape{K});
  Tensor y = d.make(t, Shape{N, P, Q, K});
  Tensor dy = d.rand(rng, t, Shape{N, P, Q, K});
  Tensor dx = d.make(t, Shape{N, H, W, C});
  Tensor dw = d.make(DType::F32, Shape{K, p.R, p.S, C}), db = d.make(DType::F32, Shape{K});
  const double f = time_ms([&] { d.be->conv2d_forward(p, x, w, b, y, Activation::Relu); }, reps);
  const double bd = need_dx ? time_ms([&] { d.be->conv2d_backward_data(p, dy, w, dx); }, reps) : 0.0;
  const double bf = time_ms([&] { d.be->conv2d_backward_filter(p, x, dy, dw, db); }, reps);
  std::printf("%-34s %-8s fwd %8.2f ms  bwd-data %8.2f ms  bwd-filter %8.2f ms  total %8.2f ms\n", name,
              dtype_name(t), f, bd, bf, f + bd + bf);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
    } else {
      std::fprintf(stderr, "usage: %s [--cpu-time]\n", argv[0]);
      return 2;
    }
  }
  bench::CpuDev d;
  Conv2dParams valid3;
  valid3.R = valid3.S = 3;
  Conv2dParams same3 = valid3;
  same3.pad_top = same3.pad_left = same3.pad_bottom = same3.pad_right = 1;
  for (DType t : {DType::F32, DType::BF16}) {
    bench_conv(d, "smoke conv 28x28x1->32 b128", t, 128, 28, 28, 1, 32, valid3, false, 20);
    bench_conv(d, "cifar conv1 32x32x3->64 b256", t, 256, 32, 32, 3, 64, same3, false, 3);
    bench_conv(d, "cifar conv2 32x32x64->128 b256", t, 256, 32, 32, 64, 128, same3, true, 3);
  }
  // The rest of the smoke step: max pool 2x2 (and its backward fused with ReLU's),
  // dense 5408->10, ReLU backward.
  for (DType t : {DType::F32, DType::BF16}) {
    Rng rng(6);
    Tensor a = d.rand(rng, t, Shape{128, 26, 26, 32});
    Tensor pooled = d.make(t, Shape{128, 13, 13, 32});
    Tensor dpooled = d.rand(rng, t, Shape{128, 13, 13, 32});
    Tensor da = d.make(t, Shape{128, 26, 26, 32});
    PoolParams pp;
    const double pf = time_ms([&] { d.be->pool_forward(pp, a, pooled); }, 20);
    const double pb = time_ms([&] { d.be->pool_backward(pp, a, pooled, dpooled, da); }, 20);
    const double prb = time_ms([&] { d.be->max_pool_relu_backward(pp, a, pooled, dpooled, da); }, 20);
    Tensor w = d.rand(rng, t, Shape{10, 5408});
    Tensor b = d.rand(rng, DType::F32, Shape{10});
    Tensor z = d.make(t, Shape{128, 10});
    Tensor dz = d.rand(rng, t, Shape{128, 10});
    Tensor dw = d.make(DType::F32, Shape{10, 5408}), db = d.make(DType::F32, Shape{10});
    const Tensor flat = pooled.reshaped(Shape{128, 5408});
    Tensor dp = d.make(t, Shape{128, 5408});
    const double df = time_ms([&] { d.be->dense_forward(flat, w, b, z, Activation::None); }, 20);
    const double dbd = time_ms([&] { d.be->dense_backward_data(dz, w, dp); }, 20);
    const double dbw = time_ms([&] { d.be->dense_backward_weights(flat, dz, dw, db); }, 20);
    std::printf("smoke %-8s maxpool fwd %.2f bwd %.2f bwd+relu %.2f ms; dense 5408->10 fwd %.2f bwd-data %.2f "
                "bwd-weights %.2f ms\n",
                dtype_name(t), pf, pb, prb, df, dbd, dbw);
    Tensor relu_y = d.make(t, a.shape);
    const double rb = time_ms([&] { d.be->activation_backward(Activation::Relu, a, a, relu_y); }, 20);
    std::printf("smoke %-8s relu backward [128,26,26,32] %.2f ms\n", dtype_name(t), rb);
  }
  return 0;
}
