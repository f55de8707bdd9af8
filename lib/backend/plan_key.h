// SPDX-License-Identifier: MIT
// The key of a cached plan, shared by the CPU backend (oneDNN primitives, mpx's own
// kernels) and the CUDA backend (cuDNN algorithms, cuBLASLt matmuls): an op id, the dtypes
// and every dimension that shapes the plan, as up to 32 integers, and its hash.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/fnv1a.h"
#include "core/tensor.h"

namespace mpx {

struct PlanKey {
  std::array<int64_t, 32> v{};
  int n = 0;
  PlanKey& operator<<(int64_t x) {
    v[static_cast<size_t>(n++)] = x;
    return *this;
  }
  /// The rank, then each dimension.
  PlanKey& operator<<(const Shape& s) {
    *this << s.rank;
    for (int i = 0; i < s.rank; ++i) *this << s[i];
    return *this;
  }
  bool operator==(const PlanKey& o) const { return n == o.n && v == o.v; }
};

/// FNV-1a over the key's integers, one whole word per step.
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = kFnv1aOffset;
    for (int i = 0; i < k.n; ++i) h = fnv1a_mix(h, static_cast<uint64_t>(k.v[static_cast<size_t>(i)]));
    return static_cast<size_t>(h);
  }
};

}  // namespace mpx
