// SPDX-License-Identifier: MIT
// The AMX weight gradient's shape rule and grid (conv_wgrad_amx.h), in the plain build: the
// chooser asks them on every CPU. The kernel itself is conv_wgrad_amx.cpp, built with AMX
// instructions where the compiler has them.
#include "backend/cpu/conv/conv_wgrad_amx.h"

#include <algorithm>

#include "backend/cpu/switches.h"
#include "core/error.h"

namespace mpx::cpu {

namespace {

/// Grid pixels over output pixels of g's grid.
double grid_waste(const conv_detail::Geo& g, const AmxGrid& a) {
  return static_cast<double>(a.Hg * a.Wg) / static_cast<double>(g.P * g.Q);
}

}  // namespace

AmxGrid conv_wgrad_amx_grid(const conv_detail::Geo& g) {
  AmxGrid a;
  a.Wg = g.W + std::max<int64_t>(g.pl, amx_pad_right(g));
  a.Hg = g.H + std::max<int64_t>(g.pt, amx_pad_bottom(g));
  a.Gm = (g.N * a.Hg * a.Wg + 31) / 32 * 32;
  a.lead = g.pt * a.Wg + g.pl;
  // Passes of 64 blocks (2,048 grid pixels): their dy and x (1.5 MB at 256 filters and 64
  // channels) stay in the caches from the layout to the last tap's products.
  a.chunk_blocks = std::min<int64_t>(64, a.Gm / 32);
  // The largest tap offset on x's grid, past dy's position: lead + (R - 1 - pt) Wg + S - 1 - pl.
  const int64_t max_off = a.lead + (g.R - 1 - g.pt) * a.Wg + (g.S - 1 - g.pl);
  // A pass's last block reads pairs up to (32 chunk_blocks - 32 + max_off) / 2 + 15.
  a.Jc = a.chunk_blocks * 16 + max_off / 2 + 1;
  a.passes = (a.Gm / 32 + a.chunk_blocks - 1) / a.chunk_blocks;
  a.slabs = std::min(a.passes, kAmxSlabs);
  return a;
}

bool conv_wgrad_amx_applies(const conv_detail::Geo& g) {
  if (g.sh != 1 || g.sw != 1 || g.C % 16 != 0 || g.K % 16 != 0 || g.C == 0 || g.K == 0) return false;
  if (g.R < 1 || g.S < 1 || g.R > 7 || g.S > 7 || g.P < 1 || g.Q < 1 || g.N < 1) return false;
  const int64_t pb = amx_pad_bottom(g), pr = amx_pad_right(g);
  if (g.pt < 0 || g.pl < 0 || pb < 0 || pr < 0) return false;
  // dy's rows must fit in the grid's: Q <= Wg, P <= Hg.
  if (std::min<int64_t>(g.pl, pr) > g.S - 1 || std::min<int64_t>(g.pt, pb) > g.R - 1) return false;
  const AmxGrid a = conv_wgrad_amx_grid(g);
  return grid_waste(g, a) <= 2.0;
}

AmxSplit conv_wgrad_amx_split(const conv_detail::Geo& g) {
  switch (amx_wgrad_split()) {
    case AmxWgradSplit::Slabs:
      return AmxSplit::Slabs;
    case AmxWgradSplit::Passes:
      return AmxSplit::Passes;
    case AmxWgradSplit::Auto:
      break;
  }
  // Slabs where a thread's accumulators, the size of dw in float32, take at most half of an
  // AMX core's 2 MB L2 beside its pass (docs/cpu-performance.md, "The AMX weight gradient").
  return g.K * g.R * g.S * g.C * 4 <= (int64_t{1} << 20) ? AmxSplit::Slabs : AmxSplit::Passes;
}

AmxScratch conv_wgrad_amx_scratch(const conv_detail::Geo& g, int threads, AmxSplit split) {
  const AmxGrid a = conv_wgrad_amx_grid(g);
  const auto up64 = [](size_t b) { return (b + 63) / 64 * 64; };
  AmxScratch s;
  // A block per thread that lays out passes (each thread's for slabs, one shared by all for
  // passes): a pass's dy transposed (K x 32 chunk_blocks bfloat16), its x's two pair copies
  // (2 x C x 2 Jc bfloat16) and the accumulators (4 float32 tiles of 16 x 16 per unit and
  // tap), on 4 KB boundaries; then each grid block's sums of dy per filter (for db) and, for
  // more than one slab, the slabs' copies of dw.
  s.x = s.dy + up64(static_cast<size_t>(g.K * a.chunk_blocks * 32) * 2);
  s.acc = s.x + up64(static_cast<size_t>(4 * g.C * a.Jc) * 2);
  const size_t acc_bytes = static_cast<size_t>(conv_wgrad_amx_units(g) * g.R * g.S) * 1024 * 4;
  s.thread_bytes = (s.acc + acc_bytes + 4095) / 4096 * 4096;
  const bool slabs = split == AmxSplit::Slabs;
  s.db = (slabs ? static_cast<size_t>(std::max(1, threads)) : 1) * s.thread_bytes;
  s.partials = s.db + up64(static_cast<size_t>(a.Gm / 32 * g.K) * 4);
  const size_t copies = slabs && a.slabs > 1 ? static_cast<size_t>(a.slabs) : 0;
  s.bytes = s.partials + copies * static_cast<size_t>(g.K * g.R * g.S * g.C) * 4;
  return s;
}

#ifndef MPX_AMX_BUILD
void conv_wgrad_amx(const conv_detail::Geo&, const uint16_t*, const uint16_t*, float*, float*, void*, int, AmxSplit) {
  throw Error("internal error: the AMX weight gradient was asked for in a build without AMX instructions");
}
#endif

}  // namespace mpx::cpu
