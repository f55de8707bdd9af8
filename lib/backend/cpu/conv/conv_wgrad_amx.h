// SPDX-License-Identifier: MIT
// mpx's bfloat16 weight gradient on AMX tiles (docs/cpu-performance.md, "The AMX weight
// gradient"): stride-1 convolutions whose channels and filters are multiples of 16, bfloat16 x and dy,
// float32 dw and db. The pixels are laid out on a grid of rows Wg = W + max(pad_left,
// pad_right) wide and images Hg = H + max(pad_top, pad_bottom) rows tall, the padding as zeros
// shared between neighbouring rows and images, so that every filter tap (r, s) is one offset
// along the grid and the weight gradient is R * S products of dy^T (filters by grid pixels)
// and x (grid pixels by channels), summed over the grid. dy is transposed into tiles of 16
// filters by 32 pixels; x is stored as pixel pairs (AMX's VNNI layout) twice, from even and
// from odd pixels, so that a tap of either parity reads whole pairs on 64-byte rows. The
// threads share either every pass (each sums its blocks of dw) or whole slabs of passes (each
// sums all of dw over its slab, and the slabs' sums are added in slab order); either way every
// dw and db element has one order of sums, set by the shape: the bits do not depend on the
// thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/conv/conv_loops.h"

namespace mpx::cpu {

/// The grid of a convolution's AMX weight gradient (conv_wgrad_amx_grid).
struct AmxGrid {
  int64_t Wg = 0, Hg = 0;        // grid row width and image height
  int64_t Gm = 0;                // dy's grid pixels, a multiple of 32 (the tail is zeros)
  int64_t lead = 0;              // x's grid starts this many pixels before dy's: pad_top * Wg + pad_left
  int64_t chunk_blocks = 0;      // blocks of 32 grid pixels per pass (the last pass may have fewer)
  int64_t Jc = 0;                // pixel pairs of x a pass reads, in each of its two copies
  int64_t passes = 0;            // passes over the grid
  int64_t slabs = 0;             // slabs of whole passes, for AmxSplit::Slabs: min(passes, kAmxSlabs)
};

/// The most slabs the grid is cut into, so the most threads a slabbed weight gradient keeps
/// busy: a constant, so that the order of every dw element's sums depends on the shape alone.
inline constexpr int64_t kAmxSlabs = 8;

/// How the threads share the work (docs/cpu-performance.md, "The AMX weight gradient").
enum class AmxSplit {
  Passes,  // every thread lays out part of every pass, then sums its blocks of dw over it
  Slabs,   // each thread lays out and sums whole passes (a slab) into its own copy of dw
};

/// The split for g: MPX_AMX_WGRAD_SPLIT, else slabs where dw in float32 takes at most 1 MiB.
AmxSplit conv_wgrad_amx_split(const conv_detail::Geo& g);

/// Where conv_wgrad_amx's buffers lie in its scratch (byte offsets, 64-byte multiples).
struct AmxScratch {
  size_t dy = 0, x = 0, acc = 0;           // in each thread's block (one block for AmxSplit::Passes)
  size_t thread_bytes = 0;                 // the blocks' stride, from the start of the scratch
  size_t db = 0, partials = 0, bytes = 0;  // db's block sums, the slabs' copies of dw, the total
};

/// The padding on the bottom and right that stride 1 implies: P - 1 + R - pad_top - H.
inline int64_t amx_pad_bottom(const conv_detail::Geo& g) { return g.P - 1 + g.R - g.pt - g.H; }
inline int64_t amx_pad_right(const conv_detail::Geo& g) { return g.Q - 1 + g.S - g.pl - g.W; }

/// Whether conv_wgrad_amx computes this shape: stride 1, C and K multiples of 16, filters of
/// at most 7x7, paddings that fit between the grid's rows (the smaller of each pair under the
/// filter's size) and a grid at most twice the output's pixels. The CPU is not asked
/// (own_amx_bf16() in native16.h is).
bool conv_wgrad_amx_applies(const conv_detail::Geo& g);

AmxGrid conv_wgrad_amx_grid(const conv_detail::Geo& g);

/// The blocks of up to 32 filters by 32 channels that the threads share out.
inline int64_t conv_wgrad_amx_units(const conv_detail::Geo& g) { return ((g.K + 31) / 32) * ((g.C + 31) / 32); }

/// The scratch conv_wgrad_amx needs on `threads` threads: a pass's dy and x and the
/// accumulators (per thread for slabs), each grid block's sums of dy, and the slabs' dw.
AmxScratch conv_wgrad_amx_scratch(const conv_detail::Geo& g, int threads, AmxSplit split);
inline size_t conv_wgrad_amx_scratch_bytes(const conv_detail::Geo& g, int threads, AmxSplit split) {
  return conv_wgrad_amx_scratch(g, threads, split).bytes;
}

/// dw (KRSC, float32) = the weight gradient of bfloat16 x (NHWC) and dy (NPQK), and db
/// (float32, when not null) = dy's sums over all pixels, on `threads` OpenMP threads. Only
/// where own_amx_bf16() and conv_wgrad_amx_applies(g); scratch holds
/// conv_wgrad_amx_scratch_bytes(g, threads, split), 64-byte aligned.
void conv_wgrad_amx(const conv_detail::Geo& g, const uint16_t* x, const uint16_t* dy, float* dw, float* db,
                    void* scratch, int threads, AmxSplit split);

}  // namespace mpx::cpu
