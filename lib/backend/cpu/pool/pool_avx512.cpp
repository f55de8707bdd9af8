// SPDX-License-Identifier: MIT
// The AVX-512 build of the tiled max-pooling kernels (pool_tiled.inc); this file is compiled
// with -mavx512f (lib/CMakeLists.txt, *_avx512.cpp) and called by pool.cpp only after cpuid
// reported AVX-512F (docs/cpu-performance.md, "Max pooling after relu").
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/pool/pool_tiled.h"

namespace mpx::cpu::avx512 {

namespace {

// max pooling's backward with the relu, from the forward's argmax, a row of dx at a time in mask
// registers (docs/cpu-performance.md, "Max pooling's backward in the first convolution's weight
// gradient"): per window and block of channels, the mask of y > 0 (the relu's test at the
// argmax) and dy loaded once, then each window position's row takes dy where the argmax is that
// position, else +0. The same bits as pool_tiled.inc's loops (F32Elem and Half16Elem: route,
// positive). float32 needs whole vectors of 16 channels; 16-bit ones 32 channels and AVX512-BW.

bool has_bw() {
  static const bool bw = __builtin_cpu_supports("avx512bw");
  return bw;
}

bool argmax_rows_apply(const TiledGeo& g, DType t) {
  if (t == DType::F32) return g.C % 16 == 0;
  return (t == DType::BF16 || t == DType::F16) && g.C % 32 == 0 && has_bw();
}

void argmax_row_f32(const TiledGeo& g, const float* y, const uint8_t* argmax, const float* dy, float* dx,
                    int64_t n, int64_t p, int64_t r) {
  const int64_t C = g.C, S = g.S;
  for (int64_t q = 0; q < g.Q; ++q) {
    const int64_t o = ((n * g.P + p) * g.Q + q) * C;
    for (int64_t c = 0; c < C; c += 16) {
      const __m128i a8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(argmax + o + c));
      const __m512i at = _mm512_maskz_cvtepu8_epi32(0xFFFF, a8);  // maskz: GCC warns on the plain form
      const __mmask16 pos = _mm512_cmp_ps_mask(_mm512_loadu_ps(y + o + c), _mm512_setzero_ps(), _CMP_GT_OQ);
      const __m512 gv = _mm512_loadu_ps(dy + o + c);
      for (int64_t s = 0; s < S; ++s) {
        const __mmask16 hit = _mm512_mask_cmpeq_epi32_mask(pos, at, _mm512_set1_epi32(static_cast<int>(r * S + s)));
        _mm512_storeu_ps(dx + (q * S + s) * C + c, _mm512_maskz_mov_ps(hit, gv));
      }
    }
  }
}

/// nan_above: Half16Elem's kNanAbove (0x7F80 bfloat16, 0x7C00 float16): y > 0 is y's bits, as
/// int16, in (0, nan_above].
__attribute__((target("avx512bw"))) void argmax_row_16(const TiledGeo& g, const uint16_t* y,
                                                       const uint8_t* argmax, const uint16_t* dy, uint16_t* dx,
                                                       int64_t n, int64_t p, int64_t r, int16_t nan_above) {
  const int64_t C = g.C, S = g.S;
  const __m512i top = _mm512_set1_epi16(nan_above), zero = _mm512_setzero_si512();
  for (int64_t q = 0; q < g.Q; ++q) {
    const int64_t o = ((n * g.P + p) * g.Q + q) * C;
    for (int64_t c = 0; c < C; c += 32) {
      const __m256i a8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(argmax + o + c));
      const __m512i at = _mm512_maskz_cvtepu8_epi16(0xFFFFFFFF, a8);
      const __m512i yv = _mm512_loadu_si512(y + o + c);
      const __mmask32 pos = _mm512_mask_cmple_epi16_mask(_mm512_cmpgt_epi16_mask(yv, zero), yv, top);
      const __m512i gv = _mm512_loadu_si512(dy + o + c);
      for (int64_t s = 0; s < S; ++s) {
        const __m512i k = _mm512_set1_epi16(static_cast<int16_t>(r * S + s));
        const __mmask32 hit = _mm512_mask_cmpeq_epi16_mask(pos, at, k);
        _mm512_storeu_si512(dx + (q * S + s) * C + c, _mm512_maskz_mov_epi16(hit, gv));
      }
    }
  }
}

/// Row h of image n of the relu's and the pooling's dx (W x C elements of t at dx).
void argmax_row(const TiledGeo& g, const void* y, const uint8_t* argmax, const void* dy, void* dx, int64_t n,
                int64_t h, DType t) {
  const int64_t p = h / g.R, r = h % g.R, bytes = t == DType::F32 ? 4 : 2;
  if (p >= g.P) {  // a row no window covers
    std::memset(dx, 0, static_cast<size_t>(g.W * g.C * bytes));
    return;
  }
  if (t == DType::F32)
    argmax_row_f32(g, static_cast<const float*>(y), argmax, static_cast<const float*>(dy), static_cast<float*>(dx),
                   n, p, r);
  else
    argmax_row_16(g, static_cast<const uint16_t*>(y), argmax, static_cast<const uint16_t*>(dy),
                  static_cast<uint16_t*>(dx), n, p, r, t == DType::BF16 ? 0x7F80 : 0x7C00);
  if (g.Q * g.S < g.W)
    std::memset(static_cast<char*>(dx) + g.Q * g.S * g.C * bytes, 0,
                static_cast<size_t>((g.W - g.Q * g.S) * g.C * bytes));
}

}  // namespace

#define MPX_POOL_ARGMAX_ROWS
#include "backend/cpu/pool/pool_tiled.inc"
}  // namespace mpx::cpu::avx512
