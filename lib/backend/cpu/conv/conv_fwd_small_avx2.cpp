// SPDX-License-Identifier: MIT
// The AVX2 build of the few-input-channel forward convolution (conv_fwd_small.inc);
// compiled with -mavx2 -mfma -mf16c (lib/CMakeLists.txt, *_avx2.cpp) and called by conv_fwd_small.cpp only
// after cpuid and oneDNN's ISA limit allowed it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/elem16.h"
#include "core/half.h"

namespace mpx::cpu::fsmall_avx2 {
constexpr int kL = 8;
constexpr int kRegs = 16;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/conv/conv_small_rows.inc"
#include "backend/cpu/conv/conv_fwd_small.inc"
}  // namespace mpx::cpu::fsmall_avx2
