// SPDX-License-Identifier: MIT
// The CPU backend's 3x3 stride-1 convolutions at the CIFAR net's shapes and a few others:
// forward (bias + relu), backward-data and weight gradient, milliseconds per call, GFLOP/s
// counted as the direct convolution's 2*N*P*Q*K*C*9 (so Winograd's figure is
// "direct-equivalent"), and which kernel ran (oneDNN's implementation name,
// winograd:F(mxm,3x3) or gemm:sgemm). The kernels are whatever MPX_CONV_WINOGRAD and
// MPX_CONV_WGRAD pick, so compare paths by running it under off, on and f2, alternating
// (docs/cpu-performance.md, "Winograd convolution"):
//   winograd_bench [--cpu-time] [--reps N] [--only SUBSTRING] [--tiles T,T,...]
// --tiles times the Winograd kernel itself (conv_winograd, forward, and conv_winograd_wgrad)
// with those tile-block sizes instead of the default ones (0: the default), to tune
// winograd_tiles_per_block() and winograd_wgrad_tiles_per_block(); --m 4 or 2 times that tile only.
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/conv/conv_winograd.h"
#include "bench/bench_util.h"

using namespace mpx;

namespace {

struct Layer {
  const char* name;
  int64_t N, H, W, C, K;
};

const Layer kLayers[] = {
    {"cifar conv2 32x32x64->128 b256", 256, 32, 32, 64, 128},
    // The fast CIFAR recipe's Winograd layers at its batch (configs/cifar10_fast.yaml).
    {"fast 31x31x24->64 b1024", 1024, 31, 31, 24, 64},
    {"fast 15x15x64->64 b1024", 1024, 15, 15, 64, 64},
    {"fast 15x15x64->256 b1024", 1024, 15, 15, 64, 256},
    {"fast 7x7x256->256 b1024", 1024, 7, 7, 256, 256},
    {"32x32x16->16 b256", 256, 32, 32, 16, 16},
    {"32x32x32->32 b256", 256, 32, 32, 32, 32},
    {"16x16x128->128 b256", 256, 16, 16, 128, 128},
    {"8x8x256->256 b256", 256, 8, 8, 256, 256},
    {"28x28x32->64 b128", 128, 28, 28, 32, 64},
    {"32x32x8->16 b256", 256, 32, 32, 8, 16},
    {"4x4x256->256 b256", 256, 4, 4, 256, 256},
    {"6x6x64->64 b256", 256, 6, 6, 64, 64},
};

bool g_cpu_time = false;
int g_reps = 3;

double gflops(const Layer& l, double ms) { return 2.0 * l.N * l.H * l.W * l.K * l.C * 9 / (ms * 1e6); }

std::string impl_of(const bench::CpuDev& d, const std::string& op) {
  for (const KernelChoice& k : d.be->kernels())
    if (k.op == op) return k.impl;
  return "?";
}

void bench_layer(const Layer& l) {
  bench::CpuDev d;
  Rng rng(5);
  Conv2dParams p;
  p.R = p.S = 3;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = 1;
  Tensor x = d.rand(rng, DType::F32, Shape{l.N, l.H, l.W, l.C}), w = d.rand(rng, DType::F32, Shape{l.K, 3, 3, l.C});
  Tensor b = d.rand(rng, DType::F32, Shape{l.K}), y = d.make(DType::F32, Shape{l.N, l.H, l.W, l.K});
  Tensor dy = d.rand(rng, DType::F32, Shape{l.N, l.H, l.W, l.K}), dx = d.make(DType::F32, Shape{l.N, l.H, l.W, l.C});
  const double f = bench::mean_ms([&] { d.be->conv2d_forward(p, x, w, b, y, Activation::Relu); }, g_reps, g_cpu_time);
  const double bd = bench::mean_ms([&] { d.be->conv2d_backward_data(p, dy, w, dx); }, g_reps, g_cpu_time);
  Tensor dw = d.make(DType::F32, Shape{l.K, 3, 3, l.C}), db = d.make(DType::F32, Shape{l.K});
  const double bw = bench::mean_ms([&] { d.be->conv2d_backward_filter(p, x, dy, dw, db); }, g_reps, g_cpu_time);
  const std::string shapes = "x [" + std::to_string(l.N) + ", " + std::to_string(l.H) + ", " + std::to_string(l.W) +
                             ", " + std::to_string(l.C) + "], w [" + std::to_string(l.K) + ", 3, 3, " +
                             std::to_string(l.C) + "]";
  std::printf("%-32s fwd %8.2f ms %6.1f GFLOP/s [%s]  bwd-data %8.2f ms %6.1f GFLOP/s [%s]\n", l.name, f,
              gflops(l, f), impl_of(d, "convolution forward for " + shapes).c_str(), bd, gflops(l, bd),
              impl_of(d, "convolution backward data for " + shapes).c_str());
  std::printf("%-32s bwd-weights %8.2f ms %6.1f GFLOP/s [%s]\n", "", bw, gflops(l, bw),
              impl_of(d, "convolution backward weights for " + shapes).c_str());
}

void bench_tiles(const Layer& l, int m, int64_t tiles) {
  Rng rng(5);
  std::vector<float> x(static_cast<size_t>(l.N * l.H * l.W * l.C)), w(static_cast<size_t>(l.K * 9 * l.C));
  for (float& v : x) v = static_cast<float>(rng.uniform(-1, 1));
  for (float& v : w) v = static_cast<float>(rng.uniform(-1, 1));
  cpu::WinoGeo g{l.N, l.H, l.W, l.C, l.H, l.W, l.K, 1, 1, m, 0};
  g.tiles_per_block = tiles > 0 ? tiles : cpu::winograd_tiles_per_block(g);
  std::vector<float> u(cpu::winograd_weight_floats(g)), y(static_cast<size_t>(l.N * l.H * l.W * l.K));
  std::vector<float> scratch(cpu::winograd_scratch(g, omp_get_max_threads()));
  const double ms = bench::mean_ms(
      [&] {
        cpu::winograd_weights(g, w.data(), false, u.data());
        cpu::conv_winograd(g, x.data(), u.data(), nullptr, true, y.data(), scratch.data());
      },
      g_reps, g_cpu_time);
  std::printf("%-32s F(%dx%d,3x3) %3lld tiles/block (%s) fwd %8.2f ms %6.1f GFLOP/s\n", l.name, m, m,
              static_cast<long long>(g.tiles_per_block), cpu::winograd_isa(), ms, gflops(l, ms));
  // The weight gradient with the same tiles per block (its default: winograd_wgrad_tiles_per_block).
  cpu::WinoGeo gw = g;
  gw.tiles_per_block = tiles > 0 ? tiles : cpu::winograd_wgrad_tiles_per_block(g);
  std::vector<float> dw(w.size()), db(static_cast<size_t>(l.K));
  std::vector<float> wscratch(cpu::winograd_wgrad_scratch(gw, omp_get_max_threads()));
  const double mw = bench::mean_ms(
      [&] { cpu::conv_winograd_wgrad(gw, x.data(), y.data(), dw.data(), db.data(), wscratch.data()); }, g_reps,
      g_cpu_time);
  std::printf("%-32s F(%dx%d,3x3) %3lld tiles/block (%s) wgrad %8.2f ms %6.1f GFLOP/s\n", l.name, m, m,
              static_cast<long long>(gw.tiles_per_block), cpu::winograd_isa(), mw, gflops(l, mw));
}

}  // namespace

int main(int argc, char** argv) {
  std::string only, tiles;
  int only_m = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
    } else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      g_reps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--tiles") == 0 && i + 1 < argc) {
      tiles = argv[++i];
    } else if (std::strcmp(argv[i], "--m") == 0 && i + 1 < argc) {
      only_m = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--cpu-time] [--reps N] [--only SUBSTRING] [--tiles T,T,... [--m 4|2]]\n", argv[0]);
      return 2;
    }
  }
  const char* mode = std::getenv("MPX_CONV_WINOGRAD");
  std::printf("MPX_CONV_WINOGRAD=%s, %d threads, %s time, %d calls each\n", mode ? mode : "(unset)",
              omp_get_max_threads(), g_cpu_time ? "process CPU" : "wall", g_reps);
  for (const Layer& l : kLayers) {
    if (!only.empty() && std::string(l.name).find(only) == std::string::npos) continue;
    if (tiles.empty()) {
      bench_layer(l);
      continue;
    }
    std::stringstream ss(tiles);
    std::string t;
    while (std::getline(ss, t, ','))
      for (int m : {4, 2})
        if (only_m == 0 || m == only_m) bench_tiles(l, m, std::atoll(t.c_str()));
  }
  return 0;
}
