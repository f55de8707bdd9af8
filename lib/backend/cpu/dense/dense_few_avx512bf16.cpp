// SPDX-License-Identifier: MIT
// The AVX-512 build of the few-output dense loops (dense_few.inc) compiled for AVX512-BF16
// (lib/CMakeLists.txt, *_avx512bf16.cpp): the same loops, with bfloat16 results rounded by
// VCVTNEPS2BF16 (elem16.inc) and, in the backward-data pass, two vectors rounded into one and
// relu's mask taken from the bfloat16 bits of its output. dense_few.cpp calls it for bfloat16
// operands only where cpu_bf16_dot() allows and MPX_CPU_16BIT is not widen
// (own_bf16_math(), native16.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/dense/dense_few.h"
#include "backend/cpu/elem16.h"
#include "core/half.h"

namespace mpx::cpu::dfew_avx512bf16 {
constexpr int kL = 16;
constexpr int kRegs = 32;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/dense/dense_few.inc"
}  // namespace mpx::cpu::dfew_avx512bf16
