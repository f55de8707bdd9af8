// SPDX-License-Identifier: MIT
// The error bound of the CPU backend's Winograd convolution (docs/cpu-performance.md,
// "Winograd convolution"), for tests/test_backend_conv_winograd.cpp.
//
// The bound. Each output is a sum of products x * w * (coefficients of B, G, A), one term
// per path through the transforms; in float32 every path passes through at most n
// roundings, n = Ci + 20 (the GEMM's sum over Ci, the 2 passes of each 1-D transform, the
// filter's one rounding from float64, the product, the bias). So
//   |y_winograd - y_exact| <= gamma_n * Y_abs,   gamma_n = n u / (1 - n u), u = 2^-24,
// where Y_abs is the same Winograd formula evaluated in float64 with |B^T|, |G|, |A^T|, |x|
// and |w| (plus |bias|). Y_abs / sum|x||w| is the growth of the transform: with x and w all
// ones, from 28 to 256 over the 16 outputs of an F(4x4) tile and 7.1 for F(2x2); against it
// stands the direct kernel's gamma_(9 Ci) * sum|x||w|.
// The weight gradient sums over the tiles instead of the channels, n = tiles + 20, and
// Y_abs = |G|^T [sum over tiles (|A| |dy| |A|^T) . (|B^T| |x| |B|)] |G|.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "support/reference.h"

namespace support::winograd {

using ref::Vec;

// The transforms in plain matrix form (Lavin and Gray), independent of the kernel's factored code.
inline const double kBT4[6][6] = {{4, 0, -5, 0, 1, 0}, {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                                  {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
inline const double kG4[6][3] = {{0.25, 0, 0}, {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                 {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
inline const double kAT4[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
inline const double kBT2[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
inline const double kG2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
inline const double kAT2[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};

inline double bt(int m, int a, int k) { return std::fabs(m == 4 ? kBT4[a][k] : kBT2[a][k]); }
inline double gm(int m, int a, int r) { return std::fabs(m == 4 ? kG4[a][r] : kG2[a][r]); }
inline double at(int m, int p, int a) { return std::fabs(m == 4 ? kAT4[p][a] : kAT2[p][a]); }

/// |B^T| |x_t| |B| for the input tile of image n at output position (p0, q0), every input
/// channel: vd[(i*A + a)*A + b], A = m + 2 (zero outside the input).
inline void abs_input_tile(int m, int64_t H, int64_t W, int64_t Ci, int64_t pt, int64_t pl, const Vec& in, int64_t n,
                           int64_t p0, int64_t q0, std::vector<double>& vd) {
  const int A = m + 2;
  for (int64_t i = 0; i < Ci; ++i)
    for (int a = 0; a < A; ++a)
      for (int b = 0; b < A; ++b) {
        double s = 0;
        for (int k = 0; k < A; ++k)
          for (int l = 0; l < A; ++l) {
            const int64_t h = p0 - pt + k, w = q0 - pl + l;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            s += bt(m, a, k) * std::fabs(in[static_cast<size_t>(((n * H + h) * W + w) * Ci + i)]) * bt(m, b, l);
          }
        vd[static_cast<size_t>((i * A + a) * A + b)] = s;
      }
}

/// Y_abs of the header comment: in [N,H,W,Ci], f [Co,3,3,Ci] (the filter as this convolution
/// applies it), output [N,P,Q,Co] with top/left padding pt, pl.
inline Vec abs_winograd(int m, int64_t N, int64_t H, int64_t W, int64_t Ci, int64_t P, int64_t Q, int64_t Co, int64_t pt,
                 int64_t pl, const Vec& in, const Vec& f, const Vec* bias) {
  const int A = m + 2;
  Vec y(static_cast<size_t>(N * P * Q * Co), 0.0);
  std::vector<double> uf(static_cast<size_t>(Co * Ci * A * A));
  for (int64_t o = 0; o < Co; ++o)
    for (int64_t i = 0; i < Ci; ++i)
      for (int a = 0; a < A; ++a)
        for (int b = 0; b < A; ++b) {
          double s = 0;
          for (int r = 0; r < 3; ++r)
            for (int t = 0; t < 3; ++t)
              s += gm(m, a, r) * std::fabs(f[static_cast<size_t>(((o * 3 + r) * 3 + t) * Ci + i)]) * gm(m, b, t);
          uf[static_cast<size_t>(((o * Ci + i) * A + a) * A + b)] = s;
        }
  std::vector<double> vd(static_cast<size_t>(Ci * A * A)), mm(static_cast<size_t>(A * A));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p0 = 0; p0 < P; p0 += m)
      for (int64_t q0 = 0; q0 < Q; q0 += m) {
        abs_input_tile(m, H, W, Ci, pt, pl, in, n, p0, q0, vd);
        for (int64_t o = 0; o < Co; ++o) {
          std::fill(mm.begin(), mm.end(), 0.0);
          for (int64_t i = 0; i < Ci; ++i)
            for (int e = 0; e < A * A; ++e)
              mm[static_cast<size_t>(e)] +=
                  uf[static_cast<size_t>((o * Ci + i) * A * A + e)] * vd[static_cast<size_t>(i * A * A + e)];
          for (int p = 0; p < m && p0 + p < P; ++p)
            for (int q = 0; q < m && q0 + q < Q; ++q) {
              double s = bias ? std::fabs((*bias)[static_cast<size_t>(o)]) : 0.0;
              for (int a = 0; a < A; ++a)
                for (int b = 0; b < A; ++b) s += at(m, p, a) * mm[static_cast<size_t>(a * A + b)] * at(m, q, b);
              y[static_cast<size_t>(((n * P + p0 + p) * Q + q0 + q) * Co + o)] = s;
            }
        }
      }
  return y;
}

/// Y_abs of the weight gradient: G^T [sum over tiles (|A| |dy_t| |A^T|) . (|B^T| |x_t| |B|)] G
/// with |G|, for dw [Co,3,3,Ci].
inline Vec abs_winograd_wgrad(int m, int64_t N, int64_t H, int64_t W, int64_t Ci, int64_t P, int64_t Q, int64_t Co,
                       int64_t pt, int64_t pl, const Vec& in, const Vec& dy) {
  const int A = m + 2;
  std::vector<double> acc(static_cast<size_t>(Co * Ci * A * A), 0.0), vd(static_cast<size_t>(Ci * A * A)),
      ud(static_cast<size_t>(Co * A * A));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p0 = 0; p0 < P; p0 += m)
      for (int64_t q0 = 0; q0 < Q; q0 += m) {
        abs_input_tile(m, H, W, Ci, pt, pl, in, n, p0, q0, vd);
        for (int64_t o = 0; o < Co; ++o)
          for (int a = 0; a < A; ++a)
            for (int b = 0; b < A; ++b) {
              double s = 0;
              for (int p = 0; p < m && p0 + p < P; ++p)
                for (int q = 0; q < m && q0 + q < Q; ++q)
                  s += at(m, p, a) * std::fabs(dy[static_cast<size_t>(((n * P + p0 + p) * Q + q0 + q) * Co + o)]) *
                       at(m, q, b);
              ud[static_cast<size_t>((o * A + a) * A + b)] = s;
            }
        for (int64_t o = 0; o < Co; ++o)
          for (int64_t i = 0; i < Ci; ++i)
            for (int e = 0; e < A * A; ++e)
              acc[static_cast<size_t>((o * Ci + i) * A * A + e)] +=
                  ud[static_cast<size_t>(o * A * A + e)] * vd[static_cast<size_t>(i * A * A + e)];
      }
  Vec dw(static_cast<size_t>(Co * 9 * Ci));
  for (int64_t o = 0; o < Co; ++o)
    for (int64_t i = 0; i < Ci; ++i)
      for (int r = 0; r < 3; ++r)
        for (int t = 0; t < 3; ++t) {
          double s = 0;
          for (int a = 0; a < A; ++a)
            for (int b = 0; b < A; ++b)
              s += gm(m, a, r) * acc[static_cast<size_t>((o * Ci + i) * A * A + a * A + b)] * gm(m, b, t);
          dw[static_cast<size_t>(((o * 3 + r) * 3 + t) * Ci + i)] = s;
        }
  return dw;
}

/// Every element within gamma_(Ci+20) * Y_abs of the float64 reference; reports the largest
/// error in units of u * Y_abs (INFO) and returns it.
inline double check_bound(const std::string& what, const std::vector<float>& got, const Vec& want, const Vec& yabs,
                   int64_t Ci) {
  REQUIRE(got.size() == want.size());
  const double u = std::ldexp(1.0, -24), n = static_cast<double>(Ci + 20), gamma = n * u / (1 - n * u);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!std::isfinite(got[i]) || err > gamma * yabs[i])
      FAIL(what << ": element " << i << " of " << got.size() << " is " << got[i] << ", reference " << want[i]
                << " (error " << err << ", bound " << gamma * yabs[i] << ")");
    if (yabs[i] > 0) worst = std::max(worst, err / (u * yabs[i]));
  }
  INFO(what << ": largest error " << worst << " u * Y_abs (bound " << n << ")");
  CHECK(worst <= n);
  return worst;
}

inline std::vector<float> uniform(mpx::Rng& rng, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = static_cast<float>(rng.uniform() * 2.0 - 1.0);
  return v;
}

}  // namespace support::winograd
