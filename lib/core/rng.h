// SPDX-License-Identifier: MIT
// The one random number generator of mpx (xoshiro256**, seeded by splitmix64),
// used for initialization, shuffling and augmentation on the host. Its state is
// four words, saved in checkpoints so that a resumed run continues bit-exactly.
// Device-side randomness (dropout) uses the counter-based hash below instead,
// so the CPU and CUDA backends draw the same mask from (seed, offset).
#pragma once

#include <array>
#include <cstdint>

namespace mpx {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { seed_from(seed); }
  void seed_from(uint64_t seed);
  uint64_t next_u64();
  /// Uniform in [0, 1).
  double uniform();
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  /// Uniform integer in [0, n), n > 0, without modulo bias.
  uint64_t uniform_int(uint64_t n);
  /// Standard normal (Box-Muller, no cached second value so the state is the whole story).
  double normal();

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_{};
};

/// splitmix64 finalizer: a good 64-bit mix of one word.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Counter-based uniform in [0, 1) from (seed, index): same value on every backend.
inline float hash_uniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(mix64(seed ^ mix64(index)) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace mpx
