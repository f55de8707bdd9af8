// SPDX-License-Identifier: MIT
// How conv.cpp picks a cuDNN algorithm, in plain C++ (no CUDA headers) so the CPU tests
// check it: which of cuDNN's ranked candidates are usable, and the process-wide cache of
// choices that makes every backend of a process (and every run of a config, under
// cuda.conv_algo: heuristic) use the same algorithm for the same shape. docs/gpu.md,
// "Choosing convolution algorithms".
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace mpx::cuda {

/// One entry of cuDNN's ranked list (cudnnConvolution*AlgoPerf_t), reduced to what the choice reads.
struct AlgoCandidate {
  int algo = 0;
  bool ok = false;             // status == CUDNN_STATUS_SUCCESS
  size_t memory = 0;           // workspace bytes
  bool deterministic = false;  // determinism == CUDNN_DETERMINISTIC
  bool tensor_op = false;      // mathType is a Tensor Core math (TF32 for float32 operands)
  int math = 0;                // the cudnnMathType_t
};

/// The candidates to try, best first: those that succeeded, fit `budget`, use no Tensor Core
/// math on float32 operands (no TF32: float32 stays float32), and, when `deterministic_only`
/// (cuda.deterministic), are deterministic. cuDNN's order is kept.
inline std::vector<AlgoCandidate> usable_candidates(const std::vector<AlgoCandidate>& ranked, bool float32,
                                                    size_t budget, bool deterministic_only) {
  std::vector<AlgoCandidate> out;
  for (const AlgoCandidate& c : ranked) {
    if (!c.ok || c.memory > budget) continue;
    if (float32 && c.tensor_op) continue;
    if (deterministic_only && !c.deterministic) continue;
    out.push_back(c);
  }
  return out;
}

/// An algorithm chosen for one (op, shape, dtype, alignment, settings).
struct AlgoChoice {
  int algo = 0;
  int math = 0;
  size_t workspace = 0;
  bool deterministic = false;
};

/// Process-wide, thread-safe cache of AlgoChoice by key. make() runs once per key (under the
/// lock, so two backends never measure the same shape at once); a make() that throws caches nothing.
class AlgoCache {
 public:
  using Key = std::vector<int64_t>;

  static AlgoCache& process() {
    static AlgoCache cache;
    return cache;
  }

  template <typename Make>
  AlgoChoice get(const Key& key, Make&& make, bool* made = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = choices_.find(key);
    if (made) *made = it == choices_.end();
    if (it != choices_.end()) return it->second;
    const AlgoChoice c = make();
    choices_.emplace(key, c);
    return c;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return choices_.size();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    choices_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::map<Key, AlgoChoice> choices_;
};

/// The part of a cache key that is not the shape: how the algorithm is chosen.
struct AlgoSettings {
  bool search = false;         // cuda.conv_algo: search (measure) or heuristic (cuDNN's _v7 ranking)
  bool deterministic = false;  // cuda.deterministic
  size_t budget = 0;           // workspace bytes (cuda.workspace_mb)
};

/// The cache key: device, the op's own key values, then the settings.
inline AlgoCache::Key algo_key(int device, const int64_t* op_key, int n, const AlgoSettings& s) {
  AlgoCache::Key k;
  k.reserve(static_cast<size_t>(n) + 4);
  k.push_back(device);
  k.insert(k.end(), op_key, op_key + n);
  k.push_back(s.search ? 1 : 0);
  k.push_back(s.deterministic ? 1 : 0);
  k.push_back(static_cast<int64_t>(s.budget));
  return k;
}

}  // namespace mpx::cuda
