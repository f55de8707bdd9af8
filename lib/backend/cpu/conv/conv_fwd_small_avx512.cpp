// SPDX-License-Identifier: MIT
// The AVX-512 build of the few-input-channel forward convolution (conv_fwd_small.inc);
// compiled with -mavx512f (lib/CMakeLists.txt, *_avx512.cpp) and called by conv_fwd_small.cpp only
// after cpuid and oneDNN's ISA limit allowed it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/elem16.h"
#include "core/half.h"

namespace mpx::cpu::fsmall_avx512 {
constexpr int kL = 16;
constexpr int kRegs = 32;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/conv/conv_small_rows.inc"
#include "backend/cpu/conv/conv_fwd_small.inc"
}  // namespace mpx::cpu::fsmall_avx512
