// SPDX-License-Identifier: MIT
// The few-input-channel weight gradient of bfloat16 x and dy on bfloat16 dot products
// (conv_wgrad_small.h; docs/precision.md, "The first layer's weight gradient in bfloat16").
// Compiled with -mavx512bf16 (lib/CMakeLists.txt, *_avx512bf16.cpp) and called by
// conv_wgrad_small.cpp only where the CPU has AVX512-BF16 and oneDNN's ISA limit allows it.
//
// The loop is conv_wgrad_small.inc's with the pixels taken two at a time: vdpbf16ps adds, per
// filter, the two products x[tap, pixel] * dy[pixel, filter] of a pixel pair to a float32 sum,
// each product exact (bfloat16 has 8 significant bits) and each addition rounded, as two
// float32 FMAs would; the instruction treats subnormal operands and results as zero. So that
// a pair is one 32-bit load on each side, the input rows are copied by channel, bfloat16 as
// they are (xb[r][c][column], a zero column past the last), and dy's row is interleaved by
// pixel pairs (dyi[pair][filter][2], the odd pixel of an odd row paired with zero).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backend/cpu/conv/conv_wgrad_small.h"

namespace mpx::cpu::wsmall_avx512bf16 {

namespace {

constexpr int kL = 16;  // float32 sums per vector

/// The bfloat16 pair at p (two adjacent elements) as a 32-bit value.
inline int32_t pair_at(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// acc[t][0..K) += sum over the row's pixel pairs of the pair products, for the TB taps whose
/// offsets in xb are off[0..TB); Qh pairs, the last of them holding one pixel when `odd`.
template <int K, int TB>
void taps_block(const uint16_t* dyi, const uint16_t* xb, const int64_t* off, int64_t Qh, bool odd, float* acc) {
  constexpr int V = K / kL;
  __m512 a[TB][V];
#pragma GCC unroll 16
  for (int t = 0; t < TB; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) a[t][v] = _mm512_loadu_ps(acc + t * K + v * kL);
  auto step = [&](int64_t h, int32_t mask) {
    __m512bh d[V];
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) d[v] = (__m512bh)_mm512_loadu_si512(dyi + (h * K + v * kL) * 2);
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) {
      const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair_at(xb + off[t] + 2 * h) & mask);
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) a[t][v] = _mm512_dpbf16_ps(a[t][v], xp, d[v]);
    }
  };
  const int64_t full = odd ? Qh - 1 : Qh;
  for (int64_t h = 0; h < full; ++h) step(h, -1);
  // The odd pixel's partner column is a real input column (or the zero past the last), which
  // may hold an infinity; the mask makes that element zero, so its product with dy's zero is 0.
  if (odd) step(Qh - 1, 0xffff);
#pragma GCC unroll 16
  for (int t = 0; t < TB; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc + t * K + v * kL, a[t][v]);
}

constexpr int max_taps(int V) { return std::clamp((32 - V - 2) / V, 1, kWgradMaxTaps); }

using BlockFn = void (*)(const uint16_t*, const uint16_t*, const int64_t*, int64_t, bool, float*);

template <int K>
std::pair<BlockFn, int> block_for(int64_t J) {
  constexpr int M = max_taps(K / kL);
  static constexpr std::pair<BlockFn, int> built[] = {
      {&taps_block<K, M>, M}, {&taps_block<K, std::min(M, 9)>, std::min(M, 9)},
      {&taps_block<K, std::min(M, 6)>, std::min(M, 6)}, {&taps_block<K, std::min(M, 4)>, std::min(M, 4)},
      {&taps_block<K, std::min(M, 3)>, std::min(M, 3)}};
  const int tb = wgrad_small_taps_per_block(J, {built[0].second, built[1].second, built[2].second,
                                                built[3].second, built[4].second});
  for (const auto& b : built)
    if (b.second == tb) return b;
  return built[0];
}

/// xb[r][c][0..Wb) = x[n][p - pt + r][column - pl][c], zero outside the image and past Wp.
void load_rows(const conv_detail::Geo& g, const uint16_t* x, int64_t n, int64_t p, int64_t Wp, int64_t Wb,
               uint16_t* xb) {
  const int64_t C = g.C;
  for (int64_t r = 0; r < g.R; ++r) {
    const int64_t h = p - g.pt + r;
    for (int64_t c = 0; c < C; ++c) {
      uint16_t* dst = xb + (r * C + c) * Wb;
      std::fill(dst, dst + Wb, uint16_t{0});
      const int64_t w0 = g.pl, w1 = std::min(Wp, g.W + g.pl);  // the columns inside the image
      if (h < 0 || h >= g.H || w1 <= w0) continue;
      const uint16_t* src = x + ((n * g.H + h) * g.W + (w0 - g.pl)) * C + c;
      if (C == 1) {
        std::memcpy(dst + w0, src, static_cast<size_t>(w1 - w0) * sizeof(uint16_t));
      } else {
        for (int64_t wq = w0; wq < w1; ++wq) dst[wq] = src[(wq - w0) * C];
      }
    }
  }
}

/// (dy[q][k0 + i], dy[q + 1][k0 + i]) for i < 16 as one vector of pairs, from the pixel's 16
/// filters at p and the next pixel's at p + K, or zeros for the next when `last_odd`.
template <int K>
inline __m512i pixel_pair(const uint16_t* p, bool last_odd) {
  // vpermt2w's index: result element 2i from the first pixel's element i, 2i+1 from the
  // second's (index 32 + i).
  alignas(64) static const uint16_t idx[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                               8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  constexpr __mmask32 kRow = 0xffff;  // one vector's 16 filters of a pixel; the upper half zero
  const __m512i a = _mm512_maskz_loadu_epi16(kRow, p);
  const __m512i b = last_odd ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi16(kRow, p + K);
  return _mm512_permutex2var_epi16(a, _mm512_load_si512(idx), b);
}

/// dyi[h][k][0..2) = (dy[2h][k], dy[2h+1][k]) for the row's Q pixels, dy[Q][k] = 0 when Q is
/// odd.
template <int K>
void interleave(const uint16_t* dy, int64_t Q, uint16_t* dyi) {
  for (int64_t q = 0; q < Q; q += 2)
    for (int v = 0; v < K / kL; ++v)
      _mm512_storeu_si512(dyi + (q * K + v * 2 * kL), pixel_pair<K>(dy + q * K + v * kL, q + 1 >= Q));
}

/// One output row where a single block takes all its taps (16 or 32 filters): dy's pixel pairs
/// interleaved in registers as the block uses them (interleave() without its buffer) and the
/// bias's sums (products with 1) beside the taps'. Each sum takes the same products in the same
/// order as interleave() then taps_block() and the bias loop, so the bits are theirs.
template <int K, int TB>
void row_block(const uint16_t* dy, int64_t Q, const uint16_t* xb, const int64_t* off, float* acc, float* db) {
  constexpr int V = K / kL;
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80);  // bfloat16 1.0
  __m512 a[TB][V], b[V];
#pragma GCC unroll 16
  for (int t = 0; t < TB; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) a[t][v] = _mm512_loadu_ps(acc + t * K + v * kL);
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_ps(db + v * kL);
  auto step = [&](int64_t h, bool odd_last) {
    __m512bh d[V];
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      d[v] = (__m512bh)pixel_pair<K>(dy + 2 * h * K + v * kL, odd_last);
      b[v] = _mm512_dpbf16_ps(b[v], ones, d[v]);
    }
    const int32_t mask = odd_last ? 0xffff : -1;  // as in taps_block
#pragma GCC unroll 16
    for (int t = 0; t < TB; ++t) {
      const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair_at(xb + off[t] + 2 * h) & mask);
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) a[t][v] = _mm512_dpbf16_ps(a[t][v], xp, d[v]);
    }
  };
  const int64_t Qh = (Q + 1) / 2, full = Q / 2;
  for (int64_t h = 0; h < full; ++h) step(h, false);
  if (Qh > full) step(full, true);
#pragma GCC unroll 16
  for (int t = 0; t < TB; ++t)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc + t * K + v * kL, a[t][v]);
#pragma GCC unroll 16
  for (int v = 0; v < V; ++v) _mm512_storeu_ps(db + v * kL, b[v]);
}

using RowFn = void (*)(const uint16_t*, int64_t, const uint16_t*, const int64_t*, float*, float*);

/// row_block for a block of TB taps, where K has one or two filter vectors (more would spill
/// the registers beside the sums); null otherwise.
template <int K>
RowFn row_for(int TB) {
  if constexpr (K / kL > 2) {
    return nullptr;
  } else {
    constexpr int M = max_taps(K / kL);
    if (TB * (K / kL) + 2 * (K / kL) + 4 > 32) return nullptr;  // the sums, dy's pair, the bias's, constants
    switch (TB) {
      case M: return &row_block<K, M>;
      case std::min(M, 9): return &row_block<K, std::min(M, 9)>;
      case std::min(M, 6): return &row_block<K, std::min(M, 6)>;
      case std::min(M, 4): return &row_block<K, std::min(M, 4)>;
      case std::min(M, 3): return &row_block<K, std::min(M, 3)>;
      default: return nullptr;
    }
  }
}

template <int K>
void run_k(const WgradSmallArgs& a, int64_t row0, int64_t row1) {
  constexpr int V = K / kL;
  const conv_detail::Geo& g = *a.g;
  const int64_t C = g.C, J = g.R * g.S * g.C, Q = g.Q, Qh = (Q + 1) / 2;
  const auto [block, TB] = block_for<K>(J);
  const int64_t Jp = (J + TB - 1) / TB * TB;
  const int64_t Wp = wgrad_small_columns(g), Wb = Wp + 1;
  const auto* x = static_cast<const uint16_t*>(a.x);
  auto* xb = reinterpret_cast<uint16_t*>(a.xrows);
  auto* dyi = reinterpret_cast<uint16_t*>(a.dyrow);
  int64_t off[64 + kWgradMaxTaps];
  for (int64_t j = 0; j < Jp; ++j) {
    const int64_t jj = j < J ? j : 0, c = jj % C, s = (jj / C) % g.S, r = jj / (C * g.S);
    off[j] = (r * C + c) * Wb + s;
  }
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80);  // bfloat16 1.0
  const RowFn one_block = Jp == TB && !a.buffered ? row_for<K>(TB) : nullptr;
  for (int64_t row = row0; row < row1; ++row) {
    load_rows(g, x, row / g.P, row % g.P, Wp, Wb, xb);
    const auto* dy = static_cast<const uint16_t*>(wgrad_small_dy_row(a, row));
    if (one_block) {
      one_block(dy, Q, xb, off, a.acc, a.db);
      if ((row - row0 + 1) % kWgradFlushRows == 0 || row + 1 == row1) wgrad_small_flush(a, J, K, Jp);
      continue;
    }
    interleave<K>(dy, Q, dyi);
    {  // the bias gradient: dy's sums over the row's pixels, as products with 1
      __m512 b[V];
      for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_ps(a.db + v * kL);
      for (int64_t h = 0; h < Qh; ++h)
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v)
          b[v] = _mm512_dpbf16_ps(b[v], ones, (__m512bh)_mm512_loadu_si512(dyi + (h * K + v * kL) * 2));
      for (int v = 0; v < V; ++v) _mm512_storeu_ps(a.db + v * kL, b[v]);
    }
    for (int64_t j0 = 0; j0 < Jp; j0 += TB) block(dyi, xb, off + j0, Qh, Q % 2 != 0, a.acc + j0 * K);
    if ((row - row0 + 1) % kWgradFlushRows == 0 || row + 1 == row1) wgrad_small_flush(a, J, K, Jp);
  }
}

}  // namespace

void run(const WgradSmallArgs& a, int64_t row0, int64_t row1) {
  switch (a.g->K) {
    case 16: return run_k<16>(a, row0, row1);
    case 32: return run_k<32>(a, row0, row1);
    default: return run_k<64>(a, row0, row1);
  }
}

}  // namespace mpx::cpu::wsmall_avx512bf16
