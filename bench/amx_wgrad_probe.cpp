// SPDX-License-Identifier: MIT
// amx_wgrad_probe: how fast could a weight gradient of mpx's own run on AMX? Times oneDNN's
// bfloat16 weight gradient (brgconv_bwd_w on AMX CPUs) against a plain tdpbf16ps loop over the
// padded-row layout of mpx's GEMM weight gradient (docs/cpu-performance.md, "An AMX weight
// gradient of mpx's own: the probe"), for the 3x3 layers of the fast CIFAR recipe at batch 1024
// and the CIFAR seed net's second layer at batch 256, and checks the two against each other.
// A measurement for a kernel not yet written, not a kernel: the layout passes are scalar loops
// (timed apart), and C and K must be multiples of 32. Prints nothing but a line where the CPU
// has no AMX.
//   build/bench/amx_wgrad_probe [--reps N]
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cpuid.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "backend/backend.h"
#include "core/half.h"

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// AMX-TILE and AMX-BF16 in cpuid, and the kernel's permission to use the tile data.
bool amx_ready() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureTileData = 18;
  return tile && bf16 && syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTileData) == 0;
}

/// Palette 1, tiles 0-7 as 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile"))) void tiles_on() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;
  _tile_loadconfig(&cfg);
}

/// n zeroed elements on 64-byte boundaries: tile rows that straddle cache lines load at half speed.
template <typename T>
struct Aligned {
  explicit Aligned(size_t n) : p(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64))), n(n) {
    std::memset(p, 0, n * sizeof(T));
  }
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  T* p;
  size_t n;
};

struct Layer {
  const char* name;
  int N, H, C, K;
};

/// The probe's loop. Pixels live on a grid of rows W + 1 wide and images H + 1 rows tall (one
/// zero column and one zero row shared between neighbours). dyT [K][G] holds dy transposed on
/// that grid (zeros off the image); xv[p] holds x's grid as VNNI pairs starting at pixel p
/// (p = 0, 1), so that tap (r, s), offset r (W + 1) + s, reads whole pairs whatever its parity.
/// dw [9][K][C] float32 accumulates dy^T x per tap; threads split the 32-filter blocks.
__attribute__((target("amx-tile,amx-bf16"))) void amx_loop(const Layer& l, const uint16_t* dyT, long G, long Gpad,
                                                           uint16_t* const xv[2], float* dw) {
  const int Wr = l.H + 1, KB = l.K / 32, CB = l.C / 32, C = l.C;
  constexpr long kChunk = 512;  // grid pixels per pass over the blocks (dy and x rows stay in cache)
#pragma omp parallel
  {
    tiles_on();
    const int th = omp_get_thread_num(), nt = omp_get_num_threads();
    for (long mc = 0; mc < G; mc += kChunk) {
      const long mend = std::min(mc + kChunk, Gpad);
      for (int kb = th; kb < KB; kb += nt)
        for (int cb = 0; cb < CB; ++cb)
          for (int t = 0; t < 9; ++t) {
            const long off = static_cast<long>(t / 3) * Wr + t % 3;
            const int par = static_cast<int>(off & 1);
            float* d = dw + (static_cast<size_t>(t) * l.K + kb * 32) * C + cb * 32;
            _tile_loadd(0, d, C * 4);
            _tile_loadd(1, d + 16, C * 4);
            _tile_loadd(2, d + 16 * C, C * 4);
            _tile_loadd(3, d + 16 * C + 16, C * 4);
            for (long m = mc; m < mend; m += 32) {
              _tile_loadd(4, dyT + static_cast<size_t>(kb * 32) * Gpad + m, Gpad * 2);
              _tile_loadd(5, dyT + static_cast<size_t>(kb * 32 + 16) * Gpad + m, Gpad * 2);
              const size_t j = static_cast<size_t>((m + off - par) / 2);
              _tile_loadd(6, xv[par] + (j * C + cb * 32) * 2, C * 4);
              _tile_loadd(7, xv[par] + (j * C + cb * 32 + 16) * 2, C * 4);
              _tile_dpbf16ps(0, 4, 6);
              _tile_dpbf16ps(1, 4, 7);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, d, C * 4);
            _tile_stored(1, d + 16, C * 4);
            _tile_stored(2, d + 16 * C, C * 4);
            _tile_stored(3, d + 16 * C + 16, C * 4);
          }
    }
    _tile_release();
  }
}

void probe(const Layer& l, int reps) {
  using namespace dnnl;
  using tag = memory::format_tag;
  using dt = memory::data_type;
  const int H = l.H, W = l.H, Wr = W + 1, Hr = H + 1, C = l.C, K = l.K;
  std::vector<uint16_t> x(static_cast<size_t>(l.N) * H * W * C), dy(static_cast<size_t>(l.N) * H * W * K);
  for (size_t i = 0; i < x.size(); ++i) x[i] = mpx::f32_to_bf16(static_cast<float>(i * 2654435761u % 1000) / 1000.f - 0.5f);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = mpx::f32_to_bf16(static_cast<float>(i * 40503u % 1000) / 1000.f - 0.5f);

  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::dims src_d{l.N, C, H, W}, dst_d{l.N, K, H, W}, w_d{K, C, 3, 3};
  const auto sd = memory::desc(src_d, dt::bf16, tag::nhwc), dd = memory::desc(dst_d, dt::bf16, tag::nhwc);
  const auto hint = convolution_forward::primitive_desc(eng, prop_kind::forward_training, algorithm::convolution_direct,
                                                        sd, memory::desc(w_d, dt::bf16, tag::any), dd, {1, 1}, {1, 1},
                                                        {1, 1});
  const auto pd = convolution_backward_weights::primitive_desc(
      eng, algorithm::convolution_direct, sd, memory::desc(w_d, dt::f32, tag::any), dd, {1, 1}, {1, 1}, {1, 1}, hint);
  memory msrc(sd, eng, x.data()), mdy(dd, eng, dy.data()), mdw(pd.diff_weights_desc(), eng);
  memory mref(memory::desc(w_d, dt::f32, tag::ohwi), eng);
  const auto bwd = convolution_backward_weights(pd);
  double t_dnnl = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = now_ms();
    bwd.execute(s, {{DNNL_ARG_SRC, msrc}, {DNNL_ARG_DIFF_DST, mdy}, {DNNL_ARG_DIFF_WEIGHTS, mdw}});
    s.wait();
    if (r > 0) t_dnnl = std::min(t_dnnl, now_ms() - t0);
  }
  reorder(mdw, mref).execute(s, mdw, mref);
  s.wait();

  const long G = static_cast<long>(l.N) * Hr * Wr, Gpad = (G + Wr + 2 + 63) / 64 * 64 + 64;
  const long Lx = Gpad + 2L * Wr + 68;
  Aligned<uint16_t> dyT(static_cast<size_t>(K) * Gpad), xg(static_cast<size_t>(Lx) * C);
  Aligned<uint16_t> xv0(static_cast<size_t>(Lx / 2 + 2) * C * 2), xv1(xv0.n);
  uint16_t* const xv[2] = {xv0.p, xv1.p};
  Aligned<float> dw(static_cast<size_t>(9) * K * C);
  double t_prep = 1e30, t_loop = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = now_ms();
#pragma omp parallel for schedule(static)
    for (long n = 0; n < l.N; ++n)
      for (int i = 0; i < H; ++i) {
        const long m0 = n * Hr * Wr + static_cast<long>(i) * Wr + 1;  // dy's grid
        const uint16_t* src = &dy[(static_cast<size_t>(n) * H + i) * W * K];
        for (int k0 = 0; k0 < K; k0 += 16)
          for (int j = 0; j < W; ++j)
            for (int k = k0; k < k0 + 16; ++k)
              dyT.p[static_cast<size_t>(k) * Gpad + m0 + j] = src[static_cast<size_t>(j) * K + k];
        const long g0 = Wr + n * Hr * Wr + static_cast<long>(i) * Wr + 2;  // x's grid: dy's + r (W + 1) + s
        std::memcpy(xg.p + static_cast<size_t>(g0) * C, &x[(static_cast<size_t>(n) * H + i) * W * C],
                    static_cast<size_t>(W) * C * 2);
      }
#pragma omp parallel for schedule(static)
    for (long j = 0; j < Lx / 2 - 1; ++j)
      for (int p = 0; p < 2; ++p) {
        const uint16_t* a = xg.p + static_cast<size_t>(2 * j + p) * C;
        uint16_t* o = xv[p] + static_cast<size_t>(j) * C * 2;
        for (int c = 0; c < C; ++c) o[2 * c] = a[c], o[2 * c + 1] = a[C + c];
      }
    const double t1 = now_ms();
    std::memset(dw.p, 0, dw.n * sizeof(float));
    amx_loop(l, dyT.p, G, Gpad, xv, dw.p);
    const double t2 = now_ms();
    if (r > 0) t_prep = std::min(t_prep, t1 - t0), t_loop = std::min(t_loop, t2 - t1);
  }
  const float* ref = static_cast<const float*>(mref.get_data_handle());
  double max_diff = 0, max_ref = 0;
  for (int k = 0; k < K; ++k)
    for (int t = 0; t < 9; ++t)
      for (int c = 0; c < C; ++c) {
        const double a = ref[(static_cast<size_t>(k) * 9 + t) * C + c];
        const double b = dw.p[(static_cast<size_t>(t) * K + k) * C + c];
        max_diff = std::max(max_diff, std::fabs(a - b)), max_ref = std::max(max_ref, std::fabs(a));
      }
  std::printf("%-28s %-26s %7.1f ms | probe loop %7.1f ms (%.2fx), layout passes %6.1f ms, both %.2fx | "
              "max |diff| %.2g of %.3g\n",
              l.name, pd.impl_info_str(), t_dnnl, t_loop, t_dnnl / t_loop, t_prep, t_dnnl / (t_loop + t_prep), max_diff,
              max_ref);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--reps N]\n", argv[0]);
      return 2;
    }
  }
  const std::string cpu = mpx::create_backend("cpu")->info().description;  // model, threads, ISA
  if (!amx_ready()) {
    std::printf("amx_wgrad_probe: %s has no AMX-BF16 (or the kernel refused the tile state): nothing to measure\n",
                cpu.c_str());
    return 0;
  }
  std::printf("amx_wgrad_probe on %s, best of %d: oneDNN's bfloat16 weight gradient against a tdpbf16ps loop "
              "(float32 dw)\n",
              cpu.c_str(), reps);
  const Layer layers[] = {{"fast CIFAR 15x15x64->64", 1024, 15, 64, 64},
                          {"fast CIFAR 15x15x64->256", 1024, 15, 64, 256},
                          {"fast CIFAR 7x7x256->256", 1024, 7, 256, 256},
                          {"CIFAR seed 32x32x64->128", 256, 32, 64, 128}};
  for (const Layer& l : layers) probe(l, reps);
  return 0;
}
