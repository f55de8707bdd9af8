// SPDX-License-Identifier: MIT
// The AVX2 build of the tiled max-pooling kernels (pool_tiled.inc); this file is compiled
// with -mavx2 -mfma -mf16c (lib/CMakeLists.txt, *_avx2.cpp) and called by pool.cpp only
// after cpuid reported AVX2. Measured on the smoke net's [256,26,26,32] 2x2 pool (AMD
// EPYC, 2 threads, load < 2): backward 194-252 ms per 33 calls against 510-534 ms for
// the baseline build.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/pool/pool_tiled.h"

namespace mpx::cpu::avx2 {
#include "backend/cpu/pool/pool_tiled.inc"
}  // namespace mpx::cpu::avx2
