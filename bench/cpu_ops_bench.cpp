// SPDX-License-Identifier: MIT
// Milliseconds per call of the CPU backend's convolutions (forward, backward-data,
// backward-filter) at the shapes of the smoke net and the CIFAR reference net, in
// float32 and bfloat16, then the rest of the smoke step (max pool, dense 5408->10,
// ReLU backward).
//   cpu_ops_bench [--cpu-time]
//   cpu_ops_bench [--seed] [--more] [--only TEXT] [--reps N]
//   cpu_ops_bench --activations [--reps N]
//   cpu_ops_bench --fast-cifar [--batch N] [--reps N]
//   cpu_ops_bench --pieces [--reps N]
// --cpu-time reports process CPU time instead of wall time (on a shared, loaded
// machine run it with OMP_NUM_THREADS=1 to get the compute cost). Compare oneDNN
// with mpx's loops by running it again under MPX_CPU_REFERENCE=1.
// --seed times each convolution and dense pass of the seed CIFAR net
// (configs/cifar10_fp32.yaml) and of the seed MNIST net (Conv2D(32, 3x3, relu) ->
// Flatten -> Dense(10), batch 256) and the smoke net's dense layer (5408 -> 10, batch 128)
// in float32 and bfloat16, and prints for each the
// median wall time and the mean process CPU time per call and the kernel that ran (the backend's
// kernels list). Run it under MPX_CPU_16BIT=widen and =native to compare the two 16-bit
// paths op by op (docs/precision.md, "16-bit arithmetic on the CPU"). --more does the same
// for more first layers (1-4 input channels) and for strided and 1x1 convolutions. --only TEXT
// times only the layers of --seed and --more whose name holds TEXT (e.g. "mnist dense").
// --activations times the activation loops (forward, backward) at the fast CIFAR recipe's
// largest activation, [1024, 15, 15, 64], in float32 and bfloat16, in the build that the CPU
// runs and in the baseline one (MPX_CPU_BASELINE=1), with their ratio (docs/cpu-performance.md,
// "Activations").
// --fast-cifar times each convolution pass of the fast CIFAR recipe (configs/cifar10_fast.yaml) at
// its batch of 1024 (--batch N) in float32 and bfloat16, with the kernel that ran and the direct
// convolution's GFLOP/s, so a pass's rate can be held against the float32 GEMM ceiling
// (bench/gemm_ceiling).
// --pieces times the seed MNIST net's forward at batch 256, the whole batch against pieces of 8,
// 16 and 32 rows, in float32 and bfloat16, with the caches cleared before each call
// (docs/cpu-performance.md, "Pieces of the batch"); then its backward (the dense layer's both
// passes, then the conv's weight gradient) the same ways, and in one walk
// (Backend::dense_conv_backward: "The first convolution's weight gradient in the dense walk");
// and the MNIST smoke net's max pooling backward then its first convolution's weight gradient,
// against the two in one op (Backend::max_pool_conv_backward: "Max pooling's backward in the first
// convolution's weight gradient"), and its forward the same ways (Backend::conv_max_pool_forward:
// "The first convolution's forward with max pooling").
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
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

struct WallCpu {
  double wall, cpu;
};

/// Median wall milliseconds of one call and mean process CPU milliseconds per call over `reps`
/// calls, after one untimed call. The CPU time is the whole loop's over `reps`: Linux brings the
/// other threads' CPU time into the process clock only at a scheduler tick or a switch, so one
/// call's difference can carry a tick of another call's (a median of those read more than the
/// thread count times the wall time).
template <typename F>
WallCpu median_wall_cpu(F&& f, int reps) {
  f();
  std::vector<double> w;
  const double c0 = bench::now_ms(true);
  for (int i = 0; i < reps; ++i) {
    const double w0 = bench::now_ms(false);
    f();
    w.push_back(bench::now_ms(false) - w0);
  }
  const double cpu = (bench::now_ms(true) - c0) / reps;
  std::sort(w.begin(), w.end());
  return {w[w.size() / 2], cpu};
}

/// The kernel the backend lists for the op whose description starts with `op` and holds
/// `shape` (the last one noted: each layer has a backend of its own), or "mpx loops".
std::string kernel_of(bench::CpuDev& d, const std::string& op, const std::string& shape) {
  std::string impl = "mpx loops";
  for (const KernelChoice& k : d.be->kernels())
    if (k.op.rfind(op, 0) == 0 && k.op.find(shape) != std::string::npos) impl = k.impl;
  return impl;
}

/// `flop` > 0: also the GFLOP/s of that many floating-point operations per call.
void report(bench::CpuDev& d, const char* layer, DType t, const char* pass, const std::string& op,
            const std::string& shape, const WallCpu& m, double flop = 0) {
  std::printf("%-28s %-8s %-12s wall %8.3f ms  cpu %8.3f ms  ", layer, dtype_name(t), pass, m.wall, m.cpu);
  if (flop > 0) std::printf("%6.0f GFLOP/s  ", flop / m.wall / 1e6);
  std::printf("%s\n", kernel_of(d, op, shape).c_str());
}

/// --only: the layers of --seed and --more timed (those whose name holds it; empty: all).
std::string g_only;
bool skipped(const char* layer) { return !g_only.empty() && std::string(layer).find(g_only) == std::string::npos; }

/// The three passes of one convolution; `flop` > 0: their GFLOP/s too (the direct convolution's).
void seed_conv(const char* layer, DType t, int64_t N, int64_t H, int64_t W, int64_t C, int64_t K,
               const Conv2dParams& p, bool need_dx, int reps, Activation act = Activation::Relu, double flop = 0,
               bool keep_pre = false) {
  if (skipped(layer)) return;
  bench::CpuDev d;  // a backend of its own: its kernels list holds this layer only
  Rng rng(5);
  const int64_t P = p.out_h(static_cast<int>(H)), Q = p.out_w(static_cast<int>(W));
  Tensor x = d.rand(rng, t, Shape{N, H, W, C}), w = d.rand(rng, t, Shape{K, p.R, p.S, C});
  Tensor b = d.rand(rng, t, Shape{K}), y = d.make(t, Shape{N, P, Q, K}), dy = d.rand(rng, t, Shape{N, P, Q, K});
  Tensor dx = d.make(t, Shape{N, H, W, C}), dw = d.make(t, Shape{K, p.R, p.S, C}), db = d.make(t, Shape{K});
  const std::string shape = "x [" + std::to_string(N) + ", " + std::to_string(H) + ", " + std::to_string(W) + ", " +
                            std::to_string(C) + "]";
  Tensor pre = keep_pre ? d.make(t, Shape{N, P, Q, K}) : Tensor();
  const std::string fwd = std::string(act.is_none() ? "fwd" : std::string("fwd+") + activation_name(act.kind)) +
                          (keep_pre ? "+pre" : "");
  report(d, layer, t, fwd.c_str(), "convolution forward", shape,
         median_wall_cpu([&] { d.be->conv2d_forward(p, x, w, b, y, act, pre); }, reps), flop);
  if (keep_pre) return;  // the forward with its epilogue only
  if (need_dx)
    report(d, layer, t, "bwd-data", "convolution backward data", shape,
           median_wall_cpu([&] { d.be->conv2d_backward_data(p, dy, w, dx); }, reps), flop);
  report(d, layer, t, "bwd-weights", "convolution backward weights", shape,
         median_wall_cpu([&] { d.be->conv2d_backward_filter(p, x, dy, dw, db); }, reps), flop);
}

/// tx: x's and dx's dtype (a float32 layer may read a 16-bit input as it is).
void seed_dense(const char* layer, DType t, int64_t N, int64_t Ci, int64_t Co, Activation act, int reps,
                DType tx) {
  if (skipped(layer)) return;
  bench::CpuDev d;
  Rng rng(7);
  Tensor x = d.rand(rng, tx, Shape{N, Ci}), w = d.rand(rng, t, Shape{Co, Ci}), b = d.rand(rng, t, Shape{Co});
  Tensor y = d.make(t, Shape{N, Co}), dy = d.rand(rng, t, Shape{N, Co}), dx = d.make(tx, Shape{N, Ci});
  Tensor dw = d.make(t, Shape{Co, Ci}), db = d.make(t, Shape{Co});
  const std::string shape = "w [" + std::to_string(Co) + ", " + std::to_string(Ci) + "]";
  report(d, layer, t, act.is_none() ? "fwd" : "fwd+relu", "inner product forward", shape,
         median_wall_cpu([&] { d.be->dense_forward(x, w, b, y, act); }, reps));
  report(d, layer, t, "bwd-data", "inner product backward data", shape,
         median_wall_cpu([&] { d.be->dense_backward_data(dy, w, dx); }, reps));
  // x as the output of the relu before the layer: its backward as a second pass, and fused.
  report(d, layer, t, "bwd-data, relu", "inner product backward data", shape, median_wall_cpu([&] {
           d.be->dense_backward_data(dy, w, dx);
           d.be->activation_backward(Activation::Relu, x, dx, dx);
         }, reps));
  report(d, layer, t, "bwd-data+relu", "inner product backward data", shape,
         median_wall_cpu([&] { d.be->dense_relu_backward_data(dy, w, x, dx); }, reps));
  report(d, layer, t, "bwd-weights", "inner product backward weights", shape,
         median_wall_cpu([&] { d.be->dense_backward_weights(x, dy, dw, db); }, reps));
  // Both backward passes of a dense layer after a relu, as a model runs them: one after the
  // other, and in one op (one walk over x where the chooser fuses them).
  report(d, layer, t, "bwd-weights, bwd-data+relu", "inner product backward weights", shape, median_wall_cpu([&] {
           d.be->dense_backward_weights(x, dy, dw, db);
           d.be->dense_relu_backward_data(dy, w, x, dx);
         }, reps));
  report(d, layer, t, "bwd-both+relu", "inner product backward weights", shape,
         median_wall_cpu([&] { d.be->dense_backward(x, dy, w, dw, db, dx, true); }, reps));
}

/// The passes of the seed nets, each at its batch of 256 (the weights' gradients in the
/// layer's compute dtype, as the model asks for them).
void seed_nets(int reps) {
  Conv2dParams valid3;
  valid3.R = valid3.S = 3;
  Conv2dParams same3 = valid3;
  same3.pad_top = same3.pad_left = same3.pad_bottom = same3.pad_right = 1;
  for (DType t : {DType::F32, DType::BF16}) {
    seed_conv("cifar conv1 32x32x3->64", t, 256, 32, 32, 3, 64, same3, false, reps);
    seed_conv("cifar conv2 32x32x64->128", t, 256, 32, 32, 64, 128, same3, true, reps);
    seed_dense("cifar dense 128->256", t, 256, 128, 256, Activation::Relu, 4 * reps, t);
    seed_dense("cifar dense 256->10", t, 256, 256, 10, Activation::None, 4 * reps, t);
    seed_conv("mnist conv 28x28x1->32", t, 256, 28, 28, 1, 32, valid3, false, 2 * reps);
    seed_dense("mnist dense 21632->10", t, 256, 21632, 10, Activation::None, 2 * reps, t);
    if (t != DType::F32)  // the seed net's float32 classifier after a 16-bit convolution
      seed_dense("mnist dense 21632->10, x 16-bit", DType::F32, 256, 21632, 10, Activation::None, 2 * reps, t);
    seed_dense("smoke dense 5408->10 b128", t, 128, 5408, 10, Activation::None, 4 * reps, t);
  }
}

/// More first layers (1-4 input channels), convolutions no mpx kernel takes (strided, 1x1) and
/// ResNet-20's 3x3 layers, for the 16-bit rule's shapes (docs/precision.md).
void more_convs(int reps) {
  Conv2dParams valid3;
  valid3.R = valid3.S = 3;
  Conv2dParams same3 = valid3;
  same3.pad_top = same3.pad_left = same3.pad_bottom = same3.pad_right = 1;
  Conv2dParams s2 = same3;
  s2.stride_h = s2.stride_w = 2;
  Conv2dParams one;
  one.R = one.S = 1;
  for (DType t : {DType::F32, DType::BF16}) {
    seed_conv("smoke conv 28x28x1->32 b128", t, 128, 28, 28, 1, 32, valid3, false, 2 * reps);
    seed_conv("conv same 28x28x1->32", t, 256, 28, 28, 1, 32, same3, false, 2 * reps);
    seed_conv("conv same 28x28x1->64", t, 256, 28, 28, 1, 64, same3, false, 2 * reps);
    seed_conv("conv valid 32x32x3->64", t, 256, 32, 32, 3, 64, valid3, false, reps);
    seed_conv("conv same 32x32x3->32", t, 256, 32, 32, 3, 32, same3, false, reps);
    seed_conv("conv same 32x32x3->16", t, 256, 32, 32, 3, 16, same3, false, reps);
    seed_conv("conv s2 32x32x16->32", t, 256, 32, 32, 16, 32, s2, true, reps);
    seed_conv("conv 1x1 16x16x64->128", t, 256, 16, 16, 64, 128, one, true, reps);
    // ResNet-20's 3x3 stride-1 layers (configs/cifar10_resnet.yaml): Winograd's shapes with few channels.
    seed_conv("resnet 32x32x16->16", t, 256, 32, 32, 16, 16, same3, true, reps);
    seed_conv("resnet 16x16x32->32", t, 256, 16, 16, 32, 32, same3, true, reps);
    seed_conv("resnet 8x8x64->64", t, 256, 8, 8, 64, 64, same3, true, reps);
  }
}

/// The convolutions of the fast CIFAR recipe (configs/cifar10_fast.yaml) at its batch, each
/// pass timed alone in float32 and bfloat16 with the kernel that ran and its direct-convolution
/// GFLOP/s (docs/cpu-performance.md, "When it runs").
void fast_cifar_convs(int reps, int64_t N) {
  Conv2dParams same3;
  same3.R = same3.S = 3;
  same3.pad_top = same3.pad_left = same3.pad_bottom = same3.pad_right = 1;
  Conv2dParams whiten;
  whiten.R = whiten.S = 2;
  struct L {
    const char* name;
    int64_t H, C, K;
    Conv2dParams p;
    bool need_dx;
  };
  const L layers[] = {{"whiten 32x32x3->24 2x2", 32, 3, 24, whiten, false},
                      {"block1_conv1 31x31x24->64", 31, 24, 64, same3, true},
                      {"block1_conv2 15x15x64->64", 15, 64, 64, same3, true},
                      {"block2_conv1 15x15x64->256", 15, 64, 256, same3, true},
                      {"block2_conv2 7x7x256->256", 7, 256, 256, same3, true},
                      {"block3_conv2 3x3x256->256", 3, 256, 256, same3, true}};
  std::printf("fast CIFAR convolutions at batch %lld, %d reps (median); GFLOP/s of the direct convolution\n",
              static_cast<long long>(N), reps);
  for (DType t : {DType::F32, DType::BF16})
    for (const L& l : layers) {
      const double flop = 2.0 * static_cast<double>(N) * l.p.out_h(static_cast<int>(l.H)) *
                          l.p.out_w(static_cast<int>(l.H)) * static_cast<double>(l.K * l.C * l.p.R * l.p.S);
      seed_conv(l.name, t, N, l.H, l.H, l.C, l.K, l.p, l.need_dx, reps, Activation{}, flop);
      // The whitening layer as the recipe runs it: GELU after it, its input kept for the backward.
      if (l.C == 3)
        seed_conv(l.name, t, N, l.H, l.H, l.C, l.K, l.p, false, reps, Activation{ActKind::Gelu}, flop, true);
    }
}

/// The activation loops in the chosen build and the baseline one, per kind and dtype.
void activations(int reps) {
  bench::CpuDev d;
  const Shape shape{1024, 15, 15, 64};
  const double n = static_cast<double>(shape.numel());
  unsetenv("MPX_CPU_BASELINE");
  const std::string chosen = cpu::activation_build();
  std::printf("activation loops at [1024, 15, 15, 64] (%.1fM elements), %d reps: the %s build against the "
              "baseline (ms per call, ns per element, baseline / %s)\n",
              n / 1e6, reps, chosen.c_str(), chosen.c_str());
  for (DType t : {DType::F32, DType::BF16}) {
    Rng rng(8);
    Tensor x = d.rand(rng, t, shape, nullptr, -4, 4);
    Tensor dy = d.rand(rng, t, shape);
    Tensor y = d.make(t, shape), dx = d.make(t, shape);
    for (ActKind k : {ActKind::Relu, ActKind::Gelu, ActKind::GeluTanh, ActKind::Silu}) {
      const Activation a{k};
      double ms[2][2];
      for (int base = 0; base < 2; ++base) {
        if (base) setenv("MPX_CPU_BASELINE", "1", 1);
        ms[base][0] = time_ms([&] { d.be->activation_forward(a, x, y); }, reps);
        ms[base][1] = time_ms([&] { d.be->activation_backward(a, x, dy, dx); }, reps);
        unsetenv("MPX_CPU_BASELINE");
      }
      for (int pass = 0; pass < 2; ++pass)
        std::printf("  %-8s %-9s %-8s %s %8.2f ms %6.3f ns/elem  baseline %8.2f ms  %5.2fx\n", dtype_name(t),
                    activation_name(k), pass ? "backward" : "forward", chosen.c_str(), ms[0][pass],
                    ms[0][pass] * 1e6 / n, ms[1][pass], ms[1][pass] / ms[0][pass]);
    }
  }
}

/// The seed MNIST net's forward (conv(relu) 28x28x1 -> 32, flatten, dense 21632 -> 10 in float32
/// reading the conv's output as it is) at batch 256: the whole batch, then pieces of 8, 16 and
/// 32 rows, each piece through the conv and at once through the dense layer, as the model runs
/// them (docs/cpu-performance.md, "Pieces of the batch"). Before each call 64 MB are written, so
/// that every call starts with its tensors out of the cache, as in a training step.
/// The median wall ms of reps calls of f, 64 MB written before each, so that every call starts
/// with its tensors out of the cache, as in a training step.
template <class F>
double cold_median(int reps, F&& f) {
  static std::vector<char> junk(size_t{64} << 20, 1);
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < junk.size(); i += 64) junk[i] = static_cast<char>(junk[i] + 1);
    const double t0 = bench::now_ms(false);
    f();
    v.push_back(bench::now_ms(false) - t0);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The MNIST smoke net's first convolution (relu) and 2x2 max pooling at its batch of 128: the
/// pooling's forward (keeping the window positions); the backward as the ops one after the other
/// (the pooling's, from the forward's window positions, then the weight gradient) and in one op
/// (Backend::max_pool_conv_backward); the forward, a training step's and an evaluation's, as two
/// ops and in one (Backend::conv_max_pool_forward); caches cleared.
void smoke_pool_conv(int reps) {
  constexpr int64_t N = 128;
  std::printf("MNIST smoke net conv+pool forward and backward at batch %lld, %d reps (median ms), caches cleared "
              "before each call\n",
              static_cast<long long>(N), reps);
  Conv2dParams p;
  p.R = p.S = 3;
  PoolParams pp;
  pp.kind = PoolKind::Max;
  pp.R = pp.S = pp.stride_h = pp.stride_w = 2;
  for (DType t : {DType::F32, DType::BF16}) {
    bench::CpuDev d;
    Rng rng(9);
    std::vector<float> yv;
    Tensor x = d.rand(rng, t, Shape{N, 28, 28, 1}), y = d.rand(rng, t, Shape{N, 26, 26, 32}, &yv);
    for (float& v : yv) v = std::max(v, 0.0f);  // a relu's output
    d.put(y, yv);
    Tensor py = d.make(t, Shape{N, 13, 13, 32}), am = d.make(DType::U8, py.shape);
    Tensor pdy = d.rand(rng, t, py.shape), dy = d.make(t, y.shape);
    Tensor dw = d.make(t, Shape{32, 3, 3, 1}), db = d.make(t, Shape{32});
    const double fwd = cold_median(reps, [&] { d.be->pool_forward(pp, y, py, am); });
    const double pool = cold_median(reps, [&] { d.be->max_pool_relu_backward(pp, y, py, pdy, dy, am); });
    const double wgrad = cold_median(reps, [&] { d.be->conv2d_backward_filter(p, x, dy, dw, db); });
    const double two = cold_median(reps, [&] {
      d.be->max_pool_relu_backward(pp, y, py, pdy, dy, am);
      d.be->conv2d_backward_filter(p, x, dy, dw, db);
    });
    const double one = cold_median(reps, [&] { d.be->max_pool_conv_backward(pp, y, py, pdy, dy, am, p, x, dw, db); });
    std::printf("%-8s pooling's forward (window positions kept) %7.3f ms\n", dtype_name(t), fwd);
    std::printf("%-8s pooling's backward %7.3f ms, weight gradient %7.3f ms, two ops %7.3f ms, one op %7.3f ms  "
                "two ops / one op %.2fx\n",
                dtype_name(t), pool, wgrad, two, one, two / one);
    std::printf("%-8s one op: %s\n", dtype_name(t),
                kernel_of(d, "convolution backward weights with", "x [128, 28, 28, 1]").c_str());
    // The forward: the convolution with relu and the pooling, two ops against one.
    Tensor w = d.rand(rng, t, Shape{32, 3, 3, 1}), b = d.rand(rng, t, Shape{32});
    const double cfwd = cold_median(reps, [&] { d.be->conv2d_forward(p, x, w, b, y, Activation::Relu); });
    const double ftwo = cold_median(reps, [&] {
      d.be->conv2d_forward(p, x, w, b, y, Activation::Relu);
      d.be->pool_forward(pp, y, py, am);
    });
    const double fone = cold_median(reps, [&] { d.be->conv_max_pool_forward(p, x, w, b, y, pp, py, am); });
    std::printf("%-8s forward: convolution %7.3f ms, two ops %7.3f ms, one op %7.3f ms  two ops / one op %.2fx%s\n",
                dtype_name(t), cfwd, ftwo, fone, ftwo / fone,
                d.be->conv_max_pool_forward_fuses(p, x.shape, w.shape, t, pp) ? "" : " (the one op runs the two)");
    // An evaluation's forward: no window positions.
    const double etwo = cold_median(reps, [&] {
      d.be->conv2d_forward(p, x, w, b, y, Activation::Relu);
      d.be->pool_forward(pp, y, py);
    });
    const double eone = cold_median(reps, [&] { d.be->conv_max_pool_forward(p, x, w, b, y, pp, py, Tensor()); });
    std::printf("%-8s evaluation's forward (no window positions): two ops %7.3f ms, one op %7.3f ms  two ops / one op "
                "%.2fx\n",
                dtype_name(t), etwo, eone, etwo / eone);
  }
}

void pieces(int reps) {
  constexpr int64_t N = 256;
  auto median = [&](auto&& f) { return cold_median(reps, f); };
  auto flat = [](Tensor a) {
    a.shape = Shape{a.shape[0], a.shape.numel() / a.shape[0]};
    return a;
  };
  std::printf("seed MNIST net forward at batch %lld, %d reps (median ms), caches cleared before each call\n",
              static_cast<long long>(N), reps);
  for (DType t : {DType::F32, DType::BF16}) {
    bench::CpuDev d;
    Rng rng(5);
    Conv2dParams p;
    p.R = p.S = 3;
    Tensor x = d.rand(rng, t, Shape{N, 28, 28, 1}), w = d.rand(rng, t, Shape{32, 3, 3, 1});
    Tensor b = d.rand(rng, t, Shape{32}), y = d.make(t, Shape{N, 26, 26, 32});
    Tensor W = d.rand(rng, DType::F32, Shape{10, 21632}), B = d.rand(rng, DType::F32, Shape{10});
    Tensor z = d.make(DType::F32, Shape{N, 10});
    const double whole = median([&] {
      d.be->conv2d_forward(p, x, w, b, y, Activation::Relu);
      d.be->dense_forward(flat(y), W, B, z, Activation::None);
    });
    std::printf("%-8s whole batch   %7.3f ms\n", dtype_name(t), whole);
    for (const int64_t rows : {int64_t{8}, int64_t{16}, int64_t{32}}) {
      const double piece = median([&] {
        for (int64_t c = 0; c < N; c += rows) {
          const Tensor yc = y.slice_rows(c, rows);
          d.be->conv2d_forward(p, x.slice_rows(c, rows), w, b, yc, Activation::Relu);
          d.be->dense_forward(flat(yc), W, B, z.slice_rows(c, rows), Activation::None);
        }
      });
      std::printf("%-8s pieces of %2lld %7.3f ms  whole / pieces %.2fx\n", dtype_name(t), static_cast<long long>(rows),
                  piece, whole / piece);
    }
    // The backward of the same layers: the dense layer's both passes (dx masked by the relu), then
    // the conv's weight gradient; in pieces each piece's weight gradients start again (timing only).
    Tensor dz = d.rand(rng, DType::F32, Shape{N, 10}), dW = d.make(DType::F32, Shape{10, 21632});
    Tensor dB = d.make(DType::F32, Shape{10}), dy = d.make(t, Shape{N, 26, 26, 32});
    Tensor dw = d.make(DType::F32, Shape{32, 3, 3, 1}), db = d.make(DType::F32, Shape{32});
    d.be->conv2d_forward(p, x, w, b, y, Activation::Relu);
    const double bwhole = median([&] {
      d.be->dense_backward(flat(y), dz, W, dW, dB, flat(dy), true);
      d.be->conv2d_backward_filter(p, x, dy, dw, db);
    });
    std::printf("%-8s backward whole batch   %7.3f ms\n", dtype_name(t), bwhole);
    const double bconv = median([&] { d.be->dense_conv_backward(flat(y), dz, W, dW, dB, flat(dy), p, x, dw, db); });
    std::printf("%-8s backward in one op     %7.3f ms  two ops / one op %.2fx\n", dtype_name(t), bconv,
                bwhole / bconv);
    for (const int64_t rows : {int64_t{8}, int64_t{16}, int64_t{32}}) {
      const double piece = median([&] {
        for (int64_t c = 0; c < N; c += rows) {
          const Tensor yc = y.slice_rows(c, rows), dyc = dy.slice_rows(c, rows);
          d.be->dense_backward(flat(yc), dz.slice_rows(c, rows), W, dW, dB, flat(dyc), true);
          d.be->conv2d_backward_filter(p, x.slice_rows(c, rows), dyc, dw, db);
        }
      });
      std::printf("%-8s backward pieces of %2lld %7.3f ms  whole / pieces %.2fx\n", dtype_name(t),
                  static_cast<long long>(rows), piece, bwhole / piece);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool seed = false, more = false, acts = false, fast = false, piece = false;
  int reps = 5;
  int64_t batch = 1024;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
    } else if (std::strcmp(argv[i], "--seed") == 0) {
      seed = true;
    } else if (std::strcmp(argv[i], "--more") == 0) {
      more = true;
    } else if (std::strcmp(argv[i], "--activations") == 0) {
      acts = true;
    } else if (std::strcmp(argv[i], "--fast-cifar") == 0) {
      fast = true;
    } else if (std::strcmp(argv[i], "--pieces") == 0) {
      piece = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      g_only = argv[++i];
    } else if (std::strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
      batch = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--cpu-time] | [--seed] [--more] [--only TEXT] [--reps N] | --activations [--reps N] | "
                   "--fast-cifar [--batch N] [--reps N] | --pieces [--reps N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (acts) {
    activations(reps);
    return 0;
  }
  if (fast) {
    fast_cifar_convs(reps, batch);
    return 0;
  }
  if (piece) {
    pieces(reps);
    smoke_pool_conv(4 * reps);
    return 0;
  }
  if (seed || more) {
    if (seed) seed_nets(reps);
    if (more) more_convs(reps);
    return 0;
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
