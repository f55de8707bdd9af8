// SPDX-License-Identifier: MIT
// Checkpoints written with another parameter alignment (format version 1 packed the
// arenas; docs/design.md "Checkpoints") moved into the layout of the model that loads
// them, parameter by parameter.
#pragma once

#include <cstdint>
#include <string>

#include "io/checkpoint.h"
#include "nn/model.h"

namespace mpx {

/// Lengths of m's trainable and non-trainable arenas in a layout whose parameters start at
/// multiples of `align` elements (Model::param_alignment() gives m's own lengths).
struct ArenaLengths {
  int64_t params = 0, state = 0;
};
ArenaLengths arena_lengths(const Model& m, int64_t align);

/**
 * @brief `ck` with its master, state and optimizer arenas in m's layout (a copy of `ck`
 * when it already is). Throws ConfigError, naming `path` and both counts, when the
 * arenas cannot be m's (another model).
 */
Checkpoint in_model_layout(const Checkpoint& ck, const Model& m, const std::string& path,
                           const std::string& config_name);

}  // namespace mpx
