// SPDX-License-Identifier: MIT
// Batch normalization on the CPU backend at training-sized shapes: the fastest of
// several calls of training forward, inference forward and backward (float32 and
// bfloat16), then the error of float32 results against the float64 reference of
// tests/support/reference.h (sums over up to 262144 rows, with and without a large
// common offset); `fused`: the fast CIFAR recipe's batch norms followed by GELU, as two ops
// and as one (docs/cpu-performance.md, "Batch norm and the activation after it").
//   batch_norm_bench [timing|precision|fused]      (default: timing and precision)
// Run it again under MPX_CPU_REFERENCE=1 to compare oneDNN with mpx's loops.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "bench/bench_util.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;

namespace {

/// One batch-norm layer's tensors.
struct BnLayer {
  Shape s;
  int64_t C = 0, M = 0;
  std::vector<float> xv, gv, bv, dyv;
  Tensor x, gamma, beta, rm, rv, sm, si, y, dy, dx, dg, db;
};

BnLayer make_layer(bench::CpuDev& d, Rng& rng, DType t, Shape s, double x_offset = 0) {
  BnLayer l;
  l.s = s;
  l.C = s[s.rank - 1];
  l.M = s.numel() / l.C;
  l.x = d.rand(rng, t, s, &l.xv, -1.0, 1.0, x_offset);
  l.gamma = d.rand(rng, DType::F32, Shape{l.C}, &l.gv, 0.5, 1.5);
  l.beta = d.rand(rng, DType::F32, Shape{l.C}, &l.bv);
  l.rm = d.rand(rng, DType::F32, Shape{l.C});
  l.rv = d.rand(rng, DType::F32, Shape{l.C}, nullptr, 0.5, 2.0);
  l.sm = d.make(DType::F32, Shape{l.C});
  l.si = d.make(DType::F32, Shape{l.C});
  l.y = d.make(t, s);
  l.dy = d.rand(rng, t, s, &l.dyv);
  l.dx = d.make(t, s);
  l.dg = d.make(DType::F32, Shape{l.C});
  l.db = d.make(DType::F32, Shape{l.C});
  return l;
}

Vec widen(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

/// Largest |got - want| / max|want| over the tensor.
double max_err(const std::vector<float>& got, const Vec& want) {
  double e = 0, m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    e = std::max(e, std::fabs(static_cast<double>(got[i]) - want[i]));
    m = std::max(m, std::fabs(want[i]));
  }
  return m > 0 ? e / m : e;
}

void timing() {
  bench::CpuDev d;
  Rng rng(9);
  const Shape shapes[] = {Shape{256, 32, 32, 16}, Shape{256, 16, 16, 32}, Shape{256, 8, 8, 64},
                          Shape{256, 32, 32, 64}, Shape{256, 32, 32, 128}, Shape{256, 256},
                          Shape{32, 32, 32, 4}, Shape{32, 16, 16, 8}, Shape{256, 32, 32, 10}};
  for (DType t : {DType::F32, DType::BF16}) {
    for (const Shape& s : shapes) {
      BnLayer l = make_layer(d, rng, t, s);
      Tensor yi = d.make(t, s);
      const int reps = s.numel() > (1 << 22) ? 5 : 20;
      const double f = bench::min_ms(
          [&] {
            d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, 0.99f, 1e-3f, l.rm, l.rv, l.sm, l.si, l.y);
          },
          reps);
      const double i = bench::min_ms(
          [&] { d.be->batch_norm_forward_inference(l.x, l.gamma, l.beta, l.rm, l.rv, 1e-3f, yi); }, reps);
      const double b = bench::min_ms(
          [&] { d.be->batch_norm_backward(l.x, l.dy, l.gamma, l.sm, l.si, l.dx, l.dg, l.db); }, reps);
      std::printf("bn %-18s %-8s min: train-fwd %8.3f ms  infer %8.3f ms  bwd %8.3f ms\n",
                  bench::shape_str(s).c_str(), dtype_name(t), f, i, b);
      d.bufs.clear();
    }
  }
}

void precision() {
  const Shape shapes[] = {Shape{256, 32, 32, 16}, Shape{256, 16, 16, 32}, Shape{256, 8, 8, 64},
                          Shape{256, 32, 32, 10}, Shape{256, 256},        Shape{65536, 10}};
  for (double offset : {0.0, 3.0}) {
    for (const Shape& s : shapes) {
      bench::CpuDev d;
      Rng rng(10);
      BnLayer l = make_layer(d, rng, DType::F32, s, offset);
      d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, 0.99f, 1e-3f, l.rm, l.rv, l.sm, l.si, l.y);
      d.be->batch_norm_backward(l.x, l.dy, l.gamma, l.sm, l.si, l.dx, l.dg, l.db);
      const ref::BnForward r =
          ref::batch_norm_forward_training(l.M, l.C, widen(l.xv), widen(l.gv), widen(l.bv), 1e-3);
      const ref::BnBackward rb =
          ref::batch_norm_backward(l.M, l.C, widen(l.xv), widen(l.dyv), widen(l.gv), r.mean, r.invstd);
      std::printf("bn %-16s offset %.0f  mean %.1e invstd %.1e y %.1e | dgamma %.1e dbeta %.1e dx %.1e\n",
                  bench::shape_str(s).c_str(), offset, max_err(d.get(l.sm), r.mean), max_err(d.get(l.si), r.invstd),
                  max_err(d.get(l.y), r.y), max_err(d.get(l.dg), rb.dgamma), max_err(d.get(l.db), rb.dbeta),
                  max_err(d.get(l.dx), rb.dx));
    }
  }
}

/// The recipe's three batch-norm shapes at batch 1024, float32 and bfloat16: batch norm then
/// GELU as two ops (the layers unfused) against the fused op, forward training and backward.
void fused() {
  bench::CpuDev d;
  Rng rng(11);
  std::printf("%s; min of 5 calls, ms\n", d.be->info().description.c_str());
  const Activation gelu(ActKind::Gelu);
  for (DType t : {DType::F32, DType::BF16})
    for (const Shape& s : {Shape{1024, 15, 15, 64}, Shape{1024, 7, 7, 256}, Shape{1024, 3, 3, 256}}) {
      BnLayer l = make_layer(d, rng, t, s);
      Tensor z = d.make(t, s), g = d.make(t, s);
      const double f2 = bench::min_ms(
          [&] {
            d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, 0.6f, 1e-3f, l.rm, l.rv, l.sm, l.si, z);
            d.be->activation_forward(gelu, z, l.y);
          },
          5);
      const double f1 = bench::min_ms(
          [&] {
            d.be->batch_norm_forward_training(l.x, l.gamma, l.beta, 0.6f, 1e-3f, l.rm, l.rv, l.sm, l.si, l.y, gelu);
          },
          5);
      const double b2 = bench::min_ms(
          [&] {
            d.be->activation_backward(gelu, z, l.dy, g);
            d.be->batch_norm_backward(l.x, g, l.gamma, l.sm, l.si, l.dx, l.dg, l.db);
          },
          5);
      const double b1 = bench::min_ms(
          [&] { d.be->batch_norm_backward(l.x, l.dy, l.gamma, l.sm, l.si, l.dx, l.dg, l.db, l.beta, gelu); }, 5);
      std::printf("bn+gelu %-18s %-8s forward %8.3f -> %8.3f (%.2fx)  backward %8.3f -> %8.3f (%.2fx)\n",
                  bench::shape_str(s).c_str(), dtype_name(t), f2, f1, f2 / f1, b2, b1, b2 / b1);
      d.bufs.clear();
    }
  for (const KernelChoice& k : d.be->kernels())
    if (k.op.find("batch normalization") != std::string::npos) std::printf("  %s: %s\n", k.op.c_str(), k.impl.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "";
  const bool all = argc == 1;
  if (argc > 2 ||
      (!all && std::strcmp(what, "timing") != 0 && std::strcmp(what, "precision") != 0 && std::strcmp(what, "fused") != 0)) {
    std::fprintf(stderr, "usage: %s [timing|precision|fused]\n", argv[0]);
    return 2;
  }
  if (all || std::strcmp(what, "timing") == 0) timing();
  if (all || std::strcmp(what, "precision") == 0) precision();
  if (std::strcmp(what, "fused") == 0) fused();
  return 0;
}
