// SPDX-License-Identifier: MIT
// Activations of the CPU kernels that read and write 16-bit tensors themselves: the storage of
// an element of dtype T (docs/cpu-performance.md, "16-bit without native math"). The
// conversions are elem16.inc, built with each kernel's ISA.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace mpx::cpu {

/// float for float32; the 16 bits of a bfloat16 or float16.
template <DType T>
using elem_t = std::conditional_t<T == DType::F32, float, uint16_t>;

}  // namespace mpx::cpu
