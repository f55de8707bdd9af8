// SPDX-License-Identifier: MIT
// The fallback loop of a library heuristic (cuBLASLt's matmul algorithms): the heuristic
// ranks several candidates, the first that actually runs is kept, and only when none
// does is the op refused, with every candidate's reason; a product with an epilogue that
// finds nothing is planned again without it. Plain C++, so the CPU tests check the loops
// with fake candidates (docs/gpu.md, "Dense layers").
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

/// "<what>: the heuristic failed (<status>)" when `heuristic_error` is set, else "<what>: the
/// heuristic offered no algorithm" or "<what>: none of the N algorithms the heuristic offered
/// ran (1: reason; 2: reason ...)".
inline std::string none_ran_message(const std::string& what, const std::vector<std::string>& failures,
                                    const std::string& heuristic_error = "") {
  if (!heuristic_error.empty()) return what + ": the heuristic failed (" + heuristic_error + ")";
  if (failures.empty()) return what + ": the heuristic offered no algorithm";
  std::string m = what + ": none of the " + std::to_string(failures.size()) + " algorithms the heuristic offered ran (";
  for (size_t i = 0; i < failures.size(); ++i) m += (i ? "; " : "") + std::to_string(i + 1) + ": " + failures[i];
  return m + ")";
}

/// What one attempt at a plan found: the plan (nullptr when nothing ran), each candidate's
/// failure, and the heuristic's own failure (any status but success; empty when it answered).
template <typename Plan>
struct PlanAttempt {
  Plan* plan = nullptr;
  std::vector<std::string> failures;
  std::string heuristic_error;
};

/// The plan of a product that wants an epilogue: attempt(true) first; when it finds nothing
/// (the heuristic failed with whatever status, offered nothing, or none of its candidates
/// ran) attempt(false), the plain product, whose epilogue the caller then runs as a kernel.
/// Returns the attempt that was kept and sets `fused`; its plan is nullptr only when the
/// plain product found nothing either (the caller refuses the op with none_ran_message).
template <typename Plan, typename Attempt>
PlanAttempt<Plan> epilogue_or_plain(bool wants_epilogue, Attempt&& attempt, bool& fused) {
  fused = wants_epilogue;
  PlanAttempt<Plan> a = attempt(wants_epilogue);
  if (a.plan || !wants_epilogue) return a;
  fused = false;
  return attempt(false);
}

}  // namespace mpx::cuda
