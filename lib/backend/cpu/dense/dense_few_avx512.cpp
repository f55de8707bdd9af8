// SPDX-License-Identifier: MIT
// The AVX-512 build of the few-output dense loops (dense_few.inc); compiled with
// -mavx512f (lib/CMakeLists.txt, *_avx512.cpp) and called by dense_few.cpp only after
// cpuid and oneDNN's ISA limit allowed it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/dense/dense_few.h"
#include "backend/cpu/elem16.h"
#include "core/half.h"

namespace mpx::cpu::dfew_avx512 {
constexpr int kL = 16;
constexpr int kRegs = 32;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/dense/dense_few.inc"
}  // namespace mpx::cpu::dfew_avx512
