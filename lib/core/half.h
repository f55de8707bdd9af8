// SPDX-License-Identifier: MIT
// float32 <-> float16 / bfloat16 conversions, round-to-nearest-even with IEEE
// subnormals, overflow to inf and NaN kept NaN, exactly as the GPU does them.
// Scalar functions are the portable reference; the bulk functions use F16C
// (float16) and AVX2 (bfloat16) where the CPU has them, chosen at run time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace mpx {

// ---- portable scalar reference ----------------------------------------------
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
inline float bf16_to_f32(uint16_t h);

/// Rounds a float32 to the nearest value representable in `t` (identity for F32).
float round_to(DType t, float f);

// ---- bulk conversions (vectorized where the CPU allows) ---------------------
/// Converts n elements between any two float dtypes (F32/F16/BF16), rounding to nearest-even.
void convert(const void* src, DType src_t, void* dst, DType dst_t, size_t n);
/// The same with the portable scalar code only (tests compare the two).
void convert_portable(const void* src, DType src_t, void* dst, DType dst_t, size_t n);
/// True when convert() uses F16C instructions on this CPU.
bool have_f16c();

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace mpx
