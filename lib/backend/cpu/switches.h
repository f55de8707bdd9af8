// SPDX-License-Identifier: MIT
// The CPU backend's environment switches (docs/environment.md), every one read here and
// nowhere else in lib/backend/cpu. Each is read once per process, at its first use, except
// the pooling builds' two and MPX_CPU_PIECES, which are read at each call (the tests switch
// them). A bad value is a ConfigError (exit 2) naming the variable, raised where the switch
// is first needed, so a net that never needs it is not refused for it.
#pragma once

#include <optional>

#include "backend/device_info.h"

namespace mpx::cpu {

/// MPX_CPU_REFERENCE=1: every op runs mpx's plain loops instead of oneDNN, to rule oneDNN
/// out when debugging.
bool reference_loops();

/// MPX_CPU_PROFILE=1: the wall and CPU time of every op, printed when the backend goes away.
bool profiling();

/// MPX_CONV_BLOCKED: unset -1 (the chooser decides per convolution), off 0 (NHWC), on 1
/// (oneDNN's blocked activation layout around every oneDNN convolution).
int conv_blocked_forced();

/// MPX_CONV_WGRAD: unset, onednn, auto or gemm.
enum class WgradMode { Default, OneDnn, Auto, Gemm };
WgradMode wgrad_mode();

/// MPX_AMX_WGRAD_SPLIT: unset or auto, slabs, passes (how the threads share mpx's AMX weight
/// gradient, conv_wgrad_amx.h).
enum class AmxWgradSplit { Auto, Slabs, Passes };
AmxWgradSplit amx_wgrad_split();

/// MPX_CONV_FORWARD: unset or auto (true): 16-bit first layers may take mpx's few-channel
/// forward kernel; onednn (false): they never do.
bool conv_fwd_small_enabled();

/// MPX_DENSE_FEW: unset, auto or split (true): dense layers with few outputs may take mpx's
/// loops; onednn (false): they never do.
bool dense_few_enabled();
/// MPX_DENSE_FEW: unset or auto (true): their two backward passes may run in one walk over x;
/// split or onednn (false): each pass walks it alone.
bool dense_few_fused();

/// MPX_CPU_PIECES: unset or auto, off, on: whether a model runs the forward of the layers
/// feeding a dense layer or a max pooling in pieces of the batch (pieces.cpp): by the rules,
/// never, or for an input of any dtype. Read at each call (a model asks once per dense layer
/// when it is built; the tests switch it).
enum class PiecesMode { Auto, Off, On };
PiecesMode pieces_mode();

/// MPX_CONV_WINOGRAD: off, auto, on (or f4) or f2; nullopt when unset (the config's
/// cpu.winograd decides).
std::optional<WinogradMode> winograd_forced();

/// MPX_CPU_16BIT: unset or auto, native, widen.
enum class Math16Mode { Auto, Native, Widen };
Math16Mode math16_mode();

/// MPX_CPU_BASELINE=1: max pooling runs its baseline x86-64 build (read at each call).
bool pool_baseline();
/// MPX_CPU_POOL_ISA=avx2: max pooling's builds capped at AVX2 (read at each call).
bool pool_capped_avx2();

}  // namespace mpx::cpu
