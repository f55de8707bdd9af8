// SPDX-License-Identifier: MIT
// Which kernel runs a convolution pass, and why: the one place the CPU backend decides it
// (docs/cpu-performance.md, "Which kernel runs"). From the pass, the shapes, the dtypes,
// the CPU (cpuid and oneDNN's ISA) and the environment switches (switches.h), never from a
// timing, so every process on the same machine (a run and its resume) picks the same kernel
// and computes the same bits. conv.cpp runs what it says; a test may ask it without running
// the op.
#pragma once

#include <string>

#include "backend/cpu/conv/conv_loops.h"
#include "backend/device_info.h"

namespace mpx::cpu {

enum class ConvPass { Forward, BackwardData, BackwardFilter };

enum class ConvKernel {
  Native16,     // oneDNN's native 16-bit kernel (16-bit operands, float32 accumulation)
  Winograd,     // mpx's Winograd F(m x m, 3x3) (conv_winograd.h), 16-bit operands widened into copies
  Winograd16,   // the same, converting 16-bit activations in its transforms (the same bits)
  FewChannels,  // mpx's kernel for 1-4 input channels (conv_fwd_small.h, conv_wgrad_small.h)
  WgradGemm,    // mpx's GEMM weight gradient (conv_wgrad.h)
  WgradAmx,     // mpx's bfloat16 weight gradient on AMX tiles (conv_wgrad_amx.h)
  OneDnn,       // oneDNN's float32 kernel, 16-bit operands widened into copies
  Reference,    // MPX_CPU_REFERENCE: mpx's plain loops (conv_loops.h) on float32 copies
};

/// What the chooser looks at. `in` is the dtype of x (forward, weight gradient) or dy
/// (backward-data); `out` that of y (forward), dx (backward-data) or dy (weight gradient).
struct ConvQuery {
  ConvPass pass = ConvPass::Forward;
  Conv2dParams p;
  conv_detail::Geo g{};
  DType in = DType::F32, out = DType::F32;
  Activation act = Activation::None;  // forward only
  bool keep_pre = false;              // forward only: the pre-activation is kept
  bool w_bf16 = false;                // forward only: w is a bfloat16 tensor (fwd_small_dots)
  bool pooled = false;                // forward only: a max pooling takes the output (conv2d_forward_pooled)
  WinogradMode configured = WinogradMode::Auto;  // the config's cpu.winograd
  /// The native kernel was asked for and oneDNN has only its reference kernel (or none) for
  /// this op and shape: the op then asks again with this set, and the op is widened.
  bool native_refused = false;
};

struct ConvChoice {
  ConvKernel kernel = ConvKernel::OneDnn;
  int tile = 0;          // Winograd: 4 or 2
  bool blocked = false;  // oneDNN float32: activations in oneDNN's blocked layout around it
  /// As `mpx bench` lists it: mpx's kernels by their exact name in the kernels list; oneDNN's
  /// by "oneDNN ..." (its own implementation name, e.g. brgconv:avx512_core, is in the list).
  std::string name;
  std::string why;
};

ConvChoice choose_conv(const ConvQuery& q);

/// The Winograd tile of a 3x3 stride-1 convolution (4, 2, or 0 for none): MPX_CONV_WINOGRAD
/// or the config's mode, then the fixed shape-and-ISA rule (docs/cpu-performance.md, "When
/// it runs"). `wgrad` asks for the weight gradient's rule.
int winograd_tile(const Conv2dParams& p, const conv_detail::Geo& g, bool wgrad = false,
                  WinogradMode configured = WinogradMode::Auto);

/// Whether oneDNN's float32 convolutions of this shape keep their activations in its blocked
/// layout (MPX_CONV_BLOCKED, else 16+ channels in and out, multiples of 8).
bool conv_blocked_layout(const conv_detail::Geo& g);

}  // namespace mpx::cpu
