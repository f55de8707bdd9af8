// SPDX-License-Identifier: MIT
// The AVX2 build of the few-output dense loops (dense_few.inc); compiled with
// -mavx2 -mfma -mf16c (lib/CMakeLists.txt, *_avx2.cpp) and called by dense_few.cpp only after
// cpuid and oneDNN's ISA limit allowed it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/dense/dense_few.h"
#include "backend/cpu/elem16.h"
#include "core/half.h"

namespace mpx::cpu::dfew_avx2 {
constexpr int kL = 8;
constexpr int kRegs = 16;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/dense/dense_few.inc"
}  // namespace mpx::cpu::dfew_avx2
