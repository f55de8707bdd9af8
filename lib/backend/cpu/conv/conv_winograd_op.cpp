// SPDX-License-Identifier: MIT
// Where the CPU backend's convolutions run Winograd (docs/cpu-performance.md, "Winograd
// convolution"): MPX_CONV_WINOGRAD, the fixed shape rule, and the calls with the Context's
// scratch. The rule depends only on the shape and the ISA, so every process on the same
// machine (a run and its resume) picks the same kernel and computes the same bits.
#include <omp.h>

#include <optional>
#include <string>

#include <fmt/format.h>

#include "backend/cpu/context.h"
#include "backend/cpu/conv/conv_wgrad.h"
#include "backend/cpu/conv/conv_winograd.h"
#include "core/env.h"
#include "core/error.h"

namespace mpx::cpu {

namespace {

using conv_detail::Geo;

// MPX_CONV_WINOGRAD: off (oneDNN's direct kernels), auto (the shape rule), on (F(4x4,3x3)
// wherever it applies), f2 (F(2x2,3x3) wherever it applies). When set, it takes the place
// of the config's cpu.winograd (`configured`); unset, the config decides.
WinogradMode wino_mode(WinogradMode configured) {
  static const std::optional<WinogradMode> env = []() -> std::optional<WinogradMode> {
    const std::string v = env_string("MPX_CONV_WINOGRAD");
    if (v.empty()) return std::nullopt;
    if (v == "auto") return WinogradMode::Auto;
    if (v == "off") return WinogradMode::Off;
    if (v == "on" || v == "f4") return WinogradMode::F4;
    if (v == "f2") return WinogradMode::F2;
    throw ConfigError("environment variable MPX_CONV_WINOGRAD='" + v +
                      "': expected off, auto, on or f2 (or unset it)");
  }();
  return env ? *env : configured;
}

/// 3x3, stride 1, padding 0..2 on each side: what the kernel computes (forward and
/// backward-data, whose padding is 2 minus the forward one).
bool applies(const Conv2dParams& p, const Geo& g) {
  auto pad_ok = [](int v) { return v >= 0 && v <= 2; };
  return g.R == 3 && g.S == 3 && p.stride_h == 1 && p.stride_w == 1 && pad_ok(p.pad_top) && pad_ok(p.pad_left) &&
         pad_ok(p.pad_bottom) && pad_ok(p.pad_right) && g.P > 0 && g.Q > 0;
}

/// The default rule, from single-thread measurements against oneDNN's direct kernels
/// (docs/cpu-performance.md, "Winograd convolution"): 16+ channels in and out (with 8 it
/// lost or tied), and outputs of at least 4x4 pixels with AVX2 (won at 4x4 and 6x6 in every
/// pass); with AVX-512 at least 8x8 for forward and backward-data (they tied or lost at 4x4
/// and 6x6) and 4x4 for the weight gradient (won at both). Not measured on CPUs without AVX2:
/// off there.
bool rule(const Geo& g, bool wgrad) {
  const std::string isa = winograd_isa();
  const int64_t min_side = isa == "avx512" ? (wgrad ? 4 : 8) : isa == "avx2" ? 4 : -1;
  return min_side > 0 && g.C >= 16 && g.K >= 16 && g.P >= min_side && g.Q >= min_side;
}

enum WinoOp : int64_t { kWinoFwd = 105, kWinoBwdData = 106, kWinoBwdFilter = 107 };

struct WinoNoted : Plan {};

std::string what(const char* op, const Geo& g) {
  return fmt::format("{} for x [{}, {}, {}, {}], w [{}, {}, {}, {}]", op, g.N, g.H, g.W, g.C, g.K, g.R, g.S, g.C);
}

/// Records the kernel once per op and shape in the Context's kernel list (mpx bench).
void note(Context& ctx, WinoOp op, const Conv2dParams& p, const Geo& g, int m, DType io) {
  PlanKey k;
  k << op << g.N << g.H << g.W << g.C << g.K << p.pad_top << p.pad_left << p.pad_bottom << p.pad_right << m
    << static_cast<int64_t>(io);
  ctx.plan<WinoNoted>(k, [&] {
    const char* name = op == kWinoFwd       ? "convolution forward"
                       : op == kWinoBwdData ? "convolution backward data"
                                            : "convolution backward weights";
    ctx.note_kernel(what(name, g), fmt::format("winograd:F({}x{},3x3) {} + sgemm{}", m, m, winograd_isa(),
                                               is_16bit(io) ? fmt::format(", {} in the transforms", dtype_name(io))
                                                            : std::string()));
    return new WinoNoted;
  });
}

WinoGeo with_block(WinoGeo wg) {
  wg.tiles_per_block = winograd_tiles_per_block(wg);
  return wg;
}

}  // namespace

int winograd_tile(const Conv2dParams& p, const Geo& g, bool wgrad, WinogradMode configured) {
  const WinogradMode mode = wino_mode(configured);
  if (mode == WinogradMode::Off || !applies(p, g)) return 0;
  if (mode == WinogradMode::F4) return 4;
  if (mode == WinogradMode::F2) return 2;
  return rule(g, wgrad) ? 4 : 0;
}

bool winograd_forward(Context& ctx, const Conv2dParams& p, const Geo& g, const void* x, const float* w,
                      const float* b, bool relu, void* y, DType io) {
  const int m = winograd_tile(p, g, false, ctx.winograd);
  if (m == 0) return false;
  note(ctx, kWinoFwd, p, g, m, io);
  const WinoGeo wg = with_block({g.N, g.H, g.W, g.C, g.P, g.Q, g.K, p.pad_top, p.pad_left, m, 0});
  float* u = ctx.scratch(kSlotTmp1, winograd_weight_floats(wg));
  winograd_weights(wg, w, false, u);
  float* scratch = ctx.scratch(kSlotTmp0, winograd_scratch(wg, omp_get_max_threads()));
  conv_winograd(wg, x, u, b, relu, y, scratch, io);
  return true;
}

bool winograd_backward_filter(Context& ctx, const Conv2dParams& p, const Geo& g, const void* x, const void* dy,
                              float* dw, float* db, DType io) {
  const int m = wgrad_mode() == WgradMode::Gemm ? 0 : winograd_tile(p, g, true, ctx.winograd);
  if (m == 0) return false;
  note(ctx, kWinoBwdFilter, p, g, m, io);
  const WinoGeo wg = with_block({g.N, g.H, g.W, g.C, g.P, g.Q, g.K, p.pad_top, p.pad_left, m, 0});
  float* scratch = ctx.scratch(kSlotTmp0, winograd_wgrad_scratch(wg, omp_get_max_threads()));
  conv_winograd_wgrad(wg, x, dy, dw, db, scratch, io);
  return true;
}

bool winograd_backward_data(Context& ctx, const Conv2dParams& p, const Geo& g, const void* dy, const float* w,
                            void* dx, DType io) {
  const int m = winograd_tile(p, g, false, ctx.winograd);
  if (m == 0) return false;
  note(ctx, kWinoBwdData, p, g, m, io);
  // dx = dy convolved with w turned by 180 degrees, K in and C out, padding 2 - the forward's.
  const WinoGeo wg = with_block({g.N, g.P, g.Q, g.K, g.H, g.W, g.C, 2 - p.pad_top, 2 - p.pad_left, m, 0});
  float* u = ctx.scratch(kSlotTmp1, winograd_weight_floats(wg));
  winograd_weights(wg, w, true, u);
  float* scratch = ctx.scratch(kSlotTmp0, winograd_scratch(wg, omp_get_max_threads()));
  conv_winograd(wg, dy, u, nullptr, false, dx, scratch, io);
  return true;
}

}  // namespace mpx::cpu
