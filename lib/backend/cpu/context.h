// SPDX-License-Identifier: MIT
// Shared state and helpers of the CPU backend's op files (namespace mpx::cpu):
// the scratch arena (float32 copies of 16-bit operands, grown once per shape and
// then reused, so a steady-state step allocates nothing), the oneDNN engine and
// stream, the plan cache keyed by op+shape+dtype, and block-wise load/store
// between 16-bit tensors and float32.
#pragma once

#include <dnnl.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <unordered_map>

#include "backend/device_info.h"
#include "backend/plan_key.h"
#include "backend/cpu/switches.h"
#include "core/half.h"
#include "core/env.h"
#include "core/tensor.h"

namespace mpx::cpu {

/// Scratch slots: one float32 buffer each, grown to the largest request and kept.
enum Slot : int { kSlotX, kSlotW, kSlotB, kSlotY, kSlotDY, kSlotDX, kSlotDW, kSlotDB, kSlotTmp0, kSlotTmp1, kSlotCount };


/// Base class of cached plans (oneDNN primitives with their memory objects).
struct Plan {
  virtual ~Plan() = default;
  std::string what;  // the op and its shapes (dnnl_try)
  std::string impl;  // oneDNN's implementation name; empty where the plan runs mpx's loops
};

/// "oneDNN X.Y.Z (commit H; path of the loaded library)" (dnnl_info.cpp).
std::string dnnl_description();

class Context {
 public:
  /// on_alloc(+bytes) / on_free(bytes) feed the backend's memory accounting.
  Context(std::function<void(size_t)> on_alloc, std::function<void(size_t)> on_free);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// A float32 buffer of at least n elements (64-byte aligned), valid until the next request of the slot.
  float* scratch(Slot slot, size_t n);
  /// The same memory seen as doubles (n doubles).
  double* scratch_f64(Slot slot, size_t n) { return reinterpret_cast<double*>(scratch(slot, 2 * n)); }

  dnnl::engine& engine() { return engine_; }
  dnnl::stream& stream() { return stream_; }

  /// The cached plan of `key`, or a new one from make() (then cached).
  template <typename T, typename Make>
  T& plan(const PlanKey& key, Make&& make) {
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      it = plans_.emplace(key, std::unique_ptr<Plan>(make())).first;
      if (!it->second->impl.empty()) note_kernel(it->second->what, it->second->impl);
    }
    return static_cast<T&>(*it->second);
  }
  /// The oneDNN kernels of the plans made so far (one per distinct op and implementation).
  const std::vector<std::pair<std::string, std::string>>& kernels() const { return kernels_; }
  /// Records the kernel of op `what`; a later note for the same op replaces the earlier one.
  void note_kernel(const std::string& what, const std::string& impl) {
    for (auto& k : kernels_)
      if (k.first == what) {
        k.second = impl;
        return;
      }
    kernels_.emplace_back(what, impl);
  }
  size_t plan_count() const { return plans_.size(); }
  /// Records that op `key` (one op and shape) ran with 16-bit operands of dtype t, on
  /// oneDNN's native 16-bit kernel or widened to float32 (native16.h); counted per dtype.
  void note_math16(DType t, const PlanKey& key, bool native) {
    auto& m = t == DType::BF16 ? math16_[0] : math16_[1];
    m[key] = native;
  }
  /// The ops of dtype t noted so far: {native, widened}.
  std::pair<int, int> math16_count(DType t) const {
    std::pair<int, int> c{0, 0};
    for (const auto& [k, native] : t == DType::BF16 ? math16_[0] : math16_[1]) (native ? c.first : c.second) += 1;
    return c;
  }
  /// cpu.winograd of the run (BackendOptions); MPX_CONV_WINOGRAD, when set, takes its place.
  WinogradMode winograd = WinogradMode::Auto;
  /// Counts memory that plans own (oneDNN scratchpads) in the backend's accounting.
  void account(size_t bytes) {
    plan_bytes_ += bytes;
    on_alloc_(bytes);
  }

 private:
  struct Block {
    float* p = nullptr;
    size_t n = 0;
  };
  std::array<Block, kSlotCount> slots_{};
  std::function<void(size_t)> on_alloc_, on_free_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans_;
  size_t plan_bytes_ = 0;
  std::vector<std::pair<std::string, std::string>> kernels_;
  std::array<std::unordered_map<PlanKey, bool, PlanKeyHash>, 2> math16_;  // bf16, f16
};

// ---- float32 views of tensors ---------------------------------------------------

/// Elementwise work is split into blocks of this many elements (fits L1/L2 with room).
constexpr int64_t kBlock = 4096;

/// Converts n elements in parallel (blocks of 64Ki elements).
void parallel_convert(const void* src, DType st, void* dst, DType dt, int64_t n);

/// A float32 pointer to t's data: t itself when it is float32, else a scratch copy.
const float* f32_in(Context& ctx, Slot slot, const Tensor& t);
/// Where to write float32 results for t: t itself when float32, else scratch.
float* f32_out(Context& ctx, Slot slot, const Tensor& t);
/// Rounds the float32 results of f32_out() into t (no-op when t is float32).
void f32_commit(const float* f, const Tensor& t);

/// Element offset pointer.
inline void* elem_ptr(const Tensor& t, int64_t i) {
  return static_cast<char*>(t.data) + static_cast<size_t>(i) * dtype_size(t.dtype);
}

/// Block-wise helpers for elementwise kernels: load n floats from t at element off
/// (returns a pointer into t when float32, else converts into buf).
inline const float* load_block(const Tensor& t, int64_t off, int64_t n, float* buf) {
  if (t.dtype == DType::F32) return t.as<const float>() + off;
  convert(elem_ptr(t, off), t.dtype, buf, DType::F32, static_cast<size_t>(n));
  return buf;
}
/// Destination of n floats for t at off: t itself when float32, else buf (then store_block).
inline float* out_block(const Tensor& t, int64_t off, float* buf) {
  return t.dtype == DType::F32 ? t.as<float>() + off : buf;
}
inline void store_block(const float* src, const Tensor& t, int64_t off, int64_t n) {
  if (t.dtype != DType::F32) convert(src, DType::F32, elem_ptr(t, off), t.dtype, static_cast<size_t>(n));
}

/// Runs f(off, n) over [0, total) in blocks of kBlock, in parallel.
template <typename F>
void for_blocks(int64_t total, F&& f) {
  const int64_t nb = (total + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (nb > 1)
  for (int64_t b = 0; b < nb; ++b) f(b * kBlock, std::min(kBlock, total - b * kBlock));
}

}  // namespace mpx::cpu
