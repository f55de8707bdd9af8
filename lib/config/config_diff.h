// SPDX-License-Identifier: MIT
// Key-by-key differences of two resolved configs: what `mpx train --resume`
// compares with the run's own config.yaml (README, "Resuming a run").
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace mpx {

/// One key whose value differs between two configs: its path ("optimizer.learning_rate",
/// "model.layers[2].units") and both values as YAML text ("~" where a key is unset).
struct ConfigDifference {
  std::string key, a, b;
};

/// @brief Every key whose resolved value differs between `a` and `b`, in schema order.
std::vector<ConfigDifference> config_differences(const Config& a, const Config& b);

}  // namespace mpx
