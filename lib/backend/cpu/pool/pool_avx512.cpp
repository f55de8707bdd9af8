// SPDX-License-Identifier: MIT
// The AVX-512 build of the tiled max-pooling kernels (pool_tiled.inc); this file is compiled
// with -mavx512f (lib/CMakeLists.txt, *_avx512.cpp) and called by pool.cpp only after cpuid
// reported AVX-512F (docs/cpu-performance.md, "Max pooling after relu").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/pool/pool_tiled.h"

namespace mpx::cpu::avx512 {
#include "backend/cpu/pool/pool_tiled.inc"
}  // namespace mpx::cpu::avx512
