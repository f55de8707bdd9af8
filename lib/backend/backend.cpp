// SPDX-License-Identifier: MIT
// The non-virtual half of Backend: Buffer ownership, memory accounting, transfers,
// the step without host synchronisation, staging, graphs and statistics. The
// compute ops are in backend_ops.cpp (from op_table.inc); every public op validates its arguments
// once (backend_checks.h), so the CPU and CUDA implementations (*_impl) never
// repeat it and cannot drift on it.
#include "backend/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/backend_checks.h"
#include "core/error.h"

namespace mpx {

using namespace backend_checks;

// ---- Buffer ------------------------------------------------------------------

Buffer::~Buffer() { reset(); }

Buffer::Buffer(Buffer&& o) noexcept : backend_(o.backend_), ptr_(o.ptr_), bytes_(o.bytes_) {
  o.backend_ = nullptr;
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    backend_ = o.backend_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.backend_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (backend_ && ptr_) {
    backend_->free_impl(ptr_);
    backend_->note_free(bytes_);
  }
  backend_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

Tensor Buffer::view(DType t, Shape s) const {
  const size_t need = static_cast<size_t>(s.numel()) * dtype_size(t);
  MPX_CHECK_MSG(need <= bytes_, fmt::format("view {}{} needs {} bytes, the buffer has {}", dtype_name(t), s.str(),
                                            need, bytes_));
  return Tensor(ptr_, t, s);
}

// ---- accounting --------------------------------------------------------------

void Backend::note_alloc(size_t bytes) {
  mem_.current_bytes += bytes;
  mem_.peak_bytes = std::max(mem_.peak_bytes, mem_.current_bytes);
}

void Backend::note_free(size_t bytes) { mem_.current_bytes -= std::min(bytes, mem_.current_bytes); }

// ---- memory ------------------------------------------------------------------

Buffer Backend::alloc(size_t bytes, const char* what) {
  const size_t n = bytes == 0 ? 64 : bytes;
  void* p = alloc_impl(n);
  if (!p) {
    throw OutOfMemoryError(fmt::format("out of {} memory allocating {} bytes ({:.1f} MiB) for {}: {} MiB in use",
                                       info().name, bytes, bytes / 1048576.0, what ? what : "?",
                                       mem_.current_bytes / 1048576));
  }
  note_alloc(n);
  return Buffer(this, p, n);
}

void Backend::upload(const Tensor& dst, const void* host_src) {
  require_data("upload", "dst", dst);
  MPX_VALIDATE(host_src || dst.numel() == 0, "upload: null host pointer for {}", dst.str());
  if (dst.numel() == 0) return;
  upload_impl(dst.data, host_src, dst.bytes());
}

void Backend::download(void* host_dst, const Tensor& src) {
  require_data("download", "src", src);
  MPX_VALIDATE(host_dst || src.numel() == 0, "download: null host pointer for {}", src.str());
  if (src.numel() == 0) return;
  download_impl(host_dst, src.data, src.bytes());
}

// ---- the step without host synchronisation -------------------------------------

namespace {
void require_step_state(const char* op, const Tensor& state) {
  require_data(op, "state", state);
  MPX_VALIDATE(state.bytes() >= sizeof(StepState), "{}: state {} must hold a StepState ({} bytes)", op,
               state.str(), sizeof(StepState));
  MPX_VALIDATE(reinterpret_cast<uintptr_t>(state.data) % 8 == 0, "{}: state must be 8-byte aligned", op);
}
void require_scalar_f32(const char* op, const char* name, const Tensor& t) {
  require_f32(op, name, t);
  MPX_VALIDATE(t.numel() == 1, "{}: {} {} must be float32 [1]", op, name, t.str());
}
}  // namespace

void Backend::softmax_cross_entropy_scaled(const Tensor& logits, const Tensor& labels, const Tensor& state,
                                           double weight, const Tensor& loss_sum_out, const Tensor& correct_out,
                                           const Tensor& dlogits, float label_smoothing) {
  const char* op = "softmax_cross_entropy_scaled";
  require_step_state(op, state);
  MPX_VALIDATE(std::isfinite(weight) && weight > 0, "{}: weight {} must be positive and finite", op, weight);
  MPX_VALIDATE(!dlogits.empty(), "{}: dlogits is required", op);
  require_softmax_args(op, logits, labels, loss_sum_out, correct_out, dlogits, label_smoothing);
  softmax_cross_entropy_scaled_impl(logits, labels, state, weight, loss_sum_out, correct_out, dlogits,
                                    label_smoothing);
}

void Backend::unscale_and_check_state(const Tensor& grads, const Tensor& loss_sum, const Tensor& state, int world) {
  const char* op = "unscale_and_check_state";
  require_step_state(op, state);
  require_scalar_f32(op, "loss_sum", loss_sum);
  MPX_VALIDATE(world >= 1, "{}: world {} must be >= 1", op, world);
  if (!grads.empty()) require_f32(op, "grads", grads);
  unscale_and_check_state_impl(grads, loss_sum, state, world);
}

void Backend::optimizer_step_state(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                                   const std::vector<Tensor>& states, const Tensor& compute_copy,
                                   const Tensor& state, const Tensor& lr_dev) {
  const char* op = "optimizer_step_state";
  require_step_state(op, state);
  require_scalar_f32(op, "lr", lr_dev);
  require_optimizer_args(op, s, master, grads, states, compute_copy);
  MPX_VALIDATE(compute_copy.empty() || is_16bit(compute_copy.dtype), "{}: compute_copy must be 16-bit, got {}", op,
               compute_copy.str());
  if (master.numel() == 0) return;
  optimizer_step_state_impl(s, master, grads, states, compute_copy, state, lr_dev);
}

void Backend::loss_scale_update_state(const Tensor& state, const LossScaleRule& rule, const Tensor& loss_sum,
                                      const Tensor& correct, int64_t n) {
  const char* op = "loss_scale_update_state";
  require_step_state(op, state);
  require_scalar_f32(op, "loss_sum", loss_sum);
  require_scalar_f32(op, "correct", correct);
  MPX_VALIDATE(n >= 0, "{}: n {} must be >= 0", op, n);
  MPX_VALIDATE(rule.growth_interval >= 1 && rule.growth_factor >= 1.0 && rule.backoff_factor > 0.0 &&
                   rule.backoff_factor <= 1.0 && rule.min_scale > 0.0,
               "{}: invalid rule (growth_interval {}, growth_factor {}, backoff_factor {}, min_scale {})", op,
               rule.growth_interval, rule.growth_factor, rule.backoff_factor, rule.min_scale);
  loss_scale_update_state_impl(state, rule, loss_sum, correct, n);
}

void* Backend::staging(int slot, size_t bytes) {
  MPX_VALIDATE(slot == 0 || slot == 1, "staging: slot {} must be 0 or 1", slot);
  return staging_impl(slot, bytes);
}

void Backend::upload_staged(int slot, void* dst, size_t offset, size_t bytes) {
  MPX_VALIDATE(slot == 0 || slot == 1, "upload_staged: slot {} must be 0 or 1", slot);
  MPX_VALIDATE(dst != nullptr || bytes == 0, "upload_staged: null destination");
  if (bytes == 0) return;
  upload_staged_impl(slot, dst, offset, bytes);
}

void Backend::release_staged(int slot) {
  MPX_VALIDATE(slot == 0 || slot == 1, "release_staged: slot {} must be 0 or 1", slot);
  release_staged_impl(slot);
}

bool Backend::graph_begin_capture() { return supports_graphs() && graph_begin_capture_impl(); }

int Backend::graph_end_capture() { return graph_end_capture_impl(); }

void Backend::graph_launch(int id) {
  MPX_VALIDATE(id >= 0, "graph_launch: no graph {}", id);
  graph_launch_impl(id);
}

// ---- reductions --------------------------------------------------------------

TensorStats Backend::stats(const Tensor& x) {
  require_float("stats", "x", x);
  if (x.numel() == 0) return TensorStats{};
  return stats_impl(x);
}

Support Backend::supports_conv2d(const Conv2dParams&, const Shape&, const Shape&, DType t) {
  if (supports(Op::Conv2d, t)) return {};
  return Support::refused(std::string("conv2d has no ") + dtype_name(t) + " kernels on " + info().name);
}

}  // namespace mpx
