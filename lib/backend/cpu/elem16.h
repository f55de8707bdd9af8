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

/// Two bfloat16 values as one 32-bit pair of VDPBF16PS's operands, `first` in the upper half:
/// the instruction adds the upper element's product to the float32 sum first, so pairs built
/// from consecutive terms add them in their order, as FMAs one term at a time would (mpx's
/// few-channel forward and few-output dense loops; docs/precision.md). A pair whose second term
/// is missing takes +0 against a -0 on the other side: the product -0 leaves every sum as it is.
inline uint32_t bf16_pair(uint16_t first, uint16_t second) { return static_cast<uint32_t>(first) << 16 | second; }

}  // namespace mpx::cpu
