// SPDX-License-Identifier: MIT
// The weight gradient (and bias gradient) of stride-1 convolutions with few input channels (a
// network's first layer: 1 to 4 channels, 16, 32 or 64 filters) on mpx's own loop
// (docs/cpu-performance.md, "The first layer's weight gradient"). Each thread takes whole
// output rows: their input rows widened into a buffer with the padding as zeros, dy's rows
// read once, and the sums of a block of filter taps for all filters held in vector registers
// over the row. float32 sums over a few rows go into float64 sums; the threads' float64 sums
// are added in thread order, so the rounding depends on the thread count (as oneDNN's
// kernel's does). 16-bit x and dy are widened a row at a time, except bfloat16 where the CPU
// has AVX512-BF16: there pairs of pixels go through bfloat16 dot products
// (conv_wgrad_small_avx512bf16.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "backend/cpu/conv/conv_loops.h"
#include "core/dtype.h"

namespace mpx::cpu {

/// Whether conv_wgrad_small computes this convolution's weight gradient: stride 1, C <= 4,
/// K in {16, 32, 64}, R * S * C <= 64.
bool conv_wgrad_small_applies(const conv_detail::Geo& g);

/// Whether conv_wgrad_small (dot products allowed) multiplies on bfloat16 dot products for x
/// and dy of dtype io: bfloat16, and the CPU's allowed (own_bf16_math()).
bool conv_wgrad_small_dots(DType io);

/// Floats of scratch conv_wgrad_small needs with `threads` OpenMP threads.
size_t conv_wgrad_small_scratch(const conv_detail::Geo& g, int threads);

/// dw (KRSC, float32) = the weight gradient, and db (float32, when not null) = dy's sums over
/// all pixels; x and dy hold `io` elements (F32, BF16 or F16).
void conv_wgrad_small(const conv_detail::Geo& g, const void* x, const void* dy, DType io, float* dw, float* db,
                      float* scratch);

/// Where conv_wgrad_small reads dy when dy is not stored: fill(ctx, row, dst) writes output row
/// `row` of dy (image row / P, its row row % P: Q x K elements of the io dtype) at dst. The kernel
/// takes each row once, as it would from memory (max pooling's backward routes its gradient
/// there: Backend::max_pool_conv_backward).
struct WgradDyRows {
  void (*fill)(const void* ctx, int64_t row, void* dst);
  const void* ctx;
};

/// conv_wgrad_small with dy's rows from `rows` instead of memory: the same bits as
/// conv_wgrad_small on a dy that holds those rows.
void conv_wgrad_small(const conv_detail::Geo& g, const void* x, const WgradDyRows& rows, DType io, float* dw,
                      float* db, float* scratch);

/// The build that runs: "avx512", "avx2" or "baseline" (winograd_isa()'s rule).
const char* conv_wgrad_small_isa();

// A bfloat16 weight gradient runs on bfloat16 dot products where own_bf16_math() (native16.h)
// allows, else widens its rows to float32 (docs/precision.md, "The first layer's weight
// gradient in bfloat16").

/// conv_wgrad_small with the bfloat16 dot products allowed (`dot`, where the CPU has them) or
/// not (the widened rows whatever the CPU: the tests' way to run both). `buffered`: the dot
/// products take dy's pixel pairs from the interleave buffer even where one block of taps
/// could interleave them in registers (the tests' way to check that both give the same bits).
void conv_wgrad_small(const conv_detail::Geo& g, const void* x, const void* dy, DType io, float* dw, float* db,
                      float* scratch, bool dot, bool buffered = false);

// The per-ISA builds (conv_wgrad_small.inc): output rows [row0, row1) summed into acc
// [taps + kWgradMaxTaps][K] and db [K] in float32, which every kWgradFlushRows rows are added
// into the float64 sums accd [taps][K] and dbd [K] and cleared (accd and dbd hold the result);
// xrows (R widened input rows) and dyrow (one widened dy row) are the thread's buffers.
struct WgradSmallArgs {
  const conv_detail::Geo* g;
  const void* x;
  const void* dy;
  DType io;
  float *acc, *db, *xrows, *dyrow;
  double *accd, *dbd;
  bool buffered = false;  // the bfloat16 dot-product build: dy's pairs always through dyrow
  const WgradDyRows* rows = nullptr;  // dy's rows from here, not from dy
  void* dyraw = nullptr;              // the thread's buffer of one such row (Q x K io elements)
};

/// Output row `row` of dy (Q x K io elements): in dy, or filled into a.dyraw by a.rows.
inline const void* wgrad_small_dy_row(const WgradSmallArgs& a, int64_t row) {
  if (!a.rows)
    return static_cast<const char*>(a.dy) + row * a.g->Q * a.g->K * static_cast<int64_t>(dtype_size(a.io));
  a.rows->fill(a.rows->ctx, row, a.dyraw);
  return a.dyraw;
}
/// Output rows summed in float32 before the float64 sums take them: the float32 sums run
/// over at most this many rows' pixels.
constexpr int64_t kWgradFlushRows = 8;
namespace wsmall_base { void run(const WgradSmallArgs& a, int64_t row0, int64_t row1); }
namespace wsmall_avx2 { void run(const WgradSmallArgs& a, int64_t row0, int64_t row1); }
namespace wsmall_avx512 { void run(const WgradSmallArgs& a, int64_t row0, int64_t row1); }
/// The bfloat16 dot-product build (conv_wgrad_small_avx512bf16.cpp): io BF16 only; xrows and
/// dyrow hold bfloat16 (x's rows by channel, dy's pixels interleaved in pairs).
namespace wsmall_avx512bf16 { void run(const WgradSmallArgs& a, int64_t row0, int64_t row1); }

/// The most filter taps summed at once in any build (acc has this many spare rows).
constexpr int kWgradMaxTaps = 16;
/// Columns of one widened input row in the thread's buffer: those the output row reads.
inline int64_t wgrad_small_columns(const conv_detail::Geo& g) { return g.Q + g.S - 1; }

/// Of the block sizes a build has (`sizes`, each at most kWgradMaxTaps), the one for J taps:
/// the fewest taps once J is padded to whole blocks (padded taps are summed and dropped), the
/// larger block of two that pad alike (fewer passes over dy's row).
inline int wgrad_small_taps_per_block(int64_t J, std::initializer_list<int> sizes) {
  int best = 0;
  int64_t best_padded = 0;
  for (int tb : sizes) {
    const int64_t padded = (J + tb - 1) / tb * tb;
    if (best == 0 || padded < best_padded || (padded == best_padded && tb > best)) best = tb, best_padded = padded;
  }
  return best;
}

/// The float32 sums of the last rows (acc's first J x K, db's K) added into the float64 ones,
/// and acc (Jp x K) and db cleared.
inline void wgrad_small_flush(const WgradSmallArgs& a, int64_t J, int64_t K, int64_t Jp) {
  for (int64_t e = 0; e < J * K; ++e) a.accd[e] += a.acc[e];
  for (int64_t k = 0; k < K; ++k) a.dbd[k] += a.db[k];
  std::fill(a.acc, a.acc + Jp * K, 0.0f);
  std::fill(a.db, a.db + K, 0.0f);
}

}  // namespace mpx::cpu
