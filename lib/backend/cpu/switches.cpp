// SPDX-License-Identifier: MIT
// The CPU backend's environment switches (switches.h; docs/environment.md).
#include "backend/cpu/switches.h"

#include <string>

#include "core/env.h"
#include "core/error.h"

namespace mpx::cpu {

bool reference_loops() {
  static const bool v = env_flag("MPX_CPU_REFERENCE");
  return v;
}

bool profiling() {
  static const bool v = env_flag("MPX_CPU_PROFILE");
  return v;
}

int conv_blocked_forced() {
  static const int v = env_string("MPX_CONV_BLOCKED").empty() ? -1 : env_flag("MPX_CONV_BLOCKED") ? 1 : 0;
  return v;
}

WgradMode wgrad_mode() {
  static const WgradMode m = [] {
    const std::string v = env_string("MPX_CONV_WGRAD");
    if (v.empty()) return WgradMode::Default;
    if (v == "onednn") return WgradMode::OneDnn;
    if (v == "auto") return WgradMode::Auto;
    if (v == "gemm") return WgradMode::Gemm;
    throw ConfigError("environment variable MPX_CONV_WGRAD='" + v + "': expected onednn, auto or gemm (or unset it)");
  }();
  return m;
}

AmxWgradSplit amx_wgrad_split() {
  static const AmxWgradSplit m = [] {
    const std::string v = env_string("MPX_AMX_WGRAD_SPLIT");
    if (v.empty() || v == "auto") return AmxWgradSplit::Auto;
    if (v == "slabs") return AmxWgradSplit::Slabs;
    if (v == "passes") return AmxWgradSplit::Passes;
    throw ConfigError("environment variable MPX_AMX_WGRAD_SPLIT='" + v +
                      "': expected auto, slabs or passes (or unset it)");
  }();
  return m;
}

bool conv_fwd_small_enabled() {
  static const bool on = [] {
    const std::string v = env_string("MPX_CONV_FORWARD");
    if (v.empty() || v == "auto") return true;
    if (v == "onednn") return false;
    throw ConfigError("environment variable MPX_CONV_FORWARD='" + v + "': expected auto or onednn (or unset it)");
  }();
  return on;
}

namespace {
enum class DenseFew { Auto, Split, OneDnn };
DenseFew dense_few_mode() {
  static const DenseFew m = [] {
    const std::string v = env_string("MPX_DENSE_FEW");
    if (v.empty() || v == "auto") return DenseFew::Auto;
    if (v == "split") return DenseFew::Split;
    if (v == "onednn") return DenseFew::OneDnn;
    throw ConfigError("environment variable MPX_DENSE_FEW='" + v +
                      "': expected auto, split or onednn (or unset it)");
  }();
  return m;
}
}  // namespace

bool dense_few_enabled() { return dense_few_mode() != DenseFew::OneDnn; }
bool dense_few_fused() { return dense_few_mode() == DenseFew::Auto; }

std::optional<WinogradMode> winograd_forced() {
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
  return env;
}

Math16Mode math16_mode() {
  static const Math16Mode m = [] {
    const std::string s = env_string("MPX_CPU_16BIT");
    if (s.empty() || s == "auto") return Math16Mode::Auto;
    if (s == "native") return Math16Mode::Native;
    if (s == "widen") return Math16Mode::Widen;
    throw ConfigError("environment variable MPX_CPU_16BIT='" + s + "': expected auto, native or widen (or unset it)");
  }();
  return m;
}

bool pool_baseline() { return env_flag("MPX_CPU_BASELINE"); }

bool pool_capped_avx2() { return env_string("MPX_CPU_POOL_ISA") == "avx2"; }

}  // namespace mpx::cpu
