// SPDX-License-Identifier: MIT
// Median milliseconds per call of the CPU backend's dense, pooling, global pooling
// and add at the smoke and CIFAR shapes (float32): the ops that run on oneDNN, and
// max pooling (mpx's own kernels) beside them.
//   dnnl_ops_bench
// Run it again under MPX_CPU_REFERENCE=1 for mpx's plain loops.
#include <cstdio>

#include "bench/bench_util.h"

using namespace mpx;
using bench::median_ms;

int main() {
  bench::CpuDev d;
  Rng rng(9);
  const int reps = 15;
  auto dense = [&](const char* name, int64_t N, int64_t Ci, int64_t Co, Activation act) {
    Tensor x = d.rand(rng, DType::F32, Shape{N, Ci}), w = d.rand(rng, DType::F32, Shape{Co, Ci});
    Tensor b = d.rand(rng, DType::F32, Shape{Co}), y = d.make(DType::F32, Shape{N, Co});
    Tensor dy = d.rand(rng, DType::F32, Shape{N, Co}), dx = d.make(DType::F32, Shape{N, Ci});
    Tensor dw = d.make(DType::F32, Shape{Co, Ci}), db = d.make(DType::F32, Shape{Co});
    const double f = median_ms([&] { d.be->dense_forward(x, w, b, y, act); }, reps);
    const double bd = median_ms([&] { d.be->dense_backward_data(dy, w, dx); }, reps);
    const double bw = median_ms([&] { d.be->dense_backward_weights(x, dy, dw, db); }, reps);
    std::printf("%-34s fwd %7.3f  bwd-data %7.3f  bwd-weights %7.3f ms\n", name, f, bd, bw);
  };
  dense("smoke dense 256x5408 -> 10", 256, 5408, 10, Activation::None);
  dense("cifar dense 256x128 -> 256 relu", 256, 128, 256, Activation::Relu);
  dense("cifar dense 256x256 -> 10", 256, 256, 10, Activation::None);

  auto pool = [&](const char* name, PoolParams p, int64_t N, int64_t H, int64_t W, int64_t C) {
    Tensor x = d.rand(rng, DType::F32, Shape{N, H, W, C});
    const int64_t P = p.out_h(static_cast<int>(H)), Q = p.out_w(static_cast<int>(W));
    Tensor y = d.make(DType::F32, Shape{N, P, Q, C}), dx = d.make(DType::F32, Shape{N, H, W, C});
    const double f = median_ms([&] { d.be->pool_forward(p, x, y); }, reps);
    const double b = median_ms([&] { d.be->pool_backward(p, x, y, y, dx); }, reps);
    std::printf("%-34s fwd %7.3f  bwd %7.3f ms\n", name, f, b);
  };
  PoolParams avg;
  avg.kind = PoolKind::Avg;
  pool("avg pool 2x2/2 256x26x26x32", avg, 256, 26, 26, 32);
  PoolParams avg3 = avg;
  avg3.R = avg3.S = 3, avg3.pad_top = avg3.pad_left = avg3.pad_bottom = avg3.pad_right = 1;
  pool("avg pool 3x3/2 same 256x32x32x64", avg3, 256, 32, 32, 64);
  PoolParams mx;
  pool("max pool 2x2/2 256x26x26x32 (ours)", mx, 256, 26, 26, 32);

  Tensor gx = d.rand(rng, DType::F32, Shape{256, 32, 32, 128}), gy = d.make(DType::F32, Shape{256, 128});
  Tensor gdx = d.make(DType::F32, Shape{256, 32, 32, 128});
  const double gf = median_ms([&] { d.be->global_avg_pool_forward(gx, gy); }, reps);
  const double gb = median_ms([&] { d.be->global_avg_pool_backward(gy, gdx); }, reps);
  std::printf("%-34s fwd %7.3f  bwd %7.3f ms\n", "cifar gap 256x32x32x128", gf, gb);

  Tensor a = d.rand(rng, DType::F32, Shape{256, 32, 32, 64}), b = d.rand(rng, DType::F32, a.shape);
  Tensor s = d.make(DType::F32, a.shape);
  const double ad = median_ms([&] { d.be->add(a, b, s); }, reps);
  const double ai = median_ms([&] { d.be->add(s, b, s); }, reps);
  std::printf("%-34s %7.3f ms, in place %7.3f ms\n", "add 256x32x32x64 f32", ad, ai);
  return 0;
}
