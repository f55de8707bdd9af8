// SPDX-License-Identifier: MIT
// The convolutions' kernel chooser (conv_choose.h; docs/cpu-performance.md, "Which kernel
// runs"). The order is the order of preference: oneDNN's native 16-bit kernel, then mpx's
// kernels that convert 16-bit operands themselves, then the float32 kernels on widened
// copies.
#include "backend/cpu/conv/conv_choose.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/conv/conv_wgrad.h"
#include "backend/cpu/conv/conv_wgrad_amx.h"
#include "backend/cpu/conv/conv_wgrad_small.h"
#include "backend/cpu/conv/conv_winograd.h"
#include "backend/cpu/native16.h"
#include "backend/cpu/switches.h"

namespace mpx::cpu {

using conv_detail::Geo;

namespace {

/// 3x3, stride 1, padding 0..2 on each side: what the Winograd kernel computes (forward and
/// backward-data, whose padding is 2 minus the forward one).
bool winograd_applies(const Conv2dParams& p, const Geo& g) {
  auto pad_ok = [](int v) { return v >= 0 && v <= 2; };
  return g.R == 3 && g.S == 3 && p.stride_h == 1 && p.stride_w == 1 && pad_ok(p.pad_top) && pad_ok(p.pad_left) &&
         pad_ok(p.pad_bottom) && pad_ok(p.pad_right) && g.P > 0 && g.Q > 0;
}

/// The default rule, from measurements against oneDNN's direct kernels
/// (docs/cpu-performance.md, "Winograd convolution"): 16+ channels in and out (with 8 it
/// lost or tied), and outputs of at least 4x4 pixels with AVX2 (won at 4x4 and 6x6 in every
/// pass); with AVX-512 at least 7x7 for forward and backward-data (they tied or lost at 4x4
/// and 6x6, won at 7x7 and 8x8); 3x3 for the weight gradient with either (won at 3x3, 4x4
/// and up). Not measured on CPUs without AVX2: off there.
bool winograd_rule(const Geo& g, bool wgrad) {
  const std::string isa = winograd_isa();
  if (isa != "avx512" && isa != "avx2") return false;
  const int64_t min_side = wgrad ? 3 : isa == "avx512" ? 7 : 4;
  return g.C >= 16 && g.K >= 16 && g.P >= min_side && g.Q >= min_side;
}

WgradGeo wgrad_geo(const Geo& g) { return {g.N, g.H, g.W, g.C, g.K, g.R, g.S, g.P, g.Q, g.pt, g.pl}; }

std::string winograd_name(int m, DType io) {
  return fmt::format("winograd:F({}x{},3x3) {} + sgemm{}", m, m, winograd_isa(),
                     is_16bit(io) ? fmt::format(", {} in the transforms", dtype_name(io)) : std::string());
}

ConvChoice pick(ConvKernel k, std::string name, std::string why, int tile = 0) {
  ConvChoice c;
  c.kernel = k, c.name = std::move(name), c.why = std::move(why), c.tile = tile;
  return c;
}

bool native16_wins(const ConvQuery& q);

/// Whether the weight gradient takes mpx's AMX kernel (conv_wgrad_amx.h): bfloat16 x and dy on
/// the AMX path of MPX_CPU_16BIT unset or auto (native16.h, Path16::amx_own), the CPU's and the
/// build's AMX (own_amx_bf16), MPX_CONV_WGRAD unset or auto, no Winograd asked for by
/// MPX_CONV_WINOGRAD or the config (on or f2), the kernel's shapes (conv_wgrad_amx_applies),
/// and the measured rule: 3x3 filters with at most 4 filters per input channel. There it beat
/// oneDNN's AMX kernel or tied (1.0-2.7x), and mpx's Winograd (bfloat16 in its transforms) at
/// 3x3 outputs (3.4x); oneDNN's won on a 1x1 layer; more filters per channel make dy's
/// transpose the larger cost (docs/cpu-performance.md, "The AMX weight gradient").
bool amx_wgrad(const ConvQuery& q) {
  if (q.pass != ConvPass::BackwardFilter || q.in != DType::BF16 || q.out != DType::BF16 || reference_loops())
    return false;
  const WgradMode mode = wgrad_mode();
  if (mode != WgradMode::Default && mode != WgradMode::Auto) return false;
  if (!path16(DType::BF16).amx_own || !own_amx_bf16() || !conv_wgrad_amx_applies(q.g)) return false;
  if (q.g.R != 3 || q.g.S != 3 || q.g.K > 4 * q.g.C) return false;
  const auto forced = winograd_forced();
  const WinogradMode wino = forced ? *forced : q.configured;
  return wino != WinogradMode::F4 && wino != WinogradMode::F2;
}

/// Whether the forward pass needs the few-channel kernel's per-row epilogue (conv_fwd_small.h).
bool needs_epilogue(const ConvQuery& q) { return fwd_small_epilogue(q.act, q.keep_pre); }

/// Whether the forward pass can take mpx's few-channel kernel: 1-4 input channels, 16/24/32/64
/// filters (conv_fwd_small.h), the output in the input's dtype. Relu or no activation and no
/// kept pre-activation: a 16-bit output always (it saves oneDNN's rounding pass); a float32 one
/// with AVX-512 unless the layer has several channels and 32 filters, where oneDNN's kernel
/// was faster (measured per shape: docs/cpu-performance.md, "The first layer's forward pass";
/// with AVX2 oneDNN's won or tied). Another activation or a kept pre-activation (the fast CIFAR
/// recipe's whitening layer and its GELU), a 16-bit output and AVX-512: the kernel applies them
/// to each output row in cache, where oneDNN writes a float32 tensor for a pass after; with a
/// float32 output oneDNN's kernel and that pass were faster ("The first layer's epilogue"). Any
/// output with a max pooling taking its rows (conv2d_forward_pooled): the output is never stored,
/// which beat oneDNN's kernel and the pooling after it ("The first convolution's forward with max
/// pooling").
/// The switch first: a bad value is exit 2 on every net with a convolution.
bool few_channel_forward(const ConvQuery& q) {
  if (!conv_fwd_small_enabled() || q.in != q.out || reference_loops() || !conv_fwd_small_applies(q.g)) return false;
  if (needs_epilogue(q)) return is_16bit(q.out) && kernel_isa() == KernelIsa::Avx512;
  if (q.g.K == 24) return false;  // measured only with an epilogue
  if (is_16bit(q.out) || q.pooled) return true;
  return q.out == DType::F32 && kernel_isa() == KernelIsa::Avx512 && (q.g.C == 1 || q.g.K != 32);
}

/// Whether oneDNN's native 16-bit kernel is the one for this op: the dtype's path
/// (native16.h: MPX_CPU_16BIT and oneDNN's ISA) and, where that path is native for some
/// shapes only, the convolutions' rule.
bool wants_native16(const ConvQuery& q, std::string* why) {
  if (!is_16bit(q.in) || reference_loops()) return false;
  const Path16& path = path16(q.in);
  if (!path.native) return false;
  if (q.native_refused) {
    *why = "oneDNN has only its reference kernel (or none) for the native form: widened";
    return false;
  }
  if (path.per_shape && !native16_wins(q)) return false;
  // One input channel: mpx's few-channel forward on bfloat16 dot products beat oneDNN's
  // avx512_core_bf16 kernel (docs/cpu-performance.md, "The first layer's forward pass").
  if (path.per_shape && q.pass == ConvPass::Forward && q.g.C == 1 && fwd_small_dots(q.in, q.w_bf16) &&
      few_channel_forward(q))
    return false;
  if (path.amx_own) {
    // With AMX: one input channel runs oneDNN's avx512_core_bf16 forward, which mpx's
    // few-channel forward beats, and an AMX weight gradient slower than mpx's bfloat16 dot
    // products (docs/cpu-performance.md, "The first layer's forward pass").
    if (q.pass == ConvPass::Forward && (q.g.C == 1 || needs_epilogue(q)) && few_channel_forward(q)) return false;
    const WgradMode mode = wgrad_mode();
    const bool own_wgrad = q.pass == ConvPass::BackwardFilter && q.in == q.out &&
                           (mode == WgradMode::Default || mode == WgradMode::Auto);
    if (own_wgrad && q.g.C == 1 && own_bf16_math() && conv_wgrad_small_applies(q.g)) return false;
    if (amx_wgrad(q)) return false;
    // The AMX weight gradient of a 3x3 layer with small outputs does far more work than its
    // forward pass; mpx's Winograd (bfloat16 in its transforms) took half its time at 3x3 and
    // tied at 7x7 (docs/cpu-performance.md, "When it runs").
    if (own_wgrad && std::min(q.g.P, q.g.Q) < 7 && winograd_tile(q.p, q.g, true, q.configured) > 0) return false;
  }
  return true;
}

ConvChoice onednn(const ConvQuery& q, const std::string& before) {
  ConvChoice c = pick(ConvKernel::OneDnn, "oneDNN float32", before);
  c.blocked = conv_blocked_layout(q.g);
  c.why += fmt::format("{}oneDNN's float32 kernel, activations {}{}", c.why.empty() ? "" : "; ",
                       c.blocked ? "in its blocked layout" : "in NHWC",
                       is_16bit(q.in) || is_16bit(q.out) ? ", 16-bit operands widened into float32 copies" : "");
  return c;
}

ConvChoice forward(const ConvQuery& q, std::string why16);
ConvChoice backward_data(const ConvQuery& q, std::string why16);
ConvChoice backward_filter(const ConvQuery& q, std::string why16);

/// Where the dtype's path is native for some shapes only (native16.h, Path16::per_shape;
/// bfloat16 on AVX512-BF16 without AMX): whether oneDNN's native kernel beats the kernel the
/// widened path would run. Measured per pass and shape (docs/precision.md, "16-bit arithmetic
/// on the CPU"): mpx's Winograd (float32 products) beats oneDNN's bf16 direct kernels where
/// its tiles are full and the layer has channels enough for its products to outweigh its
/// transforms (the CIFAR seed net's 64 -> 128 at 32x32: 1.2-1.3x in forward and backward-data,
/// 1.7x in the weight gradient), and so does the few-channel weight gradient (oneDNN's bf16
/// one took 2-15x as long on 3x3 first layers and strided 3x3 layers). oneDNN's bf16 kernels
/// beat the few-channel forward, oneDNN's float32 kernels on widened copies (1.3-4x) and, in
/// the forward and backward-data passes, Winograd on outputs under 8x8 (1.2-1.5x at 7x7, its
/// tiles a quarter empty), on outputs that are not whole tiles (1.1-1.5x at 31x31 and 15x15)
/// and on layers with few channels (C K / (C + K) <= 32: 1.2-2.7x from 16 -> 16 to 64 -> 64);
/// in the weight gradient, 1x1 layers (3x) and 3x3 ones with at most 32 channels and 64
/// filters (1.1-1.8x).
bool native16_wins(const ConvQuery& q) {
  ConvQuery widened = q;
  widened.native_refused = false;
  const Geo& g = q.g;
  if (q.pass == ConvPass::BackwardFilter) {
    const ConvKernel k = backward_filter(widened, std::string()).kernel;
    if (k == ConvKernel::Winograd || k == ConvKernel::Winograd16) return g.C <= 32 && g.K <= 64;
    return g.R == 1 && g.S == 1 && k == ConvKernel::OneDnn;
  }
  const bool fwd = q.pass == ConvPass::Forward;
  const ConvChoice c = fwd ? forward(widened, std::string()) : backward_data(widened, std::string());
  if (c.kernel != ConvKernel::Winograd && c.kernel != ConvKernel::Winograd16) return true;
  const int64_t out_h = fwd ? g.P : g.H, out_w = fwd ? g.Q : g.W;  // what this pass's Winograd writes
  const bool few_channels = g.C * g.K <= 32 * (g.C + g.K);
  const bool partial_tiles = out_h % c.tile != 0 || out_w % c.tile != 0;
  return std::min(g.P, g.Q) < 8 || few_channels || partial_tiles;
}

ConvChoice forward(const ConvQuery& q, std::string why16) {
  const Geo& g = q.g;
  const bool relu_only = !q.keep_pre && (q.act.is_none() || q.act.kind == ActKind::Relu);
  const bool io16 = is_16bit(q.in) && q.in == q.out && !reference_loops();
  const int m = reference_loops() ? 0 : winograd_tile(q.p, g, false, q.configured);
  if (io16 && relu_only && m > 0)
    return pick(ConvKernel::Winograd16, winograd_name(m, q.in),
                "3x3 stride 1 on Winograd; its transforms read and round the 16-bit activations", m);
  // Winograd's default rule (16+ input channels) and the few-channel kernel (1-4) never meet; a
  // forced Winograd (cpu.winograd on or f2) takes a float32 layer first.
  if (few_channel_forward(q) && m == 0 && needs_epilogue(q))
    return pick(ConvKernel::FewChannels,
                fmt::format("mpx:few-channels {}, {}{}{} per output row in cache", conv_fwd_small_isa(),
                            fwd_small_dots(q.in, q.w_bf16) ? "bfloat16 dot products (vdpbf16ps), " : "",
                            q.act.is_none() ? "no activation"
                            : q.act.kind == ActKind::Scale ? "scale"
                                                           : activation_name(q.act.kind),
                            q.keep_pre ? " and the pre-activation" : ""),
                "1-4 input channels, 16/24/32/64 filters, an activation or the pre-activation after the "
                "convolution: mpx's kernel applies them to each output row while it is in cache");
  if (few_channel_forward(q) && m == 0)
    return is_16bit(q.out)
               ? pick(ConvKernel::FewChannels,
                      fmt::format("mpx:few-channels {}, {}{} rounded once {}", conv_fwd_small_isa(),
                                  fwd_small_dots(q.in, q.w_bf16) ? "bfloat16 dot products (vdpbf16ps), " : "",
                                  dtype_name(q.in),
                                  q.out != DType::BF16            ? "per row"
                                  : own_bf16_math() ? "in registers (vcvtneps2bf16)"
                                                                 : "in registers"),
                      "1-4 input channels, 16/32/64 filters, 16-bit output: mpx's kernel rounds each output once "
                      "(bfloat16 in registers, float16 per row in cache)")
               : pick(ConvKernel::FewChannels, fmt::format("mpx:few-channels {}", conv_fwd_small_isa()),
                      q.pooled ? "1-4 input channels, 16/32/64 filters, a max pooling after it: mpx's kernel pools "
                                 "each window's rows in cache and never stores the output"
                               : "1-4 input channels, 16/64 filters (32 with one channel), float32 with AVX-512: "
                                 "mpx's kernel keeps each run of pixels' sums in registers over all taps");
  if (reference_loops()) return pick(ConvKernel::Reference, "mpx:reference loops", "MPX_CPU_REFERENCE=1");
  if (m > 0) return pick(ConvKernel::Winograd, winograd_name(m, DType::F32), "3x3 stride 1 on Winograd", m);
  return onednn(q, why16);
}

ConvChoice backward_data(const ConvQuery& q, std::string why16) {
  const Geo& g = q.g;
  const int m16 = is_16bit(q.in) && q.in == q.out && !reference_loops() ? winograd_tile(q.p, g, false, q.configured) : 0;
  if (m16 > 0)
    return pick(ConvKernel::Winograd16, winograd_name(m16, q.in),
                "3x3 stride 1 on Winograd; its transforms read and round the 16-bit gradients", m16);
  if (reference_loops()) return pick(ConvKernel::Reference, "mpx:reference loops", "MPX_CPU_REFERENCE=1");
  const int m = winograd_tile(q.p, g, false, q.configured);
  if (m > 0) return pick(ConvKernel::Winograd, winograd_name(m, DType::F32), "3x3 stride 1 on Winograd", m);
  return onednn(q, why16);
}

ConvChoice backward_filter(const ConvQuery& q, std::string why16) {
  const Geo& g = q.g;
  const WgradMode mode = wgrad_mode();
  if ((mode == WgradMode::Default || mode == WgradMode::Auto) && !reference_loops() && q.in == q.out &&
      conv_wgrad_small_applies(g))
    return pick(ConvKernel::FewChannels,
                fmt::format("mpx:few-channels {}{}", conv_wgrad_small_isa(),
                            q.in == DType::BF16 && own_bf16_math()
                                ? ", bfloat16 dot products (vdpbf16ps)"
                            : is_16bit(q.in) ? fmt::format(", {} rows widened in cache", dtype_name(q.in))
                                             : std::string()),
                "1-4 input channels, 16/32/64 filters: mpx's kernel keeps every filter's sums in registers");
  if (amx_wgrad(q))
    return pick(ConvKernel::WgradAmx,
                conv_wgrad_amx_split(g) == AmxSplit::Slabs ? "mpx:amx bf16 tiles (tdpbf16ps), threads by slabs"
                                                           : "mpx:amx bf16 tiles (tdpbf16ps), threads by passes",
                "bfloat16 with AMX, 3x3 stride 1, channels and filters in multiples of 16: mpx's kernel sums dy^T x "
                "per filter tap on AMX tiles over a padded grid");
  const bool gemm_forced = mode == WgradMode::Gemm;
  if (is_16bit(q.in) && q.in == q.out && !reference_loops()) {
    const int m = gemm_forced ? 0 : winograd_tile(q.p, g, true, q.configured);
    if (m > 0)
      return pick(ConvKernel::Winograd16, winograd_name(m, q.in),
                  "3x3 stride 1 on Winograd; its transforms read the 16-bit activations and gradients", m);
  }
  if (reference_loops()) return pick(ConvKernel::Reference, "mpx:reference loops", "MPX_CPU_REFERENCE=1");
  const int m = gemm_forced ? 0 : winograd_tile(q.p, g, true, q.configured);
  if (m > 0) return pick(ConvKernel::Winograd, winograd_name(m, DType::F32), "3x3 stride 1 on Winograd", m);
  if (mode != WgradMode::Default && mode != WgradMode::OneDnn && wgrad_gemm_applies(wgrad_geo(g), g.sh, g.sw) &&
      (gemm_forced || wgrad_gemm_rule(wgrad_geo(g))))
    return pick(ConvKernel::WgradGemm,
                gemm_forced ? "gemm:sgemm (MPX_CONV_WGRAD=gemm)" : "gemm:sgemm (MPX_CONV_WGRAD=auto)",
                gemm_forced ? "MPX_CONV_WGRAD=gemm" : "MPX_CONV_WGRAD=auto and the shape rule");
  ConvChoice c = onednn(q, why16);
  c.why += "; the bias gradient summed by mpx over dy's rows";
  return c;
}

}  // namespace

int winograd_tile(const Conv2dParams& p, const Geo& g, bool wgrad, WinogradMode configured) {
  const auto forced = winograd_forced();
  const WinogradMode mode = forced ? *forced : configured;
  if (mode == WinogradMode::Off || !winograd_applies(p, g)) return 0;
  if (mode == WinogradMode::F4) return 4;
  if (mode == WinogradMode::F2) return 2;
  return winograd_rule(g, wgrad) ? 4 : 0;
}

// Measured on AVX2: blocked is ~2x faster for C=64->K=128 3x3 even with the reorders,
// slower for the first layer (C = 1 or 3) (docs/cpu-performance.md, "What runs on oneDNN").
bool conv_blocked_layout(const Geo& g) {
  const int force = conv_blocked_forced();
  if (force >= 0) return force == 1;
  return g.C >= 16 && g.K >= 16 && g.C % 8 == 0 && g.K % 8 == 0;
}

ConvChoice choose_conv(const ConvQuery& q) {
  std::string why16;
  if (wants_native16(q, &why16))
    return pick(ConvKernel::Native16, fmt::format("oneDNN native {}", q.in == DType::BF16 ? "bf16" : "f16"),
                path16(q.in).text);
  if (why16.empty() && is_16bit(q.in)) why16 = path16(q.in).text;
  switch (q.pass) {
    case ConvPass::Forward: return forward(q, why16);
    case ConvPass::BackwardData: return backward_data(q, why16);
    case ConvPass::BackwardFilter: return backward_filter(q, why16);
  }
  return onednn(q, why16);
}

}  // namespace mpx::cpu
