// SPDX-License-Identifier: MIT
// Shared state of the CUDA backend's op files (namespace mpx::cuda): the device,
// its one compute stream, the cuDNN and cuBLASLt handles (created once), the
// grow-once device scratch slots (padded inputs, reduction partials, the shared
// cuDNN/cuBLASLt workspace) and the plan cache keyed by op+shape+dtype
// (llm.c's lookup_cache_or_build_graph_fwd), and the CUDA graphs captured from the
// stream. The twin of cpu/context.h.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/algo_choice.h"
#include "backend/cuda/handles.h"
#include "backend/plan_key.h"
#include "core/tensor.h"

namespace mpx::cuda {

/// Device scratch slots: one buffer each, grown to the largest request (when a plan is
/// built, i.e. in the first step of a shape) and kept, so a steady-state step allocates nothing.
enum Slot : int {
  kSlotPadX,       // explicitly padded conv input (asymmetric padding)
  kSlotPadDX,      // gradient of the padded conv input, cropped into dx
  kSlotPadW,       // conv filter zero-padded in channels (16-bit, C not a multiple of 8)
  kSlotPadDW,      // gradient of the channel-padded filter, cropped into dw
  kSlotGrad16,     // 16-bit weight gradient before its cast to a float32 dw
  kSlotReduce,     // per-block partial sums (double) of channel reductions
  kSlotCoef,       // per-channel coefficients (batch norm)
  kSlotBnGrad,     // batch norm with a fused activation: the gradient before the activation
  kSlotRows,       // per-row results (loss rows, stats partials)
  kSlotWiden,      // a float32 dense layer's 16-bit input (or input gradient) in float32
  kSlotWorkspace,  // the cuDNN / cuBLASLt workspace shared by every plan (one stream)
  kSlotCount
};

/// Base class of cached plans (descriptors, chosen algorithm, workspace size).
struct Plan {
  virtual ~Plan() = default;
};

class Context {
 public:
  /// Selects `device`, creates the stream and handles. on_alloc(+bytes) / on_free(bytes)
  /// feed the backend's memory accounting.
  /// `workspace_budget`: bytes the cuDNN/cuBLASLt workspace may grow to (cuda.workspace_mb).
  Context(int device, size_t workspace_budget, std::function<void(size_t)> on_alloc,
          std::function<void(size_t)> on_free);
  /// Waits for the stream, then frees graphs, plans and scratch; only logs on failure. The
  /// stream, handles and flag word are owning wrappers (handles.h), so a constructor that
  /// throws half-way frees what it had created.
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  const cudaDeviceProp& prop() const { return prop_; }
  int compute_capability() const { return prop_.major * 10 + prop_.minor; }
  cudaStream_t stream() const { return stream_.get(); }
  cudnnHandle_t cudnn() const { return cudnn_.get(); }
  cublasLtHandle_t cublaslt() const { return cublaslt_.get(); }

  /// A device buffer of at least `bytes` for `slot` (256-byte aligned), valid until the next
  /// larger request of the slot. Growing synchronizes the stream and frees the old buffer
  /// (cudaFree); once a graph exists the old buffer is kept instead (a graph may use it) and
  /// freed with the Context. Growing during a graph capture is an error (run the captured
  /// ops once uncaptured first, with the same shapes: the warm-up).
  void* scratch(Slot slot, size_t bytes);
  /// Largest workspace a convolution or matmul algorithm may use (MPX_CUDA_WORKSPACE_MB, default 512).
  size_t workspace_budget() const { return workspace_budget_; }

  /// A device int and its pinned host mirror, for the one 4-byte read back of a fused check.
  int* device_flag() const { return static_cast<int*>(device_flag_.get()); }
  int* host_flag() const { return static_cast<int*>(host_flag_.get()); }

  /// Grid size of a grid-stride loop over n elements with `threads` per block.
  unsigned grid_for(int64_t n, int threads) const;

  /// The cached plan of `key`, or a new one from make() (then cached). Building a plan
  /// (cudnnFind measures, allocates and synchronizes) during a graph capture is an error.
  template <typename T, typename Make>
  T& plan(const PlanKey& key, Make&& make) {
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      if (capturing_) fail_in_capture("a new cuDNN/cuBLASLt plan (an op shape not run before the capture)");
      it = plans_.emplace(key, std::unique_ptr<Plan>(make())).first;
    }
    return static_cast<T&>(*it->second);
  }
  size_t plan_count() const { return plans_.size(); }

  /// How convolution algorithms are chosen (cuda.conv_algo, cuda.deterministic; algo_choice.h).
  void set_conv_algo(bool search, bool deterministic) {
    conv_search_ = search;
    conv_deterministic_ = deterministic;
  }
  AlgoSettings algo_settings() const { return {conv_search_, conv_deterministic_, workspace_budget_}; }
  /// Records a plan as built (Backend::plans(), `mpx bench --json`).
  void note_plan(PlanReport r) { reports_.push_back(std::move(r)); }
  const std::vector<PlanReport>& plan_reports() const { return reports_; }

  // ---- CUDA graphs (Backend::graph_*) ---------------------------------------------
  /// Starts capturing the stream (cudaStreamCaptureModeThreadLocal).
  void begin_capture();
  /// Ends the capture, instantiates the graph and returns its id.
  int end_capture();
  /// Replays graph `id` on the stream.
  void launch_graph(int id);
  /// True between begin_capture and end_capture.
  bool capturing() const { return capturing_; }
  /// Throws Error naming `what` as not allowed during a capture, after ending (and dropping)
  /// the capture so the stream is usable again.
  [[noreturn]] void fail_in_capture(const std::string& what);
  /// Ends an open capture and drops its partial graph, clearing the error state the failed
  /// capture left, so the stream works again; does nothing without a capture. Never throws
  /// (it runs while an exception unwinds: GraphCapture in backend/graph_capture.h).
  void abort_capture() noexcept;

 private:
  struct Block {
    void* p = nullptr;
    size_t bytes = 0;
  };
  int device_ = 0;
  cudaDeviceProp prop_{};
  // Declared before the handles bound to it: members are destroyed in reverse order.
  UniqueStream stream_;
  UniqueCudnn cudnn_;
  UniqueCublasLt cublaslt_;
  UniqueDeviceMemory device_flag_;
  UniqueHostMemory host_flag_;
  size_t workspace_budget_ = 0;
  std::array<Block, kSlotCount> slots_{};
  std::vector<Block> retired_;  // outgrown scratch that a graph may still use
  bool capturing_ = false;
  std::vector<cudaGraphExec_t> graphs_;
  std::function<void(size_t)> on_alloc_, on_free_;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans_;
  bool conv_search_ = false, conv_deterministic_ = false;
  std::vector<PlanReport> reports_;
};

/// cuDNN / cuBLASLt / CUDA data type of a float dtype.
cudnnDataType_t cudnn_dtype(DType t);
cudaDataType_t cuda_dtype(DType t);

/// Largest power of two (<= 256) that divides the address: cuBLASLt plans depend on it.
inline int64_t pointer_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t al = 256;
  while (al > 1 && (a % static_cast<uintptr_t>(al)) != 0) al /= 2;
  return al;
}

}  // namespace mpx::cuda
