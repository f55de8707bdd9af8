// SPDX-License-Identifier: MIT
// The AVX-512 build of the few-input-channel forward convolution (conv_fwd_small.inc) compiled
// for AVX512-BF16 (lib/CMakeLists.txt, *_avx512bf16.cpp): the same loop, with a bfloat16 output
// rounded by VCVTNEPS2BF16 (elem16.inc). conv_fwd_small.cpp calls it for bfloat16 only where
// cpu_bf16_dot() allows and MPX_CPU_16BIT is not widen (own_bf16_math(), native16.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/elem16.h"
#include "core/half.h"

namespace mpx::cpu::fsmall_avx512bf16 {
constexpr int kL = 16;
constexpr int kRegs = 32;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/conv/conv_small_rows.inc"
#include "backend/cpu/conv/conv_fwd_small.inc"
}  // namespace mpx::cpu::fsmall_avx512bf16
