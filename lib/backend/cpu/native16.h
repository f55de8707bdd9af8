// SPDX-License-Identifier: MIT
// The 16-bit math path of the CPU backend's convolutions and dense layers
// (docs/precision.md, "16-bit arithmetic on the CPU"): oneDNN's native bf16/f16
// kernels where the CPU has the instructions, else operands widened to float32.
// Decided once per process from MPX_CPU_16BIT and oneDNN's effective ISA (which
// honours ONEDNN_MAX_CPU_ISA), never by timing, so a run and its resume on the
// same machine take the same path.
#pragma once

#include <dnnl.hpp>

#include <memory>
#include <string>

#include <fmt/format.h>

#include "backend/cpu/dnnl_util.h"
#include "core/dtype.h"

namespace mpx::cpu {

struct Path16 {
  bool native = false;  // oneDNN's 16-bit kernels (when one exists for the op and shape)
  std::string text;     // "native bf16 (avx512_core_amx)" / "widened to float32 (...)"
  /// Only for the ops and shapes where the family's chooser says they beat the widened path
  /// (conv_choose.h, dense_choose.h); the others are widened.
  bool per_shape = false;
  /// With AMX-BF16 (MPX_CPU_16BIT unset or auto), the passes and shapes where mpx's kernels
  /// beat oneDNN's take them (conv_choose.cpp): a convolution with one input channel, whose
  /// forward oneDNN runs on its avx512_core_bf16 kernel and whose AMX weight gradient loses to
  /// mpx's bfloat16 dot products; the weight gradient of a 3x3 stride-1 layer with channels and
  /// filters in multiples of 16, where mpx's own AMX kernel (conv_wgrad_amx.h) beats oneDNN's;
  /// and, among the other 3x3 stride-1 layers, the weight gradient of those with outputs under
  /// 7x7, where mpx's Winograd beats oneDNN's AMX kernel.
  bool amx_own = false;
};

/// The path of 16-bit dtype t (F16 or BF16) on this CPU; F32 gets native = false.
const Path16& path16(DType t);

/// oneDNN's name of the effective ISA ("avx512_core_amx", "avx2", ...).
std::string dnnl_isa_name();

/// The builds of mpx's own vector kernels (Winograd, the activation loops).
enum class KernelIsa { Baseline, Avx2, Avx512 };

/// The widest build that both the CPU and oneDNN's ISA limit (ONEDNN_MAX_CPU_ISA) allow, so
/// that capping oneDNN at AVX2 runs the AVX2 machine's code too (AVX2 needs FMA as well).
/// Decided once per process.
KernelIsa kernel_isa();

/// "avx512", "avx2" or "baseline".
const char* kernel_isa_name(KernelIsa isa);

/// Whether oneDNN's AMX-BF16 kernels run here (what makes bf16 faster than float32).
bool dnnl_has_amx_bf16();

/// Whether mpx's own bfloat16 dot-product kernels (vdpbf16ps) may run: the CPU has
/// AVX512-BF16, oneDNN's ISA limit allows avx512_core_bf16 and kernel_isa() is Avx512.
/// Decided once per process.
bool cpu_bf16_dot();

/// Whether mpx's own bfloat16 kernels use the CPU's bfloat16 instructions: the dot products
/// (VDPBF16PS, the first layer's weight gradient) and the rounding (VCVTNEPS2BF16, the
/// few-channel forward and the few-output dense loops; docs/precision.md, "bfloat16 rounded by
/// the CPU's instruction"): cpu_bf16_dot() and MPX_CPU_16BIT not widen. The one rule of the
/// *_avx512bf16.cpp builds.
bool own_bf16_math();

/// Whether mpx's own AMX kernels (conv_wgrad_amx.h) may run: own_bf16_math(), the CPU has
/// AMX-TILE and AMX-BF16, oneDNN's ISA limit allows avx512_core_amx, mpx was built with AMX
/// instructions, and Linux gave the process the tile state. Decided once per process.
bool own_amx_bf16();

/// The oneDNN data type of t.
dnnl::memory::data_type dnnl_dtype(DType t);

/// Whether a oneDNN implementation name is one of its reference (plain C++) kernels,
/// which the native path never takes: that op and shape is widened instead.
bool is_reference_impl(const std::string& impl);

/// A plan of the native path; not usable where oneDNN has only a reference kernel for the
/// op and shape, or none (the op is widened instead).
struct NativePlan : DnnlPlan {
  bool usable = true;
};

/// Makes a plan P (a NativePlan, or one with the same `usable` flag) with build(plan), which
/// returns the primitive descriptor's implementation name, before filling the plan when
/// that is a reference kernel. Such a kernel, or none, leaves the plan unusable, and the
/// kernels list says so.
template <typename P, typename Build>
P* make_native(Context& ctx, const std::string& what, Build&& build) {
  auto plan = std::make_unique<P>();
  plan->what = what;
  std::string impl;
  try {
    impl = build(*plan);
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw Error("oneDNN could not create " + what + ": " + e.what());
    impl = "none";
  }
  if (is_reference_impl(impl) || impl == "none") {
    plan->usable = false;
    ctx.note_kernel(what, fmt::format("widened (oneDNN: {} only)", impl));
  }
  return plan.release();
}

/// Whether op `key` of dtype t takes the native path: `wanted`, the family's chooser's answer
/// (conv_choose.h, dense_choose.h). Otherwise records a 16-bit op as widened, or, with
/// `own16`, as native 16-bit math: mpx's own kernel runs it on the CPU's 16-bit products
/// (bfloat16 dot products, AMX tiles), 16-bit operands and float32 sums as on oneDNN's native
/// kernels.
bool wants_native(Context& ctx, DType t, const PlanKey& key, bool wanted, bool own16 = false);

/// Records whether the native plan of op `key` is usable (math16 counts) and returns it.
template <typename P>
bool native_usable(Context& ctx, DType t, const PlanKey& key, const P& plan) {
  ctx.note_math16(t, key, plan.usable);
  return plan.usable;
}

/// Fills a native weight-gradient plan (Prim: convolution_backward_weights or
/// inner_product_backward_weights) from its primitive descriptor: src, diff dst, diff weights
/// and, when bias is not null, diff bias. Returns the implementation name, for make_native;
/// a reference kernel leaves the plan unfilled.
template <typename Prim, typename Pd>
std::string fill_weight_gradient(Context& ctx, NativePlan& pl, const Pd& pd, const dnnl::memory::desc& src,
                                 const dnnl::memory::desc& dst, const dnnl::memory::desc& wei,
                                 const dnnl::memory::desc* bias) {
  if (is_reference_impl(pd.impl_info_str())) return std::string(pd.impl_info_str());
  pl.set_weight_gradient<Prim>(ctx, pd, src, dst, wei, bias);
  return pl.impl;
}

/// Runs the weight-gradient plan of op `key` when it is usable (native_usable) with float32
/// diff weights and bias, then rounds them once into dw and db (db may be empty); returns
/// false, having done nothing, when it is not.
bool run_native_weight_gradient(Context& ctx, NativePlan& plan, DType t, const PlanKey& key, const Tensor& x,
                                const Tensor& dy, const Tensor& dw, const Tensor& db);

}  // namespace mpx::cpu
