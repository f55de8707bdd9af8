// SPDX-License-Identifier: MIT
// The CPU backend's environment switches (switches.h; docs/environment.md).
#include "backend/cpu/switches.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "core/env.h"
#include "core/error.h"

namespace mpx::cpu {

namespace {
/// The value that environment variable `name` names among `choices` (the text "" stands for
/// unset), else a ConfigError (exit 2) naming the variable, its value and `expected`.
template <class T>
T env_choice(const char* name, std::initializer_list<std::pair<const char*, T>> choices, const char* expected) {
  const std::string v = env_string(name);
  for (const auto& [text, value] : choices)
    if (v == text) return value;
  throw ConfigError(std::string("environment variable ") + name + "='" + v + "': expected " + expected +
                    " (or unset it)");
}
}  // namespace

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
  static const WgradMode m = env_choice<WgradMode>(
      "MPX_CONV_WGRAD",
      {{"", WgradMode::Default}, {"onednn", WgradMode::OneDnn}, {"auto", WgradMode::Auto}, {"gemm", WgradMode::Gemm}},
      "onednn, auto or gemm");
  return m;
}

AmxWgradSplit amx_wgrad_split() {
  static const AmxWgradSplit m = env_choice<AmxWgradSplit>(
      "MPX_AMX_WGRAD_SPLIT",
      {{"", AmxWgradSplit::Auto}, {"auto", AmxWgradSplit::Auto}, {"slabs", AmxWgradSplit::Slabs},
       {"passes", AmxWgradSplit::Passes}},
      "auto, slabs or passes");
  return m;
}

bool conv_fwd_small_enabled() {
  static const bool on =
      env_choice<bool>("MPX_CONV_FORWARD", {{"", true}, {"auto", true}, {"onednn", false}}, "auto or onednn");
  return on;
}

namespace {
enum class DenseFew { Auto, Split, OneDnn };
DenseFew dense_few_mode() {
  static const DenseFew m = env_choice<DenseFew>(
      "MPX_DENSE_FEW",
      {{"", DenseFew::Auto}, {"auto", DenseFew::Auto}, {"split", DenseFew::Split}, {"onednn", DenseFew::OneDnn}},
      "auto, split or onednn");
  return m;
}
}  // namespace

bool dense_few_enabled() { return dense_few_mode() != DenseFew::OneDnn; }
bool dense_few_fused() { return dense_few_mode() == DenseFew::Auto; }

PiecesMode pieces_mode() {
  return env_choice<PiecesMode>(
      "MPX_CPU_PIECES",
      {{"", PiecesMode::Auto}, {"auto", PiecesMode::Auto}, {"off", PiecesMode::Off}, {"on", PiecesMode::On}},
      "auto, off or on");
}

std::optional<WinogradMode> winograd_forced() {
  static const std::optional<WinogradMode> env = env_choice<std::optional<WinogradMode>>(
      "MPX_CONV_WINOGRAD",
      {{"", std::nullopt},
       {"auto", WinogradMode::Auto},
       {"off", WinogradMode::Off},
       {"on", WinogradMode::F4},
       {"f4", WinogradMode::F4},
       {"f2", WinogradMode::F2}},
      "off, auto, on or f2");
  return env;
}

Math16Mode math16_mode() {
  static const Math16Mode m = env_choice<Math16Mode>(
      "MPX_CPU_16BIT",
      {{"", Math16Mode::Auto},
       {"auto", Math16Mode::Auto},
       {"native", Math16Mode::Native},
       {"widen", Math16Mode::Widen}},
      "auto, native or widen");
  return m;
}

bool pool_baseline() { return env_flag("MPX_CPU_BASELINE"); }

bool pool_capped_avx2() { return env_string("MPX_CPU_POOL_ISA") == "avx2"; }

}  // namespace mpx::cpu
