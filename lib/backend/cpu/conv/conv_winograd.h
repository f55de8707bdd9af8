// SPDX-License-Identifier: MIT
// Winograd convolution F(m x m, 3 x 3), m = 4 or 2, for 3x3 stride-1 float32 convolutions in
// NHWC (docs/cpu-performance.md, "Winograd convolution"). Backward-data is the same
// convolution of dy with the filter turned by 180 degrees and its channel roles swapped, so
// one routine serves both: it reads an input [N, H, W, Ci], writes an output [N, P, Q, Co] with
//   out[n,p,q,o] = sum_{r,s,i} in[n, p-pt+r, q-pl+s, i] * f[o,r,s,i]   (zero outside the input)
// where the filter f has been transformed by winograd_weights().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cpu/conv/conv_choose.h"
#include "backend/cpu/conv/conv_loops.h"
#include "backend/cpu/elem16.h"
#include "backend/device_info.h"
#include "core/dtype.h"

namespace mpx::cpu {

class Context;

struct WinoGeo {
  int64_t N, H, W, Ci;  // input, NHWC
  int64_t P, Q, Co;     // output, NHWC
  int64_t pt, pl;       // top and left padding of the input (0..2)
  int m;                // output tile: 4 for F(4x4,3x3), 2 for F(2x2,3x3)
  int64_t tiles_per_block;
};

/// Default tiles per block of one thread (the GEMMs' row count) for this geometry.
int64_t winograd_tiles_per_block(const WinoGeo& g);
/// Default tiles per block of the weight gradient (the GEMMs' reduction length), which adds
/// each block into an accumulator of (m+2)^2 * Co * Ci floats: a longer block reads and writes
/// that accumulator fewer times per tile.
int64_t winograd_wgrad_tiles_per_block(const WinoGeo& g);

/// Floats of the transformed filter: (m+2)^2 * Ci * Co.
size_t winograd_weight_floats(const WinoGeo& g);

/// The transformed filter U[(m+2)^2][Ci][Co], computed in float64 and rounded once.
/// Forward: w is KRSC = [Co][3][3][Ci]. rotated (backward-data): w is the forward filter
/// [Ci][3][3][Co] (its K is this convolution's input channels), used turned by 180 degrees.
void winograd_weights(const WinoGeo& g, const float* w, bool rotated, float* u);

/// Floats of scratch conv_winograd needs with `threads` OpenMP threads.
size_t winograd_scratch(const WinoGeo& g, int threads);

/// out = conv(in, f) (+ bias[o] when bias is not null, then max(0, .) when relu; NaN stays NaN).
/// in and out hold `io` elements (F32, BF16 or F16; elem16.h): 16-bit ones are widened as they
/// are read and rounded once as they are written, the same bits as widening the tensor,
/// running the float32 kernel and rounding its output; u from winograd_weights(); scratch holds
/// winograd_scratch(g, omp_get_max_threads()) floats.
/// Deterministic: the tiles of a block and the blocks do not depend on the thread count.
void conv_winograd(const WinoGeo& g, const void* in, const float* u, const float* bias, bool relu, void* out,
                   float* scratch, DType io = DType::F32);

/// Floats of scratch conv_winograd_wgrad needs with `threads` OpenMP threads.
size_t winograd_wgrad_scratch(const WinoGeo& g, int threads);

/// The weight gradient of conv_winograd's convolution with the filter as it applies it:
/// dw[o,r,s,i] = sum_{n,p,q} dy[n,p,q,o] * in[n, p-pt+r, q-pl+s, i] (dw KRSC [Co][3][3][Ci]),
/// and db[o] = sum dy[...,o] when db is not null, as G^T [sum over tiles (A dy A^T) . (B^T x B)] G.
/// Each thread sums its own tiles, so the rounding depends on the thread count (as oneDNN's
/// kernel's and the GEMM weight gradient's do).
/// in and dy hold `io` elements; dw and db are float32.
void conv_winograd_wgrad(const WinoGeo& g, const void* in, const void* dy, float* dw, float* db, float* scratch,
                         DType io = DType::F32);

// Where it runs (MPX_CONV_WINOGRAD, cpu.winograd, the shape rule): winograd_tile() and
// choose_conv() in conv_choose.h; conv.cpp calls the routines above with the Context's scratch.

/// Which build of the transforms runs: "avx512", "avx2" or "baseline" (cpuid).
const char* winograd_isa();

/// Of a kernel's three builds, the one winograd_isa() picks (the rule every per-ISA kernel of
/// the CPU backend follows: the few-channel convolutions and the few-output dense loops too).
template <class T>
T by_isa(T base, T avx2, T avx512) {
  const std::string isa = winograd_isa();
  return isa == "avx512" ? avx512 : isa == "avx2" ? avx2 : base;
}

/// `floats` rounded up to whole 64-byte cache lines (a per-thread scratch block's size).
inline int64_t whole_lines(int64_t floats) { return (floats + 15) / 16 * 16; }

// The transforms of one block of tiles, built once per ISA (conv_winograd.inc).
struct WinoBlock {
  const WinoGeo* g;
  const void* in;  // `io` elements
  const float *u, *bias;
  void* out;  // `io` elements
  bool relu;
  DType io;
  int64_t ldv, ldm, plane_v, plane_m;  // scratch layout: V[alpha^2][tiles][ldv], M[..][..][ldm]
};
namespace wino_base {
void run_block(const WinoBlock& b, int64_t t0, int64_t nt, float* v, float* m);
void wgrad_block(const WinoBlock& b, const void* dy, int64_t t0, int64_t nt, float* v, float* m, float* acc,
                 float* db);
}
namespace wino_avx2 {
void run_block(const WinoBlock& b, int64_t t0, int64_t nt, float* v, float* m);
void wgrad_block(const WinoBlock& b, const void* dy, int64_t t0, int64_t nt, float* v, float* m, float* acc,
                 float* db);
}
namespace wino_avx512 {
void run_block(const WinoBlock& b, int64_t t0, int64_t nt, float* v, float* m);
void wgrad_block(const WinoBlock& b, const void* dy, int64_t t0, int64_t nt, float* v, float* m, float* acc,
                 float* db);
}

}  // namespace mpx::cpu
