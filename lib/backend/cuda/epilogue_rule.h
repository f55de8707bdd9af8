// SPDX-License-Identifier: MIT
// Which activations dense.cpp lets cuBLASLt apply as a matmul epilogue. Plain C++ (no
// CUDA headers), so the CPU tests check the rule. The NaN contract (docs/gpu.md): every
// activation of a NaN is NaN on both backends, and the first-bad-layer diagnosis relies
// on it. cuBLASLt's RELU epilogues compute max(x, 0), which turns NaN into 0, so relu is
// never fused: the bias runs in the epilogue and the relu kernel (x < 0 ? 0 : x) after.
#pragma once

#include "core/activation.h"

namespace mpx::cuda {

/// True when cuBLASLt's epilogue for `kind` keeps the NaN contract and dense.cpp fuses it.
constexpr bool cublaslt_fuses_activation(ActKind kind) {
  switch (kind) {
    case ActKind::GeluTanh: return true;  // GELU epilogues: 0.5x(1+tanh(...)) of NaN is NaN
    case ActKind::Relu: return false;     // RELU epilogues: max(NaN, 0) = 0
    default: return false;                // no epilogue exists
  }
}

}  // namespace mpx::cuda
