// SPDX-License-Identifier: MIT
// The dense layers' kernel chooser (dense_choose.h; docs/cpu-performance.md, "Which kernel
// runs"), in the order of preference: oneDNN's native 16-bit kernel, mpx's loops that convert
// 16-bit operands in registers, oneDNN's float32 kernel on widened copies.
#include "backend/cpu/dense/dense_choose.h"

#include <fmt/format.h>

#include "backend/cpu/dense/dense_few.h"
#include "backend/cpu/native16.h"
#include "backend/cpu/switches.h"

namespace mpx::cpu {

namespace {

/// Whether the few-output loops multiply on bfloat16 dot products (dense_few.h): forward, x
/// and w (q.big, q.in) bfloat16; backward-data, dy and dx, with w the layer's dtype, dy's.
bool dense_dots(const DenseQuery& q) {
  if (q.pass == DensePass::Forward) return dense_few_dots_forward(q.big, q.in, q.Ci);
  if (q.pass == DensePass::BackwardWeights) return dense_few_dots_backward_weights(q.big, q.in);
  return q.pass == DensePass::BackwardData && dense_few_dots_backward_data(q.in, q.in, q.big);
}

/// Where the dtype's path is native for some shapes only (native16.h, Path16::per_shape;
/// bfloat16 on AVX512-BF16 without AMX): whether oneDNN's native kernel beats the widened
/// path for this pass and shape. Measured (docs/precision.md, "16-bit arithmetic on the
/// CPU"): oneDNN's bf16 forward beats its float32 one on widened copies (128 -> 256) and mpx's
/// few-output loops on a long input (21632 -> 10), not on a short one (256 -> 10, 3x slower);
/// its backward-data ties or loses, and its weight gradient took 10-50x as long.
bool native16_wins(const DenseQuery& q) {
  return q.pass == DensePass::Forward && (q.Co > kDenseFewMaxOut || q.Ci >= 8192);
}

/// A float32 layer with few outputs and a long input (the seed MNIST net's 21632 -> 10):
/// mpx's loops read x (forward) and write dx (backward-data) once, where oneDNN's float32 inner
/// product took about twice as long; alone, oneDNN's weight gradient stays the faster one there
/// (docs/cpu-performance.md, "Dense layers with few outputs"), but with AVX-512 it joins the
/// backward-data pass's walk (fused_backward_wins).
constexpr int64_t kFewF32MinIn = 8192;
bool few_f32_wins(const DenseQuery& q) {
  return q.big == DType::F32 && q.Ci >= kFewF32MinIn && q.pass != DensePass::BackwardWeights;
}

/// Both backward passes in one walk over x (dense_few_backward), where the backward-data pass
/// runs mpx's loops, over at least kFewF32MinIn columns: a float32 x with AVX-512 (the register
/// walk), any x with AVX2 (the chunked walk). Measured (docs/cpu-performance.md, "Both backward
/// passes in one walk"): the seed MNIST net's float32 step 1.3x faster with AVX-512 and 1.1x
/// under the AVX2 cap; with a 16-bit x the register walk lost on a Zen 4 EPYC, and the chunked
/// walk tied there and won 1.07-1.09x on an AMX Xeon capped at AVX2. The baseline build is not
/// measured, so it keeps the two passes.
bool fused_backward_wins(const DenseQuery& q) {
  const std::string isa = dense_few_isa();
  if (q.Ci < kFewF32MinIn) return false;
  return isa == "avx2" || (isa == "avx512" && q.big == DType::F32);
}

DenseChoice pick(DenseKernel k, std::string name, std::string why) {
  DenseChoice c;
  c.kernel = k, c.name = std::move(name), c.why = std::move(why);
  return c;
}

}  // namespace

DenseChoice choose_dense(const DenseQuery& q) {
  std::string why16;
  if (is_16bit(q.in) && !reference_loops()) {
    const Path16& path = path16(q.in);
    if (path.native && q.native_refused)
      why16 = "oneDNN has only its reference kernel (or none) for the native form: widened";
    else if (path.native && (!path.per_shape || native16_wins(q)))
      return pick(DenseKernel::Native16, fmt::format("oneDNN native {}", q.in == DType::BF16 ? "bf16" : "f16"),
                  path.text);
    else
      why16 = path.text;
  }
  // The switch first: a bad value is exit 2 on every net with a dense layer.
  const char* big = q.pass == DensePass::BackwardData ? "dx" : "x";
  if (dense_few_enabled() && q.Co <= kDenseFewMaxOut && !reference_loops() && (is_16bit(q.big) || few_f32_wins(q)))
    return pick(DenseKernel::FewOutputs,
                fmt::format("mpx:few-outputs {}, {} {} in registers{}{}", dense_few_isa(), dtype_name(q.big), big,
                            q.pass == DensePass::BackwardData && q.big == DType::BF16 && own_bf16_math()
                                ? " (vcvtneps2bf16)"
                                : "",
                            dense_dots(q) ? ", bfloat16 dot products (vdpbf16ps)" : ""),
                is_16bit(q.big)
                    ? fmt::format("at most {} outputs and a 16-bit {}: mpx's loops convert it in registers",
                                  kDenseFewMaxOut, big)
                    : fmt::format("at most {} outputs and a float32 {} of at least {} columns: mpx's loops pass "
                                  "over it once",
                                  kDenseFewMaxOut, big, kFewF32MinIn));
  if (reference_loops()) return pick(DenseKernel::Reference, "mpx:reference loops", "MPX_CPU_REFERENCE=1");
  return pick(DenseKernel::OneDnn, "oneDNN float32",
              why16.empty() ? "oneDNN's float32 inner product"
                            : why16 + "; oneDNN's float32 inner product, 16-bit operands widened into float32 copies");
}

DenseChoice choose_dense_backward(const DenseQuery& q) {
  DenseQuery d = q;
  d.pass = DensePass::BackwardData;
  if (dense_few_fused() && q.Co <= kDenseFewFuseMaxOut && fused_backward_wins(q) &&
      choose_dense(d).kernel == DenseKernel::FewOutputs)
    return pick(DenseKernel::FewOutputs,
                fmt::format("mpx:few-outputs {}, both passes in one walk, {} x in registers", dense_few_isa(),
                            dtype_name(q.big)),
                fmt::format("at most {} outputs and an x of at least {} columns, float32 with AVX-512 or any "
                            "dtype with AVX2: mpx's loops read x once for the weight gradient and the "
                            "backward-data pass",
                            kDenseFewFuseMaxOut, kFewF32MinIn));
  return pick(DenseKernel::OneDnn, "", "each pass its own kernel");
}

DenseChoice choose_dense_conv_backward(const DenseQuery& q) {
  // Where the backward-data pass runs mpx's loops over a float32 x of at least kFewF32MinIn
  // columns, with the AVX-512 or AVX2 build: the walk then never stores dx, which is what it
  // saves (docs/cpu-performance.md, "The first convolution's weight gradient in the dense walk",
  // with the seed MNIST net's figures). A bfloat16 x tied there with the separate ops (whose
  // weight gradient has bfloat16 dot products), so 16-bit keeps them; the baseline build is not
  // measured.
  DenseQuery d = q;
  d.pass = DensePass::BackwardData;
  const std::string isa = dense_few_isa();
  if (dense_few_fused() && q.big == DType::F32 && q.Co <= kDenseFewFuseMaxOut && q.Ci >= kFewF32MinIn &&
      (isa == "avx512" || isa == "avx2") && choose_dense(d).kernel == DenseKernel::FewOutputs)
    return pick(DenseKernel::FewOutputs,
                fmt::format("mpx:few-outputs {}, both passes and the first convolution's weight gradient in one "
                            "walk, {} x in registers, dx not stored",
                            isa, dtype_name(q.big)),
                fmt::format("at most {} outputs, a float32 x of at least {} columns, the relu output of a "
                            "first convolution whose input gradient is not needed: mpx's loops sum its weight "
                            "gradient from each block of dx in cache",
                            kDenseFewFuseMaxOut, kFewF32MinIn));
  return pick(DenseKernel::OneDnn, "", "each op its own kernel");
}

}  // namespace mpx::cpu
