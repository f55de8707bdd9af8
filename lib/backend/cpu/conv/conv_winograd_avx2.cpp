// SPDX-License-Identifier: MIT
// The AVX2 build of the Winograd transforms (conv_winograd.inc); compiled with -mavx2 -mfma
// (lib/CMakeLists.txt, *_avx2.cpp) and called by conv_winograd.cpp only after cpuid and
// oneDNN reported AVX2.
#include <dnnl.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "backend/cpu/conv/conv_winograd.h"
#include "core/error.h"
#include "core/half.h"

namespace mpx::cpu::wino_avx2 {
constexpr int kCB = 8;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/conv/conv_winograd.inc"
}  // namespace mpx::cpu::wino_avx2
