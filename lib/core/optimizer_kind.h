// SPDX-License-Identifier: MIT
// The fused optimizers, each declared in this one file: its config name, whether it takes
// Adam's bias-corrected step size from the step count t, and its state arenas (each as long
// as the master arena, in checkpoint order: sections opt1..optN). The config's list of
// names (config/enums.h), the checks of Backend::optimizer_step, the allocation, naming and
// checkpointing of the arenas (train/optimizer.cpp, train/train_state.cpp) all read it; the
// update itself is written in lib/backend/cpu/optimizer/optimizer.cpp and its CUDA twin
// lib/backend/cuda/optimizer.cu. docs/contributing.md "Adding an optimizer" is the recipe.
#pragma once

#include <cstdint>
#include <string_view>

namespace mpx {

/// The most state arenas one optimizer keeps (the CUDA kernels take them by value).
constexpr int kMaxOptimizerArenas = 4;

// One row per optimizer: X(id, "config name", uses Adam's t, arena names...). The arena names
// appear in messages ("optimizer state v", "state2 (adam v) is required").
// clang-format off
#define MPX_OPTIMIZER_ROWS(X)                   \
  X(Sgd, "sgd", false, "momentum")              \
  X(Adam, "adam", true, "m", "v")               \
  X(AdamW, "adamw", true, "m", "v")             \
  X(Amsgrad, "amsgrad", true, "m", "v", "v_hat")  /* Keras Adam(amsgrad=True): v_hat = max(v_hat, v) */
// clang-format on

#define MPX_OPTIMIZER_ID_(id, ...) id,
/// The fused update an optimizer runs (OptimizerStep::Kind; config/enums.h's OptimizerName
/// lists the same names in the same order).
enum class OptimizerKind : uint8_t { MPX_OPTIMIZER_ROWS(MPX_OPTIMIZER_ID_) };
#undef MPX_OPTIMIZER_ID_

struct OptimizerInfo {
  OptimizerKind kind;
  const char* name;
  bool bias_corrected;  // lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t) (Adam)
  const char* arenas[kMaxOptimizerArenas];

  /// How many state arenas it keeps.
  constexpr int num_arenas() const {
    int n = 0;
    while (n < kMaxOptimizerArenas && arenas[n]) ++n;
    return n;
  }
};

#define MPX_OPTIMIZER_INFO_(id, text, bias, ...) OptimizerInfo{OptimizerKind::id, text, bias, {__VA_ARGS__}},
inline constexpr OptimizerInfo kOptimizers[] = {MPX_OPTIMIZER_ROWS(MPX_OPTIMIZER_INFO_)};
#undef MPX_OPTIMIZER_INFO_

/// The row of `k`.
inline const OptimizerInfo& optimizer_info(OptimizerKind k) {
  for (const OptimizerInfo& o : kOptimizers)
    if (o.kind == k) return o;
  return kOptimizers[0];  // unreachable: every kind has its row
}

/// The row named `name` (a config name); nullptr for none.
inline const OptimizerInfo* find_optimizer(std::string_view name) {
  for (const OptimizerInfo& o : kOptimizers)
    if (name == o.name) return &o;
  return nullptr;
}

}  // namespace mpx
