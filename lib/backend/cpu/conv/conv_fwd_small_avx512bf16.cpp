// SPDX-License-Identifier: MIT
// The AVX-512 build of the few-input-channel forward convolution (conv_fwd_small.inc) compiled
// for AVX512-BF16 (lib/CMakeLists.txt, *_avx512bf16.cpp): the same loop, with a bfloat16 output
// rounded by VCVTNEPS2BF16 (elem16.inc). conv_fwd_small.cpp calls it for bfloat16 only where
// cpu_bf16_dot() allows and MPX_CPU_16BIT is not widen (own_bf16_math(), native16.h).
//
// run_dots is that loop with the taps taken two at a time, for bfloat16 weights: vdpbf16ps adds
// the products of a tap pair to each filter's float32 sum, each product exact and each addition
// rounded, the pair's odd element first (docs/cpu-performance.md, "The first layer's forward
// pass"). With the earlier tap in the odd element the sums are the FMA loop's, in its order. The
// instruction treats subnormal operands and sums as zero. For each output row the row's inputs
// are paired per column (xpairs[pair][column], built from the widened rows), so that a pair is
// one 32-bit broadcast.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/elem16.h"
#include "core/half.h"

namespace mpx::cpu::fsmall_avx512bf16 {
constexpr int kL = 16;
constexpr int kRegs = 32;
#include "backend/cpu/elem16.inc"
#include "backend/cpu/conv/conv_small_rows.inc"
#include "backend/cpu/conv/conv_fwd_small.inc"

namespace {

/// o[p][v*kL..] (p < PB, pixel stride K) = relu?(b + sum over the pairs i of xp[i * Qs + p] .
/// wp[i][v*kL..]): O is float (the row buffer) or uint16_t (bfloat16, rounded once).
template <int VB, int PB, class O>
inline void pixels_dots(const uint32_t* xp, int64_t Qs, int64_t J2, const uint32_t* wp, int64_t K, const float* b,
                        bool relu, O* o) {
  __m512 acc[PB][VB];
#pragma GCC unroll 16
  for (int v = 0; v < VB; ++v) {
    const __m512 bv = _mm512_loadu_ps(b + v * kL);
#pragma GCC unroll 16
    for (int p = 0; p < PB; ++p) acc[p][v] = bv;
  }
  for (int64_t i = 0; i < J2; ++i) {
    __m512bh w[VB];
#pragma GCC unroll 16
    for (int v = 0; v < VB; ++v) w[v] = (__m512bh)_mm512_loadu_si512(wp + i * K + v * kL);
    const uint32_t* xi = xp + i * Qs;
#pragma GCC unroll 16
    for (int p = 0; p < PB; ++p) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xi[p]));
#pragma GCC unroll 16
      for (int v = 0; v < VB; ++v) acc[p][v] = _mm512_dpbf16_ps(acc[p][v], w[v], xv);
    }
  }
#pragma GCC unroll 16
  for (int p = 0; p < PB; ++p)
#pragma GCC unroll 16
    for (int v = 0; v < VB; ++v) {
      vf r = (vf)acc[p][v];
      if (relu) r = (vf)((vi)r & ~(vi)(r < vf{}));  // x < 0 is false for NaN: NaN stays
      if constexpr (std::is_same_v<O, float>) {
        vstore(o + p * K + v * kL, r);
      } else {
        elem16::store_bf16_lanes(o + p * K + v * kL, (vu)r);
      }
    }
}

/// xp[i][q] = the pair (tap 2i, tap 2i + 1) at output column q from the widened rows xr (tap j
/// at xr[off[j] + q * C]); a lone last tap with -0.
void pair_inputs(const float* xr, const int64_t* off, int64_t J, int64_t C, int64_t Q, uint32_t* xp) {
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  for (int64_t i = 0; i < (J + 1) / 2; ++i, xp += Q) {
    const float* a = xr + off[2 * i];
    if (2 * i + 1 == J) {
      for (int64_t q = 0; q < Q; ++q) xp[q] = (bits(a[q * C]) & 0xffff0000u) | 0x8000u;
      continue;
    }
    const float* b = xr + off[2 * i + 1];
    if (C == 1) {
      for (int64_t q = 0; q < Q; ++q) xp[q] = (bits(a[q]) & 0xffff0000u) | bits(b[q]) >> 16;
    } else {
      for (int64_t q = 0; q < Q; ++q) xp[q] = (bits(a[q * C]) & 0xffff0000u) | bits(b[q * C]) >> 16;
    }
  }
}

template <int VB, int PB>
void run_dots_t(const FwdSmallArgs& a, int64_t row0, int64_t row1) {
  const conv_detail::Geo& g = *a.g;
  const int64_t C = g.C, K = g.K, Kp = fwd_small_filters(g), J = g.R * g.S * g.C, Wp = fwd_small_columns(g);
  const int64_t J2 = (J + 1) / 2, Q = g.Q;
  int64_t off[64];  // tap j = (r*S + s)*C + c (KRSC order) at xrows[r][s][c]
  for (int64_t j = 0; j < J; ++j) off[j] = (j / (C * g.S)) * Wp * C + ((j / C) % g.S) * C + j % C;
  const auto* x = static_cast<const uint16_t*>(a.x);
  auto* y = static_cast<uint16_t*>(a.y);
  auto* pre = static_cast<uint16_t*>(a.pre);
  const bool via_row = Kp != K || a.epilogue;  // as run_t: the float32 row buffer, then rounded
  for (int64_t row = row0; row < row1; ++row) {
    load_input_rows<DType::BF16>(g, x, row / g.P, row % g.P, Wp, a.xrows);
    pair_inputs(a.xrows, off, J, C, Q, a.xpairs);
    auto outputs = [&](auto* o, int64_t stride) {
      for (int64_t k0 = 0; k0 < stride; k0 += VB * kL) {
        int64_t q = 0;
        for (; q + PB <= Q; q += PB)
          pixels_dots<VB, PB>(a.xpairs + q, Q, J2, a.wp + k0, stride, a.b + k0, a.relu, o + q * stride + k0);
        for (; q < Q; ++q)
          pixels_dots<VB, 1>(a.xpairs + q, Q, J2, a.wp + k0, stride, a.b + k0, a.relu, o + q * stride + k0);
      }
    };
    if (!via_row) {
      outputs(y + (row - a.y_row0) * Q * K, K);
      continue;
    }
    float* o = a.yrow;
    outputs(o, Kp);
    if (Kp != K)  // the row's pixels to K filters each (in place, front to back)
      for (int64_t q = 1; q < Q; ++q) std::memmove(o + q * K, o + q * Kp, static_cast<size_t>(K) * 4);
    if (a.epilogue)
      activation_epilogue_span(a.act, o, Q * K, y + (row - a.y_row0) * Q * K, pre ? pre + row * Q * K : nullptr,
                               DType::BF16);
    else
      elem16::store_n<DType::BF16>(o, Q * K, y + (row - a.y_row0) * Q * K);
  }
}

}  // namespace

void run_dots(const FwdSmallArgs& a, int64_t row0, int64_t row1) {
  switch (fwd_small_filters(*a.g)) {
    case 16: return run_dots_t<1, pixels_per_run(1)>(a, row0, row1);
    case 32: return run_dots_t<2, pixels_per_run(2)>(a, row0, row1);
    default: return run_dots_t<4, pixels_per_run(4)>(a, row0, row1);
  }
}

}  // namespace mpx::cpu::fsmall_avx512bf16
