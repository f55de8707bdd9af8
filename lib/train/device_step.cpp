// SPDX-License-Identifier: MIT
// The training step without host synchronisation (train.sync "log";
// docs/gpu.md): the loss scale, verdicts and metrics live in a StepState on the
// device and are read every log_every steps; inputs go through two staged
// upload slots; full-batch steps may be replayed as CUDA graphs.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "backend/graph_capture.h"
#include "core/error.h"
#include "train/stepper.h"

namespace mpx {

namespace {

bool has_dropout(const std::vector<LayerConfig>& layers) {
  for (const LayerConfig& l : layers)
    if (l.type == LayerType::Dropout || has_dropout(l.layers)) return true;
  return false;
}

class DeviceStepper final : public Stepper {
 public:
  explicit DeviceStepper(const StepParts& p) : p_(p) {
    const bool gpu = p_.be.info().name != "cpu";
    rule_.mode = p_.mode == LossScaleMode::Dynamic ? LossScaleRule::Mode::Dynamic
                 : p_.mode == LossScaleMode::Fixed ? LossScaleRule::Mode::Fixed
                                                   : LossScaleRule::Mode::None;
    const LossScaleConfig& ls = p_.cfg.loss_scale;
    rule_.growth_interval = ls.growth_interval;
    rule_.growth_factor = ls.growth_factor;
    rule_.backoff_factor = ls.backoff_factor;
    rule_.min_scale = ls.min_scale;
    state_buf_ = p_.be.alloc(sizeof(StepState), "step state");
    const auto align = [](size_t v) { return (v + 255) / 256 * 256; };
    const size_t B = static_cast<size_t>(p_.bb.max_batch);
    lab_off_ = align(B * static_cast<size_t>(p_.bb.H * p_.bb.W * p_.bb.C));
    lr_off_ = lab_off_ + align(B * 4);
    in_bytes_ = lr_off_ + 256;
    for (auto& b : in_) b = p_.be.alloc(in_bytes_, "input batch (double buffer)");
    std::string graph_why;
    if (!p_.cfg.train.cuda_graph) graph_why = "train.cuda_graph: false";
    else if (!p_.be.supports_graphs()) graph_why = gpu ? "MPX_CUDA_SYNC_DEBUG" : "no graphs on the CPU";
    else if (has_dropout(p_.cfg.model.layers)) graph_why = "dropout masks change every step";
    else if (p_.inject_step >= 0) graph_why = "MPX_DEBUG_INJECT_INF";
    use_graphs_ = graph_why.empty();
    what_ = fmt::format(
        "the loss scale, verdicts and metrics stay on the device and are read every {} steps; double-buffered "
        "input upload; {}",
        std::max<int64_t>(1, p_.cfg.train.log_every),
        use_graphs_ ? "the full-batch step is replayed as a CUDA graph" : "no CUDA graph (" + graph_why + ")");
  }

  bool deferred() const override { return true; }
  bool pending() const override { return window_first_ >= 0; }

  StepOutcome step(const uint8_t* images, const int32_t* labels, int64_t n, int64_t /*global_n*/, double lr,
                   int64_t global_step) override {
    StepOutcome o;
    o.n = n;
    o.pending = true;
    if (n <= 0) return o;
    if (!state_pushed_) push_state();
    const int s = slot_;
    slot_ ^= 1;
    stage(s, images, labels, n, lr);
    if (window_first_ < 0) window_first_ = global_step;
    window_images_ += n;
    const size_t si = static_cast<size_t>(s);
    const bool full = n == p_.bb.max_batch;
    if (use_graphs_ && full && graph_[si] < 0 && warm_[si] > 0) {
      // Plans, algorithms and scratch were set up by the uncaptured steps of this slot. An
      // error while capturing ends the capture (GraphCapture) and propagates.
      GraphCapture capture(p_.be);
      if (capture.open()) {
        queue_step(s, n, global_step);
        graph_[si] = capture.end();
        spdlog::debug("captured the training step of upload slot {} as a CUDA graph (step {})", s, global_step);
      }
    }
    if (use_graphs_ && full && graph_[si] >= 0) {
      p_.be.graph_launch(graph_[si]);
    } else {
      queue_step(s, n, global_step);
      if (full) ++warm_[si];
    }
    p_.be.release_staged(s);
    return o;
  }

  /**
   * @brief Reads the device StepState back (one synchronisation): the sums of the steps since
   * the last flush, and the loss scale, skip counters and optimizer iterations into the host
   * LossScaler and Optimizer (checkpoints, logs). Throws DivergedError where the host step
   * would have (a non-finite loss under float32, max_consecutive_skips), up to log_every
   * steps later. Without pending steps returns an empty outcome.
   */
  StepOutcome flush() override {
    StepOutcome o;
    if (!pending()) return o;
    StepState st;
    p_.be.download(&st, state_tensor());
    o.n = window_images_;
    o.counted = st.counted;
    o.loss_sum = st.loss_sum;
    o.correct = st.correct;
    o.skipped = st.skipped;
    o.applied = st.skipped == 0;
    o.loss_finite = st.nonfinite_loss_steps == 0;
    LossScalerState hs = p_.scaler.state();
    hs.scale = st.scale;
    hs.good_steps = st.good_steps;
    hs.skipped_total = st.skipped_total;
    hs.consecutive_skips = st.consecutive_skips;
    if (st.skipped > 0) hs.last_skip_reason = static_cast<SkipReason>(st.last_skip_reason);
    p_.scaler.set_state(hs);
    p_.opt.set_iterations(st.applied_total);
    const int64_t first = window_first_, last = window_first_ + st.steps - 1;
    const int64_t nonfinite = st.nonfinite_loss_steps, max_run = st.max_consecutive_skips;
    st.loss_sum = st.correct = 0;
    st.counted = st.steps = st.skipped = st.nonfinite_loss_steps = st.max_consecutive_skips = 0;
    p_.be.upload(state_tensor(), &st);
    window_first_ = -1;
    window_images_ = 0;
    if (o.skipped > 0)
      spdlog::info("steps {}..{}: {} skipped (last reason {}), loss scale now {}", first, last, o.skipped,
                   skip_reason_name(hs.last_skip_reason), format_scale(hs.scale));
    if (nonfinite > 0 && p_.policy == Policy::Float32)
      throw DivergedError(fmt::format(
          "training diverged: the loss was non-finite at {} of the steps {}..{} under policy float32 (train.sync "
          "log reads the loss every log_every steps; train.sync: step stops at the first such step and names the "
          "first non-finite layer). {}",
          nonfinite, first, last, kTryText));
    const int64_t max_skips = p_.cfg.loss_scale.max_consecutive_skips;
    if (max_skips > 0 && max_run >= max_skips)
      throw DivergedError(fmt::format(
          "training diverged: {} consecutive steps were skipped (in steps {}..{}; last reason: {}, loss scale {}). {}",
          max_run, first, last, skip_reason_name(hs.last_skip_reason), format_scale(hs.scale), kTryText));
    return o;
  }

 private:
  StepParts p_;
  bool use_graphs_ = false;
  LossScaleRule rule_;
  Buffer state_buf_;          // StepState
  std::array<Buffer, 2> in_;  // per upload slot: images | labels | learning rate
  size_t lab_off_ = 0, lr_off_ = 0, in_bytes_ = 0;
  int slot_ = 0;
  std::array<int, 2> graph_{{-1, -1}};   // captured step of each slot
  std::array<int64_t, 2> warm_{{0, 0}};  // uncaptured full-batch steps run on each slot
  bool state_pushed_ = false;
  int64_t window_first_ = -1;  // first global step since the last flush (-1: none)
  int64_t window_images_ = 0;

  Tensor state_tensor() const { return Tensor(state_buf_.data(), DType::U8, Shape{int64_t(sizeof(StepState))}); }
  char* slot_base(int s) const { return static_cast<char*>(in_[static_cast<size_t>(s)].data()); }
  Tensor in_images(int s, int64_t n) const {
    return Tensor(slot_base(s), DType::U8, Shape{n, p_.bb.H, p_.bb.W, p_.bb.C});
  }
  Tensor in_labels(int s, int64_t n) const { return Tensor(slot_base(s) + lab_off_, DType::I32, Shape{n}); }
  Tensor in_lr(int s) const { return Tensor(slot_base(s) + lr_off_, DType::F32, Shape{1}); }

  /// The host LossScaler and Optimizer counters into the device StepState.
  void push_state() {
    StepState st;
    const LossScalerState& hs = p_.scaler.state();
    st.scale = hs.scale;
    st.good_steps = hs.good_steps;
    st.skipped_total = hs.skipped_total;
    st.consecutive_skips = hs.consecutive_skips;
    st.applied_total = p_.opt.iterations();
    st.last_skip_reason = static_cast<int32_t>(hs.last_skip_reason);
    p_.be.upload(state_tensor(), &st);
    state_pushed_ = true;
  }

  /// Images, labels and the learning rate into pinned slot `s`, then queued to the device.
  void stage(int s, const uint8_t* images, const int32_t* labels, int64_t n, double lr) {
    const size_t img_bytes = static_cast<size_t>(n) * static_cast<size_t>(p_.bb.H * p_.bb.W * p_.bb.C);
    auto* host = static_cast<unsigned char*>(p_.be.staging(s, in_bytes_));
    std::memcpy(host, images, img_bytes);
    std::memcpy(host + lab_off_, labels, static_cast<size_t>(n) * 4);
    const float lrf = static_cast<float>(lr);
    std::memcpy(host + lr_off_, &lrf, 4);
    auto* dev = reinterpret_cast<unsigned char*>(slot_base(s));
    p_.be.upload_staged(s, dev, 0, img_bytes);
    p_.be.upload_staged(s, dev + lab_off_, lab_off_, static_cast<size_t>(n) * 4);
    p_.be.upload_staged(s, dev + lr_off_, lr_off_, 4);
  }

  /// The ops of one step, reading its inputs from upload slot s.
  void queue_step(int s, int64_t n, int64_t global_step) {
    const Tensor dl = p_.bb.dl(n);
    const Tensor logits =
        p_.model.forward(in_images(s, n), true, p_.dropout_seed, static_cast<uint64_t>(global_step));
    p_.be.softmax_cross_entropy_scaled(logits, in_labels(s, n), state_tensor(), 1.0, p_.bb.loss(), p_.bb.correct(),
                                       dl, static_cast<float>(p_.cfg.train.label_smoothing));
    p_.model.backward(dl);
    const bool params = p_.model.num_params() > 0;
    if (global_step == p_.inject_step && params) {
      spdlog::warn("MPX_DEBUG_INJECT_INF: writing inf into the gradients at step {}", global_step);
      p_.be.fill(p_.model.grads().flat_view(0, Shape{1}), std::numeric_limits<float>::infinity());
    }
    p_.be.unscale_and_check_state(params ? p_.model.grads() : Tensor(), p_.bb.loss(), state_tensor(), 1);
    if (params)
      p_.opt.step_on_device(p_.model.master(), p_.model.grads(), p_.model.compute_copy(), state_tensor(), in_lr(s));
    p_.be.loss_scale_update_state(state_tensor(), rule_, p_.bb.loss(), p_.bb.correct(), n);
  }
};

}  // namespace

std::unique_ptr<Stepper> make_device_stepper(const StepParts& p, std::string* why) {
  const SyncMode want = p.cfg.train.sync;
  const bool gpu = p.be.info().name != "cpu";
  const int world = p.comm ? p.comm->world_size() : 1;
  if (want == SyncMode::Step) *why = "train.sync: step";
  else if (world > 1) *why = "data parallel: the ranks share their verdicts on the host";
  else if (p.cfg.debug.check_numerics) *why = "debug.check_numerics scans every layer on the host";
  else if (want == SyncMode::Auto && !gpu) *why = "train.sync: auto on the CPU";
  else return std::make_unique<DeviceStepper>(p);
  return nullptr;
}

}  // namespace mpx
