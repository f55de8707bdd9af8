// SPDX-License-Identifier: MIT
// Gradient synchronisation across data-parallel ranks (docs/distributed.md):
// the buckets of the flat gradient arena and the one all-reduce per step, either
// blocking after the backward pass or overlapped with it (each bucket leaves as
// soon as the model's grad-ready hook says its layers are final).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "dist/communicator.h"
#include "nn/model.h"

namespace mpx {

/**
 * @brief Groups the gradient ranges of one backward pass into buckets for the
 * all-reduce (PyTorch DDP's bucket_cap, reversed: a floor): each bucket is a
 * contiguous range of the arena made of consecutive ranges of `ready_order`, closed
 * as soon as it holds at least `min_bytes` (float32), or earlier where the next
 * range is not adjacent to it (a residual block's projection, the layer before such
 * a block) and at the end. Buckets are listed in the order they become complete and
 * together cover every range exactly once.
 *
 * Use: `GradBuckets b(model.grad_ready_ranges(), 4 << 20);
 *       model.set_grad_ready_hook(b.hook([&](int index, const GradRange& r) { ... start its all-reduce ... }));`
 * The callback runs inside backward() when the last range of bucket `index` arrives;
 * the state resets itself after the last bucket, ready for the next backward().
 */
class GradBuckets {
 public:
  GradBuckets(const std::vector<GradRange>& ready_order, size_t min_bytes);
  const std::vector<GradRange>& buckets() const { return buckets_; }
  /// Feeds one hook call; returns the index of the bucket it completes, or -1. Throws
  /// mpx::Error when the range is not the one expected next (the model changed).
  int on_ready(int64_t offset, int64_t count);
  /// A hook for Model::set_grad_ready_hook that calls `on_bucket` for every completed bucket.
  /// The hook refers to this object, which must outlive its use.
  std::function<void(int64_t, int64_t)> hook(std::function<void(int index, const GradRange& bucket)> on_bucket);
  /// Forgets a partly seen pass (after a backward() that threw).
  void reset() { next_ = 0; }

 private:
  std::vector<GradRange> order_, buckets_;
  std::vector<int> last_of_bucket_;  // per range of order_: the bucket it completes, or -1
  size_t next_ = 0;
};

/**
 * @brief The gradient all-reduce of one model: with one rank it does nothing.
 *
 * Paths: NCCL on the GPU's arena (`device_comm`); MPI on the CPU's arena; GPU
 * gradients through host memory and MPI where there is no NCCL. Overlap
 * (dist.overlap_allreduce; auto = on with NCCL, off on the CPU where it does not
 * pay): buckets of at least dist.bucket_bytes start from the grad-ready hook during
 * backward() and reduce() waits for them. Gradients are summed still loss-scaled.
 */
class GradSync {
 public:
  GradSync(Backend& be, Model& model, Communicator* comm, Communicator* device_comm, const DistConfig& cfg);
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  int world_size() const { return world_; }
  /// How the arena is all-reduced ("" with one rank), and how it overlaps ("" when not).
  std::string path() const;
  const std::string& overlap_description() const { return overlap_what_; }

  /// Debug hook (MPX_DEBUG_INJECT_INF): `fn` runs once per step on this rank's arena
  /// before any of it leaves (inside backward() under overlap, else in reduce()).
  void set_before_send(std::function<void()> fn) { before_send_ = std::move(fn); }
  /// The step whose gradients follow (the before-send hook is armed once per step).
  void begin_step() { armed_ = true; }
  /// Sums the gradient arena over the ranks (waits for the buckets under overlap).
  void reduce();

 private:
  void fire_before_send();

  Backend& be_;
  Model& model_;
  Communicator* comm_;
  Communicator* device_comm_;
  int world_;
  bool host_grads_;
  std::unique_ptr<GradBuckets> buckets_;
  Communicator* overlap_comm_ = nullptr;
  std::vector<Communicator::Handle> inflight_;
  std::vector<float> staging_;
  std::string overlap_what_;
  std::function<void()> before_send_;
  bool armed_ = false;
};

}  // namespace mpx
