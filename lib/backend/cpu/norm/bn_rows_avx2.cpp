// SPDX-License-Identifier: MIT
// The AVX2 build of the batch-norm row loops (bn_rows.inc); compiled with
// -mavx2 -mfma -mf16c (lib/CMakeLists.txt, *_avx2.cpp) and called by bn_rows.cpp only after cpuid and
// oneDNN's ISA limit allowed it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/elem16.h"
#include "backend/cpu/norm/bn_rows.h"
#include "core/half.h"

namespace mpx::cpu::bnr_detail::avx2 {
#include "backend/cpu/elem16.inc"
#include "backend/cpu/norm/bn_rows.inc"
}  // namespace mpx::cpu::bnr_detail::avx2
