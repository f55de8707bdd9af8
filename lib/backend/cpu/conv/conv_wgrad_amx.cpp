// SPDX-License-Identifier: MIT
// mpx's bfloat16 weight gradient on AMX tiles (conv_wgrad_amx.h; docs/cpu-performance.md,
// "The AMX weight gradient"). Built with AVX-512 and AMX instructions (the *_amx.cpp files) and
// called only where own_amx_bf16() (native16.h) says the CPU has them and the kernel gave this
// process the tile state.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "backend/cpu/conv/conv_wgrad_amx.h"

// GCC 12's AVX-512 headers start many intrinsics' results from a self-initialized "undefined"
// vector (__Y = __Y), which -Wmaybe-uninitialized reports once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace mpx::cpu {

namespace {

using conv_detail::Geo;

/// Palette 1 with tiles 0-7 as 16 rows of 64 bytes: 0-3 float32 accumulators (16 filters by
/// 16 channels), 4-5 dy (16 filters by 32 pixels), 6-7 x (16 pixel pairs by 16 channels).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void tiles_on() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;
  _tile_loadconfig(&cfg);
}

/// Walks grid positions from `pos` (negative: that many zeros before the grid), naming the
/// pixel of an Hv x Wv image at each, or none off the images.
struct GridWalk {
  int64_t skip = 0, n = 0, i = 0, j = 0;
  int64_t Hg, Wg;
  GridWalk(int64_t pos, int64_t hg, int64_t wg) : Hg(hg), Wg(wg) {
    if (pos < 0) {
      skip = -pos;
    } else {
      n = pos / (Hg * Wg);
      const int64_t r = pos % (Hg * Wg);
      i = r / Wg, j = r % Wg;
    }
  }
  /// The pixel's index in an N x Hv x Wv tensor, or -1.
  int64_t pixel(int64_t N, int64_t Hv, int64_t Wv) const {
    return skip == 0 && n < N && i < Hv && j < Wv ? (n * Hv + i) * Wv + j : -1;
  }
  void next() {
    if (skip > 0) {
      --skip;
    } else if (++j == Wg) {
      j = 0;
      if (++i == Hg) i = 0, ++n;
    }
  }
};

/// Interleaves the 16-bit lanes 0-15 of a and b: (a0, b0, a1, b1, ...), AMX's pairs.
inline __m512i pairs(__m512i a, __m512i b) {
  alignas(64) static const uint16_t idx[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                               8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  return _mm512_permutex2var_epi16(a, _mm512_load_si512(idx), b);
}

/// The 16 bfloat16 at p (32 bytes) in the low half, or zeros for a null p.
inline __m512i load16(const uint16_t* p) {
  return p ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))) : _mm512_setzero_si512();
}

/// r[c] = column c of the 16 x 16 matrix of 32-bit lanes r[0..15].
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4g + j], 128-bit lane L: column 4L + j of rows 4g..4g+3.
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i a = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88), b = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
    const __m512i c = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88),
                  d = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
    r[j] = _mm512_shuffle_i32x4(a, c, 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(a, c, 0xdd);
    r[4 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(b, d, 0xdd);
  }
}

struct Work {
  const Geo* g;
  AmxGrid a;
  int64_t MB, K16, C16;
  int64_t mb0 = 0, nb = 0;   // the pass's grid blocks: [mb0, mb0 + nb)
  uint16_t* dyT;             // the pass's dy: [K16][chunk blocks][16 filters][32 pixels]
  uint16_t* xv;              // the pass's x: [2 parities][C16][Jc][16 channels][2 pixels]
  float* acc;                // [units][R S taps][4 tiles of 16 x 16 float32]
  float* db_part = nullptr;  // [MB][K]: each grid block's sums of dy per filter (when db is asked)
  float* dw;                 // KRSC
};

/// dy's grid block mb0 + b, transposed into the pass's buffer: the tile of filters 16 k16..
/// holds dy[pixel][filter] at row filter, column pixel (zeros off the outputs).
void lay_out_dy(const Work& w, const uint16_t* dy, int64_t b) {
  const Geo& g = *w.g;
  const int64_t mb = w.mb0 + b;
  const uint16_t* src[32];
  GridWalk walk(mb * 32, w.a.Hg, w.a.Wg);
  for (int i = 0; i < 32; ++i, walk.next()) {
    const int64_t px = walk.pixel(g.N, g.P, g.Q);
    src[i] = px < 0 ? nullptr : dy + px * g.K;
  }
  for (int64_t k16 = 0; k16 < w.K16; ++k16) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) {
      const uint16_t* p = src[2 * i] ? src[2 * i] + k16 * 16 : nullptr;
      const uint16_t* q = src[2 * i + 1] ? src[2 * i + 1] + k16 * 16 : nullptr;
      r[i] = pairs(load16(p), load16(q));  // 32-bit lane k: pixels 2i and 2i + 1 of filter k
    }
    if (w.db_part) {
      // The block's float32 sums per filter (for db), lane k of the pairs: its low half is
      // pixel 2i's bfloat16, its high half pixel 2i + 1's.
      const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
      __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
      for (int i = 0; i < 16; ++i) {
        even = _mm512_add_ps(even, _mm512_castsi512_ps(_mm512_slli_epi32(r[i], 16)));
        odd = _mm512_add_ps(odd, _mm512_castsi512_ps(_mm512_and_si512(r[i], high)));
      }
      _mm512_storeu_ps(w.db_part + mb * g.K + k16 * 16, _mm512_add_ps(even, odd));
    }
    transpose16(r);  // r[k]: filter k's 32 pixels
    uint16_t* out = w.dyT + (k16 * w.a.chunk_blocks + b) * 512;
    for (int k = 0; k < 16; ++k) _mm512_store_si512(out + 32 * k, r[k]);
  }
}

/// Pairs per piece of lay_out_x's work.
constexpr int64_t kPairs = 64;

/// Pairs [j0, j1) of the pass's x (pair j is x's grid pair mb0 16 + j) as pixel pairs: copy p,
/// pair j, channels 16 c16.. holds the channels of grid pixels 2j + p and 2j + p + 1 (x's grid
/// starts `lead` pixels before dy's).
void lay_out_x(const Work& w, const uint16_t* x, int64_t j0, int64_t j1) {
  const Geo& g = *w.g;
  const int64_t Jc = w.a.Jc;
  uint16_t* const xv0 = w.xv;
  uint16_t* const xv1 = w.xv + w.C16 * Jc * 32;
  GridWalk walk(2 * (w.mb0 * 16 + j0) - w.a.lead, w.a.Hg, w.a.Wg);
  auto ptr = [&]() {
    const int64_t px = walk.pixel(g.N, g.H, g.W);
    walk.next();
    return px < 0 ? static_cast<const uint16_t*>(nullptr) : x + px * g.C;
  };
  const uint16_t* p0 = ptr();
  for (int64_t j = j0; j < j1; ++j) {
    const uint16_t* p1 = ptr();
    const uint16_t* p2 = ptr();
    for (int64_t c16 = 0; c16 < w.C16; ++c16) {
      const __m512i a = load16(p0 ? p0 + c16 * 16 : nullptr), b = load16(p1 ? p1 + c16 * 16 : nullptr),
                    c = load16(p2 ? p2 + c16 * 16 : nullptr);
      _mm512_store_si512(xv0 + (c16 * Jc + j) * 32, pairs(a, b));
      _mm512_store_si512(xv1 + (c16 * Jc + j) * 32, pairs(b, c));
    }
    p0 = p2;
  }
}

/// Adds the products of the pass's grid blocks for tap t into the accumulator tiles at acc
/// (16 NK filters by 16 NC channels from (16 k16, 16 c16): tile 2 ik + ic at acc + 256 (2 ik +
/// ic), rows of 64 bytes), or sets them (`first`).
template <int NK, int NC>
void tap_block(const Work& w, int64_t k16, int64_t c16, int64_t t, bool first, float* acc) {
  const Geo& g = *w.g;
  const int64_t r = t / g.S, s = t % g.S;
  const int64_t off = w.a.lead + (r - g.pt) * w.a.Wg + (s - g.pl);  // x's grid position past dy's
  const int64_t par = off & 1;
  if (first) {
    _tile_zero(0);
    if constexpr (NC == 2) _tile_zero(1);
    if constexpr (NK == 2) _tile_zero(2);
    if constexpr (NK == 2 && NC == 2) _tile_zero(3);
  } else {
    _tile_loadd(0, acc, 64);
    if constexpr (NC == 2) _tile_loadd(1, acc + 256, 64);
    if constexpr (NK == 2) _tile_loadd(2, acc + 512, 64);
    if constexpr (NK == 2 && NC == 2) _tile_loadd(3, acc + 768, 64);
  }
  const uint16_t* A0 = w.dyT + k16 * w.a.chunk_blocks * 512;
  const uint16_t* A1 = A0 + w.a.chunk_blocks * 512;
  const uint16_t* B0 = w.xv + ((par * w.C16 + c16) * w.a.Jc + (off - par) / 2) * 32;
  const uint16_t* B1 = B0 + w.a.Jc * 32;
  for (int64_t b = 0; b < w.nb; ++b) {
    _tile_loadd(4, A0 + b * 512, 64);
    if constexpr (NK == 2) _tile_loadd(5, A1 + b * 512, 64);
    _tile_loadd(6, B0 + b * 512, 64);  // 16 pairs per block of 32 pixels
    if constexpr (NC == 2) _tile_loadd(7, B1 + b * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NC == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (NK == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (NK == 2 && NC == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, acc, 64);
  if constexpr (NC == 2) _tile_stored(1, acc + 256, 64);
  if constexpr (NK == 2) _tile_stored(2, acc + 512, 64);
  if constexpr (NK == 2 && NC == 2) _tile_stored(3, acc + 768, 64);
}

/// A block of dw that one thread sums over the whole grid: up to 32 filters by 32 channels.
struct Unit {
  int64_t k16, c16;
  int nk, nc;
};

/// dw's units, filters outer.
std::vector<Unit> make_units(const Work& w) {
  std::vector<Unit> units;
  for (int64_t k16 = 0; k16 < w.K16; k16 += 2)
    for (int64_t c16 = 0; c16 < w.C16; c16 += 2)
      units.push_back({k16, c16, static_cast<int>(std::min<int64_t>(2, w.K16 - k16)),
                       static_cast<int>(std::min<int64_t>(2, w.C16 - c16))});
  return units;
}

/// Unit un's products over the pass for every tap, on its accumulators at acc (tap t's at
/// acc + 1024 t), set on the first pass it sums.
void unit_pass(const Work& w, const Unit& un, bool first, float* acc) {
  const int64_t RS = w.g->R * w.g->S;
  for (int64_t t = 0; t < RS; ++t) {
    float* at = acc + t * 1024;
    if (un.nk == 2 && un.nc == 2) tap_block<2, 2>(w, un.k16, un.c16, t, first, at);
    else if (un.nk == 2) tap_block<2, 1>(w, un.k16, un.c16, t, first, at);
    else if (un.nc == 2) tap_block<1, 2>(w, un.k16, un.c16, t, first, at);
    else tap_block<1, 1>(w, un.k16, un.c16, t, first, at);
  }
}

/// Unit un's accumulators at acc into out (KRSC, dw's layout): tile (ik, ic) of tap t holds
/// filters 16 (k16 + ik).. and channels 16 (c16 + ic)..
void unit_store(const Work& w, const Unit& un, const float* acc, float* out) {
  const Geo& g = *w.g;
  const int64_t RS = g.R * g.S, ldd = RS * g.C;
  for (int64_t t = 0; t < RS; ++t)
    for (int ik = 0; ik < un.nk; ++ik)
      for (int ic = 0; ic < un.nc; ++ic) {
        _tile_loadd(0, acc + t * 1024 + 256 * (2 * ik + ic), 64);
        _tile_stored(0, out + ((un.k16 + ik) * 16 * RS + t) * g.C + (un.c16 + ic) * 16, ldd * 4);
      }
}

/// The grid in passes of chunk_blocks blocks: all threads lay out a pass's dy and x (into
/// buffers that stay in the caches), then each sums its units' products over it for every tap.
/// Unit u belongs to thread u mod threads, and sums the passes in order: each dw element has
/// one thread and one order whatever the thread count.
void run_passes(Work& w, const uint16_t* x, const uint16_t* dy) {
  const std::vector<Unit> units = make_units(w);
  const int64_t RS = w.g->R * w.g->S;
  const int64_t n_units = static_cast<int64_t>(units.size());
  const int64_t x_pieces = (w.a.Jc + kPairs - 1) / kPairs;
#pragma omp parallel
  {
    tiles_on();
    const int64_t th = omp_get_thread_num(), nt = omp_get_num_threads();
    for (int64_t mb0 = 0; mb0 < w.MB; mb0 += w.a.chunk_blocks) {
#pragma omp single
      {
        w.mb0 = mb0;
        w.nb = std::min(w.a.chunk_blocks, w.MB - mb0);
      }  // (its barrier: every thread sees the pass)
#pragma omp for schedule(static) nowait
      for (int64_t b = 0; b < w.nb; ++b) lay_out_dy(w, dy, b);
#pragma omp for schedule(static)
      for (int64_t piece = 0; piece < x_pieces; ++piece)
        lay_out_x(w, x, piece * kPairs, std::min(w.a.Jc, (piece + 1) * kPairs));
      for (int64_t u = th; u < n_units; u += nt)
        unit_pass(w, units[static_cast<size_t>(u)], mb0 == 0, w.acc + u * RS * 1024);
#pragma omp barrier
    }
    for (int64_t u = th; u < n_units; u += nt)
      unit_store(w, units[static_cast<size_t>(u)], w.acc + u * RS * 1024, w.dw);
    _tile_release();
  }
}

/// The grid in slabs of whole passes, one thread per slab: the thread lays out each of the
/// slab's passes in its own buffers (its own caches) and sums every unit's products over it,
/// with no barrier between threads; the slab's sums go to its own copy of dw (or dw itself for
/// a single slab), and dw is their float64 sum in slab order after. The slabs depend on the
/// shape only: each dw element has one order of sums whatever the thread count.
void run_slabs(const Work& w0, const uint16_t* x, const uint16_t* dy, const AmxScratch& sc, char* base, int threads) {
  const std::vector<Unit> units = make_units(w0);
  const Geo& g = *w0.g;
  const int64_t RS = g.R * g.S;
  const int64_t n_units = static_cast<int64_t>(units.size());
  const int64_t cb = w0.a.chunk_blocks, passes = w0.a.passes, slabs = w0.a.slabs;
  const int64_t dwn = g.K * RS * g.C;
  float* const partials = reinterpret_cast<float*>(base + sc.partials);
#pragma omp parallel num_threads(threads)
  {
    tiles_on();
    Work w = w0;
    char* mine = base + static_cast<size_t>(omp_get_thread_num()) * sc.thread_bytes;
    w.dyT = reinterpret_cast<uint16_t*>(mine + sc.dy);
    w.xv = reinterpret_cast<uint16_t*>(mine + sc.x);
    w.acc = reinterpret_cast<float*>(mine + sc.acc);
#pragma omp for schedule(dynamic, 1)
    for (int64_t sl = 0; sl < slabs; ++sl) {
      const int64_t p0 = sl * passes / slabs, p1 = (sl + 1) * passes / slabs;
      for (int64_t pass = p0; pass < p1; ++pass) {
        w.mb0 = pass * cb;
        w.nb = std::min(cb, w.MB - w.mb0);
        for (int64_t b = 0; b < w.nb; ++b) lay_out_dy(w, dy, b);
        lay_out_x(w, x, 0, w.a.Jc);
        for (int64_t u = 0; u < n_units; ++u)
          unit_pass(w, units[static_cast<size_t>(u)], pass == p0, w.acc + u * RS * 1024);
      }
      // The slab's sums into its copy of dw (KRSC), or into dw when there is one slab.
      float* out = slabs == 1 ? w.dw : partials + sl * dwn;
      for (int64_t u = 0; u < n_units; ++u) unit_store(w, units[static_cast<size_t>(u)], w.acc + u * RS * 1024, out);
    }  // (the loop's barrier: every slab is in)
    _tile_release();
    if (slabs > 1) {
#pragma omp for schedule(static)
      for (int64_t i0 = 0; i0 < dwn; i0 += 1024) {
        const int64_t i1 = std::min(dwn, i0 + 1024);
        double sum[1024];
        for (int64_t i = i0; i < i1; ++i) sum[i - i0] = partials[i];
        for (int64_t sl = 1; sl < slabs; ++sl) {
          const float* part = partials + sl * dwn;
          for (int64_t i = i0; i < i1; ++i) sum[i - i0] += part[i];
        }
        for (int64_t i = i0; i < i1; ++i) w.dw[i] = static_cast<float>(sum[i - i0]);
      }
    }
  }
}

/// db[k] = the float64 sum, in grid order, of the blocks' float32 sums (db_part [MB][K]); one
/// thread per 16 filters.
void bias_sums(const Work& w, float* db) {
  const int64_t K = w.g->K;
#pragma omp parallel for schedule(static)
  for (int64_t k16 = 0; k16 < w.K16; ++k16) {
    double s[16] = {};
    for (int64_t mb = 0; mb < w.MB; ++mb) {
      const float* part = w.db_part + mb * K + k16 * 16;
      for (int k = 0; k < 16; ++k) s[k] += part[k];
    }
    for (int k = 0; k < 16; ++k) db[k16 * 16 + k] = static_cast<float>(s[k]);
  }
}

}  // namespace

void conv_wgrad_amx(const Geo& g, const uint16_t* x, const uint16_t* dy, float* dw, float* db, void* scratch,
                    int threads, AmxSplit split) {
  Work w;
  w.g = &g;
  w.a = conv_wgrad_amx_grid(g);
  w.MB = w.a.Gm / 32, w.K16 = g.K / 16, w.C16 = g.C / 16;
  const AmxScratch sc = conv_wgrad_amx_scratch(g, threads, split);
  char* base = static_cast<char*>(scratch);
  w.db_part = db ? reinterpret_cast<float*>(base + sc.db) : nullptr;
  w.dw = dw;
  if (split == AmxSplit::Slabs) {
    run_slabs(w, x, dy, sc, base, threads);
  } else {
    w.dyT = reinterpret_cast<uint16_t*>(base + sc.dy);
    w.xv = reinterpret_cast<uint16_t*>(base + sc.x);
    w.acc = reinterpret_cast<float*>(base + sc.acc);
    run_passes(w, x, dy);
  }
  if (db) bias_sums(w, db);
}

}  // namespace mpx::cpu
