// SPDX-License-Identifier: MIT
// FNV-1a, the one hash of mpx's own keys: the plan caches of both backends
// (backend/plan_key.h) and the per-parameter seeds of the initial weights (nn/model.cpp).
#pragma once

#include <cstdint>
#include <string_view>

namespace mpx {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ULL;
inline constexpr uint64_t kFnv1aPrime = 1099511628211ULL;

/// One FNV-1a step: `x` (a byte, or a whole 64-bit word) mixed into the hash `h`.
constexpr uint64_t fnv1a_mix(uint64_t h, uint64_t x) { return (h ^ x) * kFnv1aPrime; }

/// FNV-1a of the bytes of `s`.
constexpr uint64_t fnv1a(std::string_view s) {
  uint64_t h = kFnv1aOffset;
  for (char ch : s) h = fnv1a_mix(h, static_cast<unsigned char>(ch));
  return h;
}

}  // namespace mpx
