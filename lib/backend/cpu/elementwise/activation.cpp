// SPDX-License-Identifier: MIT
// Elementwise ops: activation forward/backward, the activation epilogue of the fused
// conv/dense ops, and the residual add. Every activation runs through the float32
// formulas of core/activation.h (the ones the CUDA kernels use), in loops compiled once
// per activation (with_activation_kind); the backward reads the output or the input as
// backward_reads() says. relu keeps NaN as NaN so check_numerics sees it.
//
// float32 add runs oneDNN's binary primitive (binary_add), one cached primitive per
// element count. What stays ours, and why (measured on oneDNN 2.6.3, AVX2):
//  - relu forward: oneDNN's relu is a jit max(x, 0) that turns NaN into 0; ours keeps NaN.
//  - relu backward: oneDNN's eltwise_relu_use_dst_for_bwd computes dy * (y > 0), which gives
//    -0 (not +0) where y <= 0 and dy < 0, and NaN (not 0) where y <= 0 and dy is NaN or inf;
//    the backend's rule (backend.h, the CUDA kernel, the bit-exact test in test_backend.cpp)
//    is y > 0 ? dy : +0.
//  - the other activations: one formula per activation on both backends (core/activation.h);
//    oneDNN's gelu_erf and swish are approximations of their own (see dnnl_util.h).
//  - 16-bit tensors: oneDNN 2.6 has no float16/bfloat16 eltwise or binary on CPUs without
//    avx512_core ("could not create a primitive descriptor"); our loops convert block-wise
//    in cache (and these op signatures have no Context, so no float32 scratch to stage in).
//  - MPX_CPU_REFERENCE=1: the plain loops for everything (as in conv.cpp).
// The ops get no Context from ops.h, so the oneDNN engine, stream and plans here are
// per thread (thread_local): nothing is shared between backends on different threads.
//
// The activation loops are built three times, for the baseline x86-64 ISA, AVX2 and
// AVX-512 (a target attribute per build), and the widest that both the CPU and oneDNN's ISA
// limit (ONEDNN_MAX_CPU_ISA) allow runs (kernel_isa(), as for Winograd); MPX_CPU_BASELINE=1
// forces the baseline build. This file is compiled with -ffp-contract=off, so no build fuses
// a multiply and an add that the formulas do not fuse themselves (fma_f, fused in every build:
// the AVX2 and AVX-512 targets include FMA, the baseline calls fmaf): each element goes
// through the same float32 operations in every build, and the builds give the same bits
// (test_backend_isa), so a result never depends on the CPU it ran on (docs/cpu-performance.md,
// "Activations").
#include <array>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>

#include "backend/cpu/dnnl_util.h"
#include "backend/cpu/native16.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/switches.h"

namespace mpx::cpu {

namespace {

enum EltOp : int64_t { kAdd = 302 };

/// One cached binary primitive over n float32 elements; its memory objects are re-pointed per call.
struct EltPlan {
  dnnl::primitive prim;
  dnnl::memory in0, in1, out;
  std::unordered_map<int, dnnl::memory> args;
};

struct Local {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<PlanKey, std::unique_ptr<EltPlan>, PlanKeyHash> plans;
};

Local& local() {
  thread_local Local l;
  return l;
}

EltPlan& add_plan(int64_t n) {
  Local& l = local();
  PlanKey key;
  key << kAdd << n;
  auto it = l.plans.find(key);
  if (it != l.plans.end()) return *it->second;
  auto plan = dnnl_try("binary add of " + std::to_string(n) + " float32 elements", [&] {
    auto p = std::make_unique<EltPlan>();
    const dnnl::memory::desc md({n}, dt::f32, tag::x);
    const auto pd = dnnlc::binary(l.engine, dnnl::algorithm::binary_add, md, md, md);
    p->prim = dnnl::binary(pd);
    p->in0 = unbound(md, l.engine);
    p->in1 = unbound(md, l.engine);
    p->out = unbound(md, l.engine);
    p->args = {{DNNL_ARG_SRC_0, p->in0}, {DNNL_ARG_SRC_1, p->in1}, {DNNL_ARG_DST, p->out}};
    return p;
  });
  return *l.plans.emplace(key, std::move(plan)).first->second;
}

void elt_run(EltPlan& p, const void* in0, const void* in1, void* out) {
  p.in0.set_data_handle(const_cast<void*>(in0));
  p.in1.set_data_handle(const_cast<void*>(in1));
  p.out.set_data_handle(out);
  Local& l = local();
  p.prim.execute(l.stream, p.args);
  l.stream.wait();
}

// relu's backward on bfloat16 bits, without widening: the bits the float32 loops give for
// bfloat16 y, dy and dx (saved > 0 ? dy : +0, dx rounded by f32_to_bf16). y > 0 is y's bits in
// [0x0001, 0x7F80] (positive, nonzero, not NaN: no flush of subnormals in mpx); dy passes
// through unchanged but for a NaN, which f32_to_bf16 quiets (bit 0x0040). Written as selects,
// so each build vectorizes it.
__attribute__((always_inline)) inline uint16_t relu_grad_bf16(uint16_t y, uint16_t d) {
  const bool pos = static_cast<uint16_t>(y - 1u) < 0x7F80u;
  const uint16_t pass = (d & 0x7FFFu) > 0x7F80u ? static_cast<uint16_t>(d | 0x0040u) : d;
  return pos ? pass : static_cast<uint16_t>(0);
}

// The row loops of one activation kind K, for one ISA: y = act(x) and dx = act'(saved, dy)
// over n float32 elements. core/activation.h's formulas are always_inline, and a baseline
// function may be inlined into a wider one, so each build vectorizes them at its width.
#define MPX_ACT_LOOPS(ISA, TARGET)                                                      \
  template <ActKind K>                                                                        \
  TARGET void ISA##_forward_rows(float alpha, const float* x, float* y, int64_t n) {          \
    const Activation a{K, alpha};                                                             \
    for (int64_t i = 0; i < n; ++i) y[i] = activation_value(a, x[i]);                         \
  }                                                                                           \
  template <ActKind K>                                                                        \
  TARGET void ISA##_backward_rows(float alpha, const float* s, const float* dy, float* dx,    \
                                  int64_t n) {                                                \
    const Activation a{K, alpha};                                                             \
    for (int64_t i = 0; i < n; ++i) dx[i] = activation_grad(a, s[i], dy[i]);                  \
  }                                                                                           \
  TARGET void ISA##_relu_backward_bf16(const uint16_t* y, const uint16_t* dy, uint16_t* dx,   \
                                       int64_t n) {                                           \
    for (int64_t i = 0; i < n; ++i) dx[i] = relu_grad_bf16(y[i], dy[i]);                      \
  }
MPX_ACT_LOOPS(base, )
MPX_ACT_LOOPS(avx2, __attribute__((target("avx2,fma"))))
MPX_ACT_LOOPS(avx512, __attribute__((target("avx512f,fma"))))
#undef MPX_ACT_LOOPS

/// The build the loops run: kernel_isa() (native16.h), the baseline under MPX_CPU_BASELINE=1
/// (read at each call: the tests switch it).
KernelIsa activation_isa() { return pool_baseline() ? KernelIsa::Baseline : kernel_isa(); }

/// Names the loops in the kernels list (what `mpx bench` prints). The names are made once
/// per (pass, kind, build), not at every call of the step.
void note_loops(Context& ctx, int pass, Activation act, KernelIsa isa) {
  static const auto names = [] {
    constexpr int kKinds = static_cast<int>(ActKind::Scale) + 1;
    std::array<std::array<std::string, kKinds>, 2> what;
    for (int p = 0; p < 2; ++p)
      for (int k = 0; k < kKinds; ++k) {
        const auto kind = static_cast<ActKind>(k);
        // Scale (a dense layer's output_scale) has no config name of its own.
        const char* name = kind == ActKind::Scale ? "scale" : activation_name(kind);
        what[p][k] = std::string("activation ") + (p ? "backward" : "forward") + " (" + name + ")";
      }
    return what;
  }();
  static const std::array<std::string, 3> impl = {std::string("mpx loops ") + kernel_isa_name(KernelIsa::Baseline),
                                                  std::string("mpx loops ") + kernel_isa_name(KernelIsa::Avx2),
                                                  std::string("mpx loops ") + kernel_isa_name(KernelIsa::Avx512)};
  ctx.note_kernel(names[pass][static_cast<int>(act.kind)], impl[static_cast<int>(isa)]);
}

template <ActKind K>
void forward_rows(KernelIsa isa, float alpha, const float* x, float* y, int64_t n) {
  switch (isa) {
    case KernelIsa::Avx512: return avx512_forward_rows<K>(alpha, x, y, n);
    case KernelIsa::Avx2: return avx2_forward_rows<K>(alpha, x, y, n);
    case KernelIsa::Baseline: break;
  }
  base_forward_rows<K>(alpha, x, y, n);
}

template <ActKind K>
void backward_rows(KernelIsa isa, float alpha, const float* s, const float* dy, float* dx, int64_t n) {
  switch (isa) {
    case KernelIsa::Avx512: return avx512_backward_rows<K>(alpha, s, dy, dx, n);
    case KernelIsa::Avx2: return avx2_backward_rows<K>(alpha, s, dy, dx, n);
    case KernelIsa::Baseline: break;
  }
  base_backward_rows<K>(alpha, s, dy, dx, n);
}

}  // namespace

const char* activation_build() { return kernel_isa_name(activation_isa()); }

void activation_forward(Context& ctx, Activation act, const Tensor& x, const Tensor& y) {
  if (act.is_none()) {
    if (x.data != y.data) copy(ctx, y, x);
    return;
  }
  const float alpha = act.alpha;
  const KernelIsa isa = activation_isa();
  note_loops(ctx, 0, act, isa);
  with_activation_kind(act.kind, [&](auto kind) {
    for_blocks(x.numel(), [&](int64_t off, int64_t n) {
      float bx[kBlock], by[kBlock];
      const float* xi = load_block(x, off, n, bx);
      float* yo = out_block(y, off, by);
      forward_rows<decltype(kind)::value>(isa, alpha, xi, yo, n);
      store_block(yo, y, off, n);
    });
  });
}

void activation_backward(Context& ctx, Activation act, const Tensor& saved, const Tensor& dy, const Tensor& dx) {
  if (act.is_none()) {
    if (dx.data != dy.data) copy(ctx, dx, dy);
    return;
  }
  const float alpha = act.alpha;
  const KernelIsa isa = activation_isa();
  note_loops(ctx, 1, act, isa);
  if (act.kind == ActKind::Relu && saved.dtype == DType::BF16 && dy.dtype == DType::BF16 &&
      dx.dtype == DType::BF16) {
    // On the bits: the same results as the widening loops below, one pass over 2-byte values.
    auto* run = isa == KernelIsa::Avx512 ? avx512_relu_backward_bf16
                : isa == KernelIsa::Avx2 ? avx2_relu_backward_bf16
                                         : base_relu_backward_bf16;
    const auto* y16 = static_cast<const uint16_t*>(saved.data);
    const auto* dy16 = static_cast<const uint16_t*>(dy.data);
    auto* dx16 = static_cast<uint16_t*>(dx.data);
    for_blocks(saved.numel(), [&](int64_t off, int64_t n) { run(y16 + off, dy16 + off, dx16 + off, n); });
    return;
  }
  with_activation_kind(act.kind, [&](auto kind) {
    for_blocks(saved.numel(), [&](int64_t off, int64_t n) {
      float bs[kBlock], bdy[kBlock], bdx[kBlock];
      const float* si = load_block(saved, off, n, bs);
      const float* dyi = load_block(dy, off, n, bdy);
      float* dxo = out_block(dx, off, bdx);
      backward_rows<decltype(kind)::value>(isa, alpha, si, dyi, dxo, n);
      store_block(dxo, dx, off, n);
    });
  });
}

void activation_epilogue(Activation act, float* z, const Tensor& y, const Tensor& pre) {
  if (act.is_none() && pre.empty()) {
    f32_commit(z, y);
    return;
  }
  const float alpha = act.alpha;
  const KernelIsa isa = activation_isa();
  with_activation_kind(act.kind, [&](auto kind) {
    for_blocks(y.numel(), [&](int64_t off, int64_t n) {
      float* zi = z + off;
      if (!pre.empty()) convert(zi, DType::F32, elem_ptr(pre, off), pre.dtype, static_cast<size_t>(n));
      if constexpr (decltype(kind)::value != ActKind::None) forward_rows<decltype(kind)::value>(isa, alpha, zi, zi, n);
      store_block(zi, y, off, n);
    });
  });
}

void activation_epilogue_span(Activation act, float* z, int64_t n, void* y, void* pre, DType t) {
  const float alpha = act.alpha;
  const KernelIsa isa = activation_isa();
  const size_t es = dtype_size(t);
  with_activation_kind(act.kind, [&](auto kind) {
    for (int64_t off = 0; off < n; off += kBlock) {
      const int64_t m = std::min(kBlock, n - off);
      float* zi = z + off;
      if (pre) convert(zi, DType::F32, static_cast<char*>(pre) + off * es, t, static_cast<size_t>(m));
      if constexpr (decltype(kind)::value != ActKind::None) forward_rows<decltype(kind)::value>(isa, alpha, zi, zi, m);
      convert(zi, DType::F32, static_cast<char*>(y) + off * es, t, static_cast<size_t>(m));
    }
  });
}

void add(Context& /*ctx*/, const Tensor& a, const Tensor& b, const Tensor& y) {
  const int64_t total = a.numel();
  if (a.dtype == DType::F32 && !reference_loops() && total > 0) {
    // oneDNN allows dst == src0 in place, not dst == src1: when y is b, add b + a
    // (float addition is commutative, so the result is the same).
    const bool swap = y.data == b.data && y.data != a.data;
    elt_run(add_plan(total), swap ? b.data : a.data, swap ? a.data : b.data, y.data);
    return;
  }
  for_blocks(total, [&](int64_t off, int64_t n) {
    float ba[kBlock], bb[kBlock], bo[kBlock];
    const float* ai = load_block(a, off, n, ba);
    const float* bi = load_block(b, off, n, bb);
    float* yo = out_block(y, off, bo);
    for (int64_t i = 0; i < n; ++i) yo[i] = ai[i] + bi[i];
    store_block(yo, y, off, n);
  });
}

}  // namespace mpx::cpu
