// SPDX-License-Identifier: MIT
// Bit-for-bit comparison of two tensors' bytes in which any two NaNs of a float dtype
// count as equal. Backends agree on every finite and infinite value bit for bit, but
// not on NaN payloads: x86 keeps the input NaN's bits (0x7fc00000 for quiet_NaN()),
// NVIDIA GPUs return the canonical 0x7fffffff. docs/testing.md says which tests use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace support {

/// True when the element of dtype t at p is a NaN (all-ones exponent, nonzero mantissa);
/// false for every non-float dtype.
inline bool is_nan_bits(const uint8_t* p, mpx::DType t) {
  switch (t) {
    case mpx::DType::F32: {
      uint32_t u;
      std::memcpy(&u, p, 4);
      return (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0;
    }
    case mpx::DType::F16: {
      uint16_t u;
      std::memcpy(&u, p, 2);
      return (u & 0x7c00u) == 0x7c00u && (u & 0x03ffu) != 0;
    }
    case mpx::DType::BF16: {
      uint16_t u;
      std::memcpy(&u, p, 2);
      return (u & 0x7f80u) == 0x7f80u && (u & 0x007fu) != 0;
    }
    default:
      return false;
  }
}

/// Index of the first element (of dtype t, `bytes` bytes each side) whose bits differ,
/// treating any two NaNs as equal; `bytes / dtype_size(t)` when none differs.
inline size_t first_difference_nan_equal(const uint8_t* a, const uint8_t* b, size_t bytes, mpx::DType t) {
  const size_t es = mpx::dtype_size(t);
  const size_t n = bytes / es;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* x = a + i * es;
    const uint8_t* y = b + i * es;
    if (std::memcmp(x, y, es) == 0) continue;
    if (is_nan_bits(x, t) && is_nan_bits(y, t)) continue;
    return i;
  }
  return n;
}

/// a == b, or both NaN (for float/double fields of a struct read back from a device).
template <typename T>
bool same_or_both_nan(T a, T b) {
  return a == b || (a != a && b != b);
}

}  // namespace support
