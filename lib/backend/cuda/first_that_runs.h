// SPDX-License-Identifier: MIT
// The fallback loop of a library heuristic (cuBLASLt's matmul algorithms): the heuristic
// ranks several candidates, the first that actually runs is kept, and only when none
// does is the op refused, with every candidate's reason. Plain C++, so the CPU tests
// check the loop with fake candidates (docs/gpu.md, "Dense layers").
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace mpx::cuda {

/// Calls try_run(candidate) in order until one returns an empty string (it ran); each
/// non-empty return is that candidate's failure reason, appended to `failures`. Returns the
/// index of the candidate that ran, or nullopt when none did.
template <typename C, typename TryRun>
std::optional<size_t> first_that_runs(const std::vector<C>& candidates, TryRun&& try_run,
                                      std::vector<std::string>& failures) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::string why = try_run(candidates[i]);
    if (why.empty()) return i;
    failures.push_back(std::move(why));
  }
  return std::nullopt;
}

/// "<what>: the heuristic offered no algorithm" or "<what>: none of the N algorithms the
/// heuristic offered ran (1: reason; 2: reason ...)".
inline std::string none_ran_message(const std::string& what, const std::vector<std::string>& failures) {
  if (failures.empty()) return what + ": the heuristic offered no algorithm";
  std::string m = what + ": none of the " + std::to_string(failures.size()) + " algorithms the heuristic offered ran (";
  for (size_t i = 0; i < failures.size(); ++i) m += (i ? "; " : "") + std::to_string(i + 1) + ": " + failures[i];
  return m + ")";
}

}  // namespace mpx::cuda
