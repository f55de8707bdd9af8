// SPDX-License-Identifier: MIT
// Which 16-bit math path the CPU backend takes (native16.h; docs/precision.md).
#include "backend/cpu/native16.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>

#include <utility>

#include "backend/cpu/switches.h"
#include "core/error.h"

namespace mpx::cpu {

namespace {

unsigned effective_isa() { return static_cast<unsigned>(dnnl::get_effective_cpu_isa()); }

/// Whether the effective ISA includes every instruction set of `isa` (oneDNN's ISA values
/// are bit sets, each containing the bits of the sets below it).
bool isa_has(unsigned isa) { return (effective_isa() & isa) == isa; }

}  // namespace

bool dnnl_has_amx_bf16() { return isa_has(dnnl_cpu_isa_avx512_core_amx); }

KernelIsa kernel_isa() {
  static const KernelIsa v = [] {
    if (__builtin_cpu_supports("avx512f") && isa_has(dnnl_cpu_isa_avx512_core)) return KernelIsa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && isa_has(dnnl_cpu_isa_avx2))
      return KernelIsa::Avx2;
    return KernelIsa::Baseline;
  }();
  return v;
}

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return "avx512";
    case KernelIsa::Avx2: return "avx2";
    case KernelIsa::Baseline: break;
  }
  return "baseline";
}

namespace {

bool has_bf16() { return isa_has(dnnl_cpu_isa_avx512_core_bf16); }

}  // namespace

bool cpu_bf16_dot() {
  static const bool v =
      kernel_isa() == KernelIsa::Avx512 && __builtin_cpu_supports("avx512bf16") && has_bf16();
  return v;
}

bool own_bf16_math() { return cpu_bf16_dot() && math16_mode() != Math16Mode::Widen; }

bool own_amx_bf16() {
  static const bool v = [] {
#ifdef MPX_AMX_BUILD
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!own_bf16_math() || !dnnl_has_amx_bf16() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
    // Linux hands out the tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA); oneDNN asks the same for its own AMX kernels.
    constexpr long kReqXcompPerm = 0x1023, kXfeatureTileData = 18;
    return tile && bf16 && syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTileData) == 0;
#else
    return false;
#endif
  }();
  return v;
}

namespace {

bool has_amx_f16() {
#if DNNL_VERSION_MAJOR >= 3
  return isa_has(dnnl_cpu_isa_avx512_core_amx_fp16);
#else
  return false;
#endif
}

bool has_f16() {
#if DNNL_VERSION_MAJOR >= 3
  return isa_has(dnnl_cpu_isa_avx512_core_fp16);
#else
  return false;  // oneDNN 2.x has no f16 training kernels for the CPU
#endif
}

// MPX_CPU_16BIT (switches.h): unset or "auto" takes the native kernels where they beat
// widening; "native" wherever oneDNN has them for the CPU; "widen" never.
using Mode = Math16Mode;
Mode mode() { return math16_mode(); }

// The instruction sets oneDNN's native kernels need, and those with which they beat the
// widened path (measured: docs/precision.md, "16-bit arithmetic on the CPU").
Path16 decide(DType t) {
  const bool bf = t == DType::BF16;
  const char* name = bf ? "bf16" : "f16";
  const bool kernels = bf ? has_bf16() : has_f16();
  const bool fast = bf ? dnnl_has_amx_bf16() : has_amx_f16();
  if (mode() == Mode::Widen) return {false, "widened to float32 (MPX_CPU_16BIT=widen)"};
  if (!kernels)
    return {false, fmt::format("widened to float32 (no native {} on this CPU: oneDNN's ISA is {}, {} needs {})", name,
                               dnnl_isa_name(), name, bf ? "avx512_core_bf16" : "avx512_core_fp16")};
  // bfloat16 with AVX512-BF16 and no AMX: oneDNN's kernels beat the widened path for some
  // passes and shapes and lose to it (Winograd, the few-channel weight gradient) for others;
  // the families' choosers say which (docs/precision.md, "16-bit arithmetic on the CPU").
  if (!fast && bf && mode() == Mode::Auto)
    return {true,
            std::string("native bf16 per shape (avx512_core_bf16): oneDNN's kernels where they beat widening "
                        "(convolutions forward and backward-data outside Winograd's full tiles with many channels, "
                        "1x1 weight gradients and 3x3 ones with few channels, dense forward), widened elsewhere") +
                (own_bf16_math() ? "; mpx's bfloat16 dot products in its few-channel forward for one input channel, "
                                   "its few-channel weight gradient and its few-output dense loops"
                                 : ""),
            true};
  if (!fast && mode() == Mode::Auto)
    return {false, fmt::format("widened to float32 (oneDNN's native {} kernels without {} are slower than widening; "
                               "MPX_CPU_16BIT=native forces them)",
                               name, bf ? "AMX-BF16" : "AMX-FP16")};
  const char* level = bf ? (fast ? "avx512_core_amx" : "avx512_core_bf16")
                         : (fast ? "avx512_core_amx_fp16" : "avx512_core_fp16");
  Path16 p{true, fmt::format("native {} ({})", name, level)};
  if (bf && fast && mode() == Mode::Auto) {
    p.amx_own = true;
    p.text += "; mpx's few-channel forward and weight gradient for one input channel, its forward for a first "
              "layer with an activation other than relu or a kept pre-activation, Winograd weight gradient under "
              "7x7 outputs";
    if (own_amx_bf16())
      p.text += ", mpx's AMX weight gradient for 3x3 stride-1 layers (channels and filters multiples of 16)";
  }
  return p;
}

}  // namespace

const Path16& path16(DType t) {
  static const Path16 none{false, "float32"};
  static const Path16 bf = decide(DType::BF16);
  static const Path16 f16 = decide(DType::F16);
  if (t == DType::BF16) return bf;
  if (t == DType::F16) return f16;
  return none;
}

std::string dnnl_isa_name() {
  const unsigned isa = effective_isa();
  static const std::pair<unsigned, const char*> names[] = {
      {dnnl_cpu_isa_sse41, "sse41"},
      {dnnl_cpu_isa_avx, "avx"},
      {dnnl_cpu_isa_avx2, "avx2"},
      {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
      {dnnl_cpu_isa_avx512_core, "avx512_core"},
      {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
      {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
      {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
#if DNNL_VERSION_MAJOR >= 3
      {dnnl_cpu_isa_avx2_vnni_2, "avx2_vnni_2"},
      {dnnl_cpu_isa_avx512_core_fp16, "avx512_core_fp16"},
      {dnnl_cpu_isa_avx512_core_amx_fp16, "avx512_core_amx_fp16"},
#endif
  };
  for (const auto& [v, n] : names)
    if (v == isa) return n;
  return fmt::format("isa 0x{:x}", isa);
}



dnnl::memory::data_type dnnl_dtype(DType t) {
  switch (t) {
    case DType::F16:
      return dnnl::memory::data_type::f16;
    case DType::BF16:
      return dnnl::memory::data_type::bf16;
    default:
      return dnnl::memory::data_type::f32;
  }
}

bool is_reference_impl(const std::string& impl) { return impl.rfind("ref", 0) == 0 || impl.find(":ref") != std::string::npos; }

bool wants_native(Context& ctx, DType t, const PlanKey& key, bool wanted, bool own16) {
  if (t == DType::F32) return false;
  if (!wanted) ctx.note_math16(t, key, own16);
  return wanted;
}

bool run_native_weight_gradient(Context& ctx, NativePlan& plan, DType t, const PlanKey& key, const Tensor& x,
                                const Tensor& dy, const Tensor& dw, const Tensor& db) {
  if (!native_usable(ctx, t, key, plan)) return false;
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  run_weight_gradient(ctx, plan, x.data, dy.data, dwf, dbf);
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
  return true;
}

}  // namespace mpx::cpu
