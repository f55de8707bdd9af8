// SPDX-License-Identifier: MIT
// Vectorized bulk conversions: float16 with F16C (this file is compiled with
// -mf16c -mavx), bfloat16 with AVX2 integer ops (enabled per function with
// target("avx2")). Called from half.cpp only after a run-time cpuid check.
// Each function converts n contiguous elements; tails are handled so that the
// result equals the scalar reference bit for bit.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/half.h"

namespace mpx::detail {

void f32_to_f16_f16c(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(src + i);
    const __m256 b = _mm256_loadu_ps(src + i + 8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 8), _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    // Tail through a padded vector, so that it gets exactly the hardware's results too.
    alignas(32) float in[16] = {};
    alignas(32) uint16_t out[16];
    const size_t rest = n - i;
    std::memcpy(in, src + i, rest * sizeof(float));
    const __m256 a = _mm256_load_ps(in);
    const __m256 b = _mm256_load_ps(in + 8);
    _mm_store_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
    _mm_store_si128(reinterpret_cast<__m128i*>(out + 8), _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT));
    std::memcpy(dst + i, out, rest * sizeof(uint16_t));
  }
}

void f16_to_f32_f16c(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 8));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(a));
    _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(b));
  }
  if (i < n) {
    alignas(32) uint16_t in[16] = {};
    alignas(32) float out[16];
    const size_t rest = n - i;
    std::memcpy(in, src + i, rest * sizeof(uint16_t));
    _mm256_store_ps(out, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(in))));
    _mm256_store_ps(out + 8, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(in + 8))));
    std::memcpy(dst + i, out, rest * sizeof(float));
  }
}

namespace {

// Eight float32 bit patterns -> eight bfloat16 in the low 16 bits of each 32-bit lane:
// round to nearest even on the upper half; NaN: truncate and set the quiet bit.
__attribute__((target("avx2"))) inline __m256i bf16_round8(__m256i x) {
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7FFF);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256i quiet = _mm256_set1_epi32(0x0040);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, lsb)), 16);
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);  // both sides >= 0
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

}  // namespace

__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = bf16_round8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i b = bf16_round8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // packus works per 128-bit lane: [a0-3 b0-3 | a4-7 b4-7]; reorder the 64-bit quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i a = bf16_round8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 8), hi);
  }
  // Not bf16_to_f32(): an out-of-line copy of that inline function compiled here could carry AVX code.
  for (; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

}  // namespace mpx::detail
