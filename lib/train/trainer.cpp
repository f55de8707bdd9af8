// SPDX-License-Identifier: MIT
// The training driver: device and policy resolution, the one training step of
// DESIGN.md (forward, float32 loss, scaled backward, fused unscale-and-check,
// fused optimizer pass, loss-scaler update), evaluation, the epoch loop with
// logging, metrics.jsonl, checkpoints and summary.json; plus `eval` and `bench`.
#include "train/trainer.h"

#include <fmt/format.h>
#include <mpx/config.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "dist/communicator.h"
#include "train/checkpoint.h"
#include "train/loss_scaler.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/run_dir.h"
#include "train/schedule.h"
#include "train/weights.h"

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace mpx {

std::atomic<bool>& stop_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

// ---- device and policy ------------------------------------------------------

ResolvedDevice resolve_device(const std::string& device) {
  if (device == "auto") {
    const int n = cuda_device_count();
    if (n > 0) {
      try {
        auto b = create_backend("cuda:0");
        return {"cuda:0", fmt::format("device auto: {} CUDA device{} present, using cuda:0 ({})", n,
                                      n == 1 ? "" : "s", b->info().description)};
      } catch (const std::exception& e) {
        return {"cpu", fmt::format("device auto: a CUDA device is present but the CUDA backend did not start "
                                   "({}); using the CPU",
                                   e.what())};
      }
    }
#if MPX_WITH_CUDA
    return {"cpu", "device auto: no CUDA device found, using the CPU"};
#else
    return {"cpu", "device auto: this mpx was built without CUDA, using the CPU"};
#endif
  }
  if (device == "cuda") return {"cuda:0", "device cuda: using cuda:0"};
  return {device, "device " + device + " (set in the config)"};
}

namespace {

/// AMX-BF16 on this CPU (the only CPU feature for which oneDNN's bf16 beats f32).
bool cpu_has_amx_bf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) return line.find(" amx_bf16") != std::string::npos;
  }
  return false;
}

}  // namespace

Policy resolve_policy(Policy p, const DeviceInfo& dev, std::string* reason) {
  auto say = [&](const std::string& s) {
    if (reason) *reason = s;
  };
  if (p != Policy::Auto) {
    say(fmt::format("policy {} (set in the config)", policy_name(p)));
    return p;
  }
  if (dev.compute_capability > 0) {
    const int cc = dev.compute_capability;
    if (cc >= 80) {
      say(fmt::format("policy auto -> mixed_bfloat16: {} has compute capability {}.{} (native bfloat16 Tensor Cores)",
                      dev.name, cc / 10, cc % 10));
      return Policy::MixedBFloat16;
    }
    if (cc >= 70) {
      say(fmt::format("policy auto -> mixed_float16: {} has compute capability {}.{} (float16 Tensor Cores, "
                      "no bfloat16)",
                      dev.name, cc / 10, cc % 10));
      return Policy::MixedFloat16;
    }
    say(fmt::format("policy auto -> float32: {} has compute capability {}.{} (no Tensor Cores)", dev.name, cc / 10,
                    cc % 10));
    return Policy::Float32;
  }
  if (dev.native_bf16 || cpu_has_amx_bf16()) {
    say("policy auto -> mixed_bfloat16: the CPU has AMX-BF16 (oneDNN's bfloat16 kernels beat float32)");
    return Policy::MixedBFloat16;
  }
  say("policy auto -> float32: the CPU has no AMX-BF16, so 16-bit math would be emulated and slower than float32");
  return Policy::Float32;
}

namespace {

const LayerConfig* last_layer(const std::vector<LayerConfig>& layers) {
  if (layers.empty()) return nullptr;
  const LayerConfig& l = layers.back();
  if (l.type == LayerType::Residual) return last_layer(l.layers);
  return &l;
}

LossScaleMode effective_mode(const LossScaleConfig& c, Policy resolved) {
  if (c.mode_explicit) return c.mode;
  return resolved == Policy::MixedFloat16 ? LossScaleMode::Dynamic : LossScaleMode::None;
}

}  // namespace

std::vector<std::string> precision_warnings(const Config& cfg, Policy resolved, bool auto_fell_back) {
  std::vector<std::string> w;
  const LossScaleMode mode = effective_mode(cfg.loss_scale, resolved);
  if (resolved == Policy::MixedFloat16 && mode == LossScaleMode::None) {
    w.push_back("policy mixed_float16 with loss_scale.mode none: gradients below 2^-24 flush to zero in float16 "
                "and the model may stop learning; use loss_scale.mode dynamic (the default for mixed_float16)");
  }
  if (const LayerConfig* last = last_layer(cfg.model.layers)) {
    if (last->activation == ActivationName::Softmax) {
      const DType dt = compute_dtype_for(resolved, last->dtype);
      if (is_16bit(dt)) {
        w.push_back(fmt::format(
            "the output layer '{}' computes in {} and has a softmax: mpx fuses the softmax into the float32 loss, "
            "but its logits are rounded to {} first (Keras: put the output layer in float32 with dtype: float32)",
            last->name.empty() ? std::string(enum_name(last->type)) : last->name, dtype_name(dt), dtype_name(dt)));
      }
    }
  }
  if (cfg.loss_scale.mode_explicit && mode != LossScaleMode::None && resolved != Policy::MixedFloat16) {
    w.push_back(fmt::format("loss_scale.mode {} under policy {}: {} has float32's exponent range and needs no loss "
                            "scaling; it only costs time (use loss_scale.mode none)",
                            loss_scale_mode_name(mode), policy_name(resolved),
                            resolved == Policy::MixedBFloat16 ? "bfloat16" : "float32"));
  }
  if (auto_fell_back) {
    w.push_back("policy auto resolved to float32: this device has no fast 16-bit math, so training runs in float32 "
                "(set policy: mixed_float16 or mixed_bfloat16 to force mixed precision, e.g. to test numerics)");
  }
  return w;
}

// ---- the engine: one model, its optimizer and scaler, and the step -----------

namespace {

struct EvalStats {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
};

/// One step's outcome; with several ranks the sums and `n` are over all ranks (the global batch).
/// With train.sync "log" a step returns `pending` (n only) and Engine::flush() returns the
/// sums of every step since the previous flush.
struct StepOutcome {
  bool applied = false;
  bool loss_finite = true;
  SkipReason reason = SkipReason::None;
  double loss_sum = 0, correct = 0;  // over the steps whose loss was finite
  int64_t n = 0;                     // records stepped over
  int64_t counted = 0;               // records of the steps whose loss was finite
  int64_t skipped = 0;               // steps skipped
  bool pending = false;              // sync "log": the sums come with the next flush()
  bool stop = false;  // a rank was asked to stop (SIGINT/SIGTERM): every rank stops after this step
};

bool has_dropout(const std::vector<LayerConfig>& layers) {
  for (const LayerConfig& l : layers)
    if (l.type == LayerType::Dropout || has_dropout(l.layers)) return true;
  return false;
}

/// Input/label/loss buffers of one batch, planned once.
struct BatchBuffers {
  Buffer x, y, scalars, dlogits;
  int64_t max_batch = 0;
  int H = 0, W = 0, C = 0, K = 0;

  BatchBuffers(Backend& be, int64_t B, int H_, int W_, int C_, int K_) : max_batch(B), H(H_), W(W_), C(C_), K(K_) {
    x = be.alloc(static_cast<size_t>(B * H * W * C), "input batch");
    y = be.alloc(static_cast<size_t>(B) * 4, "labels");
    scalars = be.alloc(64, "loss and accuracy");
    dlogits = be.alloc(static_cast<size_t>(B * K) * 4, "logit gradients");
  }
  Tensor images(int64_t n) const { return x.view(DType::U8, Shape{n, H, W, C}); }
  Tensor labels(int64_t n) const { return y.view(DType::I32, Shape{n}); }
  Tensor loss() const { return Tensor(scalars.data(), DType::F32, Shape{1}); }
  Tensor correct() const { return Tensor(static_cast<char*>(scalars.data()) + 4, DType::F32, Shape{1}); }
  Tensor dl(int64_t n) const { return dlogits.view(DType::F32, Shape{n, K}); }
};

/// Evaluates `model` (inference mode) over the whole of `ds`; loss summed in double.
/// With several ranks each evaluates a contiguous slice of `ds` and the sums are all-reduced.
EvalStats evaluate_model(Backend& be, Model& model, BatchBuffers& bb, const Dataset& ds,
                         Communicator* comm = nullptr) {
  EvalStats r;
  double loss = 0;
  double correct = 0;
  const int64_t B = bb.max_batch;
  const int64_t world = comm ? comm->world_size() : 1, rank = comm ? comm->rank() : 0;
  const int64_t begin = ds.size() * rank / world, end = ds.size() * (rank + 1) / world;
  for (int64_t i = begin; i < end; i += B) {
    const int64_t n = std::min(B, end - i);
    const Tensor x = bb.images(n), y = bb.labels(n);
    be.upload(x, ds.images.data() + i * ds.image_bytes());
    be.upload(y, ds.labels.data() + i);
    const Tensor logits = model.forward(x, false);
    be.softmax_cross_entropy(logits, y, 1.0f, bb.loss(), bb.correct(), Tensor());
    float l = 0, c = 0;
    be.download(&l, bb.loss());
    be.download(&c, bb.correct());
    loss += static_cast<double>(l);
    correct += static_cast<double>(c);
  }
  if (world > 1) {
    double v[2] = {loss, correct};
    comm->all_reduce_sum(v, 2);
    loss = v[0], correct = v[1];
  }
  r.count = ds.size();
  r.loss = r.count ? loss / static_cast<double>(r.count) : 0.0;
  r.accuracy = r.count ? correct / static_cast<double>(r.count) : 0.0;
  return r;
}

const char* kTryText =
    "Try a lower optimizer.learning_rate, loss_scale.mode: dynamic, policy: mixed_bfloat16 or float32, and "
    "debug.check_numerics: true to find the first non-finite layer on every step";

/// Debug hook of the data-parallel tests: MPX_DEBUG_INJECT_INF="RANK:STEP" writes +inf into
/// the first gradient of rank RANK at global step STEP, after its backward pass and before
/// the all-reduce (an overflow on one rank's shard). -1 when unset or for another rank.
int64_t inject_inf_step(int rank) {
  const char* v = std::getenv("MPX_DEBUG_INJECT_INF");
  int r = -1;
  long long st = -1;
  if (!v || std::sscanf(v, "%d:%lld", &r, &st) != 2 || r != rank) return -1;
  return st;
}

class Engine {
 public:
  /// `comm` (may be null: one process) carries the host collectives and, on the CPU, the
  /// gradient all-reduce; `device_comm` (NCCL, may be null) the gradient all-reduce on a GPU,
  /// else GPU gradients go through host memory and `comm`. `local_batch`: this rank's share of
  /// data.batch_size (0: all of it).
  Engine(const Config& cfg, Policy policy, Backend& be, int H, int W, int C, int K, LossScaleMode mode,
         Communicator* comm = nullptr, int64_t local_batch = 0, Communicator* device_comm = nullptr)
      : cfg_(cfg), policy_(policy), be_(be),
        model_(cfg, policy, be, H, W, C, K, local_batch > 0 ? local_batch : cfg.data.batch_size),
        opt_(cfg.optimizer, be, model_.num_params()),
        scaler_(cfg.loss_scale, mode),
        bb_(be, local_batch > 0 ? local_batch : cfg.data.batch_size, H, W, C, K),
        comm_(comm), device_comm_(device_comm),
        world_(comm ? comm->world_size() : 1), rank_(comm ? comm->rank() : 0),
        host_grads_(be.info().name == "cpu"),
        // Dropout masks differ between ranks (rank 0 keeps the single-process masks).
        dropout_seed_(rank_ > 0 ? mix64(cfg.seed + static_cast<uint64_t>(rank_)) : cfg.seed),
        inject_step_(inject_inf_step(rank_)) {
    setup_sync(mode);
    setup_overlap();
  }

  /// How the step synchronises, for the start-up log.
  const std::string& sync_description() const { return sync_what_; }
  /// train.sync "log": steps queue work only; flush() reads the results.
  bool deferred() const { return deferred_; }
  /// Steps queued since the last flush().
  bool pending() const { return window_first_ >= 0; }

  int world_size() const { return world_; }
  /// How the gradient arena is all-reduced ("" with one rank).
  std::string reduce_path() const {
    if (world_ == 1) return "";
    if (device_comm_) return device_comm_->kind();
    return host_grads_ ? comm_->kind() : comm_->kind() + " through host memory";
  }

  Model& model() { return model_; }
  Optimizer& optimizer() { return opt_; }
  LossScaler& scaler() { return scaler_; }
  BatchBuffers& buffers() { return bb_; }

  /// One training step on a host batch (see DESIGN.md "One training step"). With several
  /// ranks `n` is this rank's shard of a global batch of `global_n` records (n may be 0).
  StepOutcome step(const uint8_t* images, const int32_t* labels, int64_t n, int64_t global_n, double lr,
                   int64_t global_step) {
    if (deferred_) return step_deferred(images, labels, n, lr, global_step);
    StepOutcome o;
    o.n = n;
    const double S = scaler_.scale();
    const Tensor dl = bb_.dl(n);
    float loss = 0, correct = 0;
    std::string forward_where;
    if (n > 0) {
      const Tensor x = bb_.images(n), y = bb_.labels(n);
      be_.upload(x, images);
      be_.upload(y, labels);
      const Tensor logits = model_.forward(x, true, dropout_seed_, static_cast<uint64_t>(global_step));
      // The loss gradient is S * (this shard's mean loss) weighted by n * world / global_n, so that the
      // sum over ranks divided by world is S * the global batch's mean loss (the weight is exactly 1
      // when the shards are equal, and with one rank).
      const double w = world_ > 1 ? static_cast<double>(n) * world_ / static_cast<double>(global_n) : 1.0;
      be_.softmax_cross_entropy(logits, y, static_cast<float>(S * w), bb_.loss(), bb_.correct(), dl);
      be_.download(&loss, bb_.loss());
      be_.download(&correct, bb_.correct());
      if (cfg_.debug.check_numerics) {
        const std::string bad = model_.first_nonfinite_forward();
        if (!bad.empty()) spdlog::warn("check_numerics: step {}: first non-finite forward output: {}", global_step, bad);
      }
      if (!std::isfinite(loss)) forward_where = model_.first_nonfinite_forward();
    }
    o.loss_sum = loss;
    o.correct = correct;
    bool forward_bad = !forward_where.empty();
    if (world_ > 1) {
      // One small all-reduce: the global batch's metrics, and the verdicts every rank must share
      // (a non-finite loss on any rank makes the sum non-finite; a stop request on any rank).
      double v[5] = {o.loss_sum, o.correct, static_cast<double>(n), forward_bad ? 1.0 : 0.0,
                     stop_requested().load() ? 1.0 : 0.0};
      comm_->all_reduce_sum(v, 5);
      o.loss_sum = v[0], o.correct = v[1], o.n = static_cast<int64_t>(std::llround(v[2]));
      forward_bad = v[3] > 0;
      o.stop = v[4] > 0;
    }
    o.loss_finite = std::isfinite(o.loss_sum);
    if (!forward_bad) forward_where.clear();
    else if (forward_where.empty()) forward_where = "(on another rank)";

    if (!o.loss_finite) {
      if (policy_ == Policy::Float32) {
        throw DivergedError(fmt::format(
            "training diverged: the loss is {} at step {} under policy float32{}; {}. {}",
            std::isnan(o.loss_sum) ? "NaN" : "inf", global_step,
            world_ > 1 ? fmt::format(" (summed over the {} ranks)", world_) : std::string(),
            forward_where.empty() ? "every layer output was finite, the loss itself overflowed"
                                  : "first non-finite output: layer " + forward_where,
            kTryText));
      }
      o.reason = forward_bad ? SkipReason::NonfiniteForward : SkipReason::NonfiniteLoss;
    } else {
      cur_step_ = global_step;
      if (n > 0) {
        model_.backward(dl);  // with overlap, the buckets' all-reduces start in here
      } else if (model_.num_params() > 0) {
        be_.fill(model_.grads(), 0.0f);  // no records on this rank this step: it adds nothing
      }
      if (cfg_.debug.check_numerics) {
        const std::string bad = model_.first_nonfinite_backward();
        if (!bad.empty())
          spdlog::warn("check_numerics: step {}: first non-finite gradient (loss scale {}): {}", global_step,
                       format_scale(S), bad);
      }
      if (global_step == inject_step_ && model_.num_params() > 0 && inflight_.empty()) inject_inf();
      // Summed while still scaled (inf/NaN propagate), then unscaled by 1/(S * world): the average,
      // and the same finiteness verdict on every rank.
      reduce_grads();
      const bool finite =
          be_.unscale_and_check(model_.grads(), static_cast<float>(1.0 / (S * static_cast<double>(world_))));
      if (finite) {
        opt_.step(model_.master(), model_.grads(), model_.compute_copy(), lr);
        o.applied = true;
      } else {
        o.reason = SkipReason::BackwardOverflow;
      }
    }

    const double before = scaler_.scale();
    scaler_.update(o.applied, o.reason, [&]() -> std::string {
      if (o.reason == SkipReason::BackwardOverflow) {
        const std::string b = model_.first_nonfinite_backward();
        return b.empty() ? "the forward pass was finite" : "forward pass finite, first non-finite gradient: " + b;
      }
      return forward_where.empty() ? "every layer output was finite, the loss overflowed"
                                   : "first non-finite forward output: " + forward_where;
    });
    if (!o.applied) {
      spdlog::info("step {}: skipped ({}), loss scale {} -> {}", global_step, skip_reason_name(o.reason),
                   format_scale(before), format_scale(scaler_.scale()));
    }
    o.skipped = o.applied ? 0 : 1;
    o.counted = o.loss_finite ? o.n : 0;
    return o;
  }

  /**
   * @brief Reads the device StepState back (one synchronisation): the sums of the steps since
   * the last flush, and the loss scale, skip counters and applied updates into the host
   * LossScaler and Optimizer (checkpoints, logs). Throws DivergedError where the host path
   * would have (a non-finite loss under float32, max_consecutive_skips), up to log_every
   * steps later. Without pending steps returns an empty outcome.
   */
  StepOutcome flush() {
    StepOutcome o;
    if (!pending()) return o;
    StepState st;
    be_.download(&st, state_tensor());
    o.n = window_images_;
    o.counted = st.counted;
    o.loss_sum = st.loss_sum;
    o.correct = st.correct;
    o.skipped = st.skipped;
    o.applied = st.skipped == 0;
    o.loss_finite = st.nonfinite_loss_steps == 0;
    LossScalerState hs = scaler_.state();
    hs.scale = st.scale;
    hs.good_steps = st.good_steps;
    hs.skipped_total = st.skipped_total;
    hs.consecutive_skips = st.consecutive_skips;
    if (st.skipped > 0) hs.last_skip_reason = static_cast<SkipReason>(st.last_skip_reason);
    scaler_.set_state(hs);
    opt_.set_applied_updates(st.applied_total);
    const int64_t first = window_first_, last = window_first_ + st.steps - 1;
    const int64_t nonfinite = st.nonfinite_loss_steps, max_run = st.max_consecutive_skips;
    st.loss_sum = st.correct = 0;
    st.counted = st.steps = st.skipped = st.nonfinite_loss_steps = st.max_consecutive_skips = 0;
    be_.upload(state_tensor(), &st);
    window_first_ = -1;
    window_images_ = 0;
    if (o.skipped > 0)
      spdlog::info("steps {}..{}: {} skipped (last reason {}), loss scale now {}", first, last, o.skipped,
                   skip_reason_name(hs.last_skip_reason), format_scale(hs.scale));
    if (nonfinite > 0 && policy_ == Policy::Float32)
      throw DivergedError(fmt::format(
          "training diverged: the loss was non-finite at {} of the steps {}..{} under policy float32 (train.sync "
          "log reads the loss every log_every steps; train.sync: step stops at the first such step and names the "
          "first non-finite layer). {}",
          nonfinite, first, last, kTryText));
    const int64_t max_skips = cfg_.loss_scale.max_consecutive_skips;
    if (max_skips > 0 && max_run >= max_skips)
      throw DivergedError(fmt::format(
          "training diverged: {} consecutive steps were skipped (in steps {}..{}; last reason: {}, loss scale {}). {}",
          max_run, first, last, skip_reason_name(hs.last_skip_reason), format_scale(hs.scale), kTryText));
    return o;
  }

 private:
  const Config& cfg_;
  Policy policy_;
  Backend& be_;
  Model model_;
  Optimizer opt_;
  LossScaler scaler_;
  BatchBuffers bb_;
  Communicator* comm_;
  Communicator* device_comm_;
  int world_, rank_;
  bool host_grads_;  // the gradient arena is host memory (CPU backend)
  uint64_t dropout_seed_;
  int64_t inject_step_;
  std::vector<float> staging_;  // GPU gradients through host memory when there is no NCCL

  // ---- train.sync "log": the step without host synchronisation --------------------------
  bool deferred_ = false;
  bool use_graphs_ = false;
  std::string sync_what_;
  LossScaleRule rule_;
  Buffer state_buf_;            // StepState
  std::array<Buffer, 2> in_;    // per upload slot: images | labels | learning rate
  size_t lab_off_ = 0, lr_off_ = 0, in_bytes_ = 0;
  int slot_ = 0;
  std::array<int, 2> graph_{{-1, -1}};   // captured step of each slot
  std::array<int64_t, 2> warm_{{0, 0}};  // uncaptured full-batch steps run on each slot
  bool state_pushed_ = false;
  int64_t window_first_ = -1;   // first global step since the last flush (-1: none)
  int64_t window_images_ = 0;

  Tensor state_tensor() const { return Tensor(state_buf_.data(), DType::U8, Shape{int64_t(sizeof(StepState))}); }
  Tensor in_images(int s, int64_t n) const {
    return Tensor(in_[static_cast<size_t>(s)].data(), DType::U8, Shape{n, bb_.H, bb_.W, bb_.C});
  }
  Tensor in_labels(int s, int64_t n) const {
    return Tensor(static_cast<char*>(in_[static_cast<size_t>(s)].data()) + lab_off_, DType::I32, Shape{n});
  }
  Tensor in_lr(int s) const {
    return Tensor(static_cast<char*>(in_[static_cast<size_t>(s)].data()) + lr_off_, DType::F32, Shape{1});
  }

  void setup_sync(LossScaleMode mode) {
    const SyncMode want = cfg_.train.sync;
    const bool gpu = be_.info().name != "cpu";
    std::string why;
    if (want == SyncMode::Step) {
      why = "train.sync: step";
    } else if (world_ > 1) {
      why = "data parallel: the ranks share their verdicts on the host";
    } else if (cfg_.debug.check_numerics) {
      why = "debug.check_numerics scans every layer on the host";
    } else if (want == SyncMode::Auto && !gpu) {
      why = "train.sync: auto on the CPU";
    } else {
      deferred_ = true;
    }
    if (!deferred_) {
      if (want == SyncMode::Log)
        spdlog::warn("train.sync: log is not possible here ({}); the step reads back every step", why);
      sync_what_ = fmt::format("the step reads its loss and verdict back every step ({})", why);
      return;
    }
    rule_.mode = mode == LossScaleMode::Dynamic ? LossScaleRule::Mode::Dynamic
                 : mode == LossScaleMode::Fixed ? LossScaleRule::Mode::Fixed
                                                : LossScaleRule::Mode::None;
    rule_.growth_interval = cfg_.loss_scale.growth_interval;
    rule_.growth_factor = cfg_.loss_scale.growth_factor;
    rule_.backoff_factor = cfg_.loss_scale.backoff_factor;
    rule_.min_scale = cfg_.loss_scale.min_scale;
    state_buf_ = be_.alloc(sizeof(StepState), "step state");
    const auto align = [](size_t v) { return (v + 255) / 256 * 256; };
    const size_t B = static_cast<size_t>(bb_.max_batch);
    lab_off_ = align(B * static_cast<size_t>(bb_.H * bb_.W * bb_.C));
    lr_off_ = lab_off_ + align(B * 4);
    in_bytes_ = lr_off_ + 256;
    for (auto& b : in_) b = be_.alloc(in_bytes_, "input batch (double buffer)");
    std::string graph_why;
    if (!cfg_.train.cuda_graph) graph_why = "train.cuda_graph: false";
    else if (!be_.supports_graphs()) graph_why = gpu ? "MPX_CUDA_SYNC_DEBUG" : "no graphs on the CPU";
    else if (has_dropout(cfg_.model.layers)) graph_why = "dropout masks change every step";
    else if (inject_step_ >= 0) graph_why = "MPX_DEBUG_INJECT_INF";
    use_graphs_ = graph_why.empty();
    sync_what_ = fmt::format(
        "the loss scale, verdicts and metrics stay on the device and are read every {} steps; double-buffered "
        "input upload; {}",
        std::max<int64_t>(1, cfg_.train.log_every),
        use_graphs_ ? "the full-batch step is replayed as a CUDA graph" : "no CUDA graph (" + graph_why + ")");
  }

  /// The host LossScaler and Optimizer counters into the device StepState.
  void push_state() {
    StepState st;
    const LossScalerState& hs = scaler_.state();
    st.scale = hs.scale;
    st.good_steps = hs.good_steps;
    st.skipped_total = hs.skipped_total;
    st.consecutive_skips = hs.consecutive_skips;
    st.applied_total = opt_.applied_updates();
    st.last_skip_reason = static_cast<int32_t>(hs.last_skip_reason);
    be_.upload(state_tensor(), &st);
    state_pushed_ = true;
  }

  /// The ops of one step of sync "log", reading its inputs from upload slot s.
  void queue_step(int s, int64_t n, int64_t global_step) {
    const Tensor dl = bb_.dl(n);
    const Tensor logits = model_.forward(in_images(s, n), true, dropout_seed_, static_cast<uint64_t>(global_step));
    be_.softmax_cross_entropy_scaled(logits, in_labels(s, n), state_tensor(), 1.0, bb_.loss(), bb_.correct(), dl);
    model_.backward(dl);
    const bool params = model_.num_params() > 0;
    if (global_step == inject_step_ && params) {
      spdlog::warn("MPX_DEBUG_INJECT_INF: writing inf into the gradients at step {}", global_step);
      be_.fill(model_.grads().flat_view(0, Shape{1}), std::numeric_limits<float>::infinity());
    }
    be_.unscale_and_check_state(params ? model_.grads() : Tensor(), bb_.loss(), state_tensor(), 1);
    if (params) opt_.step_on_device(model_.master(), model_.grads(), model_.compute_copy(), state_tensor(), in_lr(s));
    be_.loss_scale_update_state(state_tensor(), rule_, bb_.loss(), bb_.correct(), n);
  }

  StepOutcome step_deferred(const uint8_t* images, const int32_t* labels, int64_t n, double lr, int64_t global_step) {
    StepOutcome o;
    o.n = n;
    o.pending = true;
    if (n <= 0) return o;
    if (!state_pushed_) push_state();
    const int s = slot_;
    slot_ ^= 1;
    const size_t img_bytes = static_cast<size_t>(n) * static_cast<size_t>(bb_.H * bb_.W * bb_.C);
    auto* stage = static_cast<unsigned char*>(be_.staging(s, in_bytes_));
    std::memcpy(stage, images, img_bytes);
    std::memcpy(stage + lab_off_, labels, static_cast<size_t>(n) * 4);
    const float lrf = static_cast<float>(lr);
    std::memcpy(stage + lr_off_, &lrf, 4);
    auto* dev = static_cast<unsigned char*>(in_[static_cast<size_t>(s)].data());
    be_.upload_staged(s, dev, 0, img_bytes);
    be_.upload_staged(s, dev + lab_off_, lab_off_, static_cast<size_t>(n) * 4);
    be_.upload_staged(s, dev + lr_off_, lr_off_, 4);
    if (window_first_ < 0) window_first_ = global_step;
    window_images_ += n;
    const size_t si = static_cast<size_t>(s);
    const bool full = n == bb_.max_batch;
    if (use_graphs_ && full && graph_[si] >= 0) {
      be_.graph_launch(graph_[si]);
    } else if (use_graphs_ && full && warm_[si] > 0 && be_.graph_begin_capture()) {
      // Plans, algorithms and scratch were set up by the uncaptured steps of this slot.
      queue_step(s, n, global_step);
      graph_[si] = be_.graph_end_capture();
      be_.graph_launch(graph_[si]);
      spdlog::debug("captured the training step of upload slot {} as a CUDA graph (step {})", s, global_step);
    } else {
      queue_step(s, n, global_step);
      if (full) ++warm_[si];
    }
    be_.release_staged(s);
    return o;
  }

  void inject_inf() {
    spdlog::warn("MPX_DEBUG_INJECT_INF: writing inf into this rank's gradients at step {}", cur_step_);
    be_.fill(model_.grads().flat_view(0, Shape{1}), std::numeric_limits<float>::infinity());
  }

  // ---- overlap of the gradient all-reduce with the backward pass (issue 5) ----------------
  // GPU with NCCL: buckets of the arena are all-reduced on NCCL's stream as soon as their layers'
  // gradients are final (Model's grad-ready hook), ordered after the compute stream by events;
  // the host never waits. CPU with MPI: measured not to pay on 2 cores (bench/overlap_cpu.sh:
  // the all-reduce is < 1% of the step and there is no spare core), so the one blocking
  // all-reduce stays; MPX_OVERLAP_ALLREDUCE=1/0 forces either, MPX_BUCKET_BYTES sets the
  // bucket size (default 4 MiB).
  std::unique_ptr<GradBuckets> buckets_;
  Communicator* overlap_comm_ = nullptr;
  std::vector<Communicator::Handle> inflight_;
  int64_t cur_step_ = -1;
  std::string overlap_what_;

  void setup_overlap() {
    if (world_ == 1 || model_.num_params() == 0) return;
    Communicator* c = device_comm_ ? device_comm_ : host_grads_ ? comm_ : nullptr;
    bool want = device_comm_ != nullptr;
    if (const char* e = std::getenv("MPX_OVERLAP_ALLREDUCE"); e && *e) want = *e != '0';
    if (!c || !want) return;
    size_t bucket = size_t{4} << 20;
    if (const char* e = std::getenv("MPX_BUCKET_BYTES"); e && *e) bucket = std::max<size_t>(4, std::stoull(e));
    if (device_comm_) device_comm_->set_compute_stream(be_.native_stream());
    overlap_comm_ = c;
    buckets_ = std::make_unique<GradBuckets>(model_.grad_ready_ranges(), bucket);
    float* g = model_.grads().as<float>();
    model_.set_grad_ready_hook(buckets_->hook([this, g](int, const GradRange& b) {
      if (cur_step_ == inject_step_ && b.offset == 0) inject_inf();  // before its bucket leaves
      inflight_.push_back(overlap_comm_->start_all_reduce_sum(g + b.offset, static_cast<size_t>(b.count)));
    }));
    overlap_what_ = fmt::format("{} buckets of at least {} B, all-reduced during the backward pass",
                                buckets_->buckets().size(), bucket);
  }

 public:
  /// How the all-reduce overlaps the backward pass ("" when it does not).
  const std::string& overlap_description() const { return overlap_what_; }

 private:
  /// The one all-reduce (sum) of the flat gradient arena per step.
  void reduce_grads() {
    const Tensor g = model_.grads();
    if (world_ == 1 || g.empty() || g.numel() == 0) return;
    if (buckets_) {
      // The backward pass started every bucket (or, on a rank without records this step, none:
      // start them all now, in the same order, so that the collectives match across ranks).
      if (inflight_.empty())
        for (const GradRange& b : buckets_->buckets())
          inflight_.push_back(overlap_comm_->start_all_reduce_sum(g.as<float>() + b.offset, static_cast<size_t>(b.count)));
      for (Communicator::Handle h : inflight_) overlap_comm_->wait(h);
      inflight_.clear();
      return;
    }
    if (device_comm_) {
      be_.synchronize();
      device_comm_->all_reduce_sum(g);
    } else if (host_grads_) {
      comm_->all_reduce_sum(g);
    } else {
      staging_.resize(static_cast<size_t>(g.numel()));
      be_.download(staging_.data(), g);
      comm_->all_reduce_sum(staging_.data(), staging_.size());
      be_.upload(g, staging_.data());
    }
  }
};

Config strip_layer_dtypes(Config c) {
  std::function<void(std::vector<LayerConfig>&)> strip = [&](std::vector<LayerConfig>& ls) {
    for (auto& l : ls) {
      l.dtype.reset();
      strip(l.layers);
    }
  };
  strip(c.model.layers);
  return c;
}

void set_normalization(Model& m, const Config& cfg) {
  std::vector<double> mean = cfg.data.mean, stdv = cfg.data.std;
  if (mean.empty() || stdv.empty()) default_normalization(cfg.data.dataset, mean, stdv);
  m.set_input_normalization(mean, stdv);
}

/// Inputs [H, W, C] from the dataset, checked against model.input_shape when given.
void check_input_shape(const Config& cfg, const Dataset& ds) {
  const auto& s = cfg.model.input_shape;
  if (s.empty()) return;
  if (s.size() != 3 || s[0] != ds.H || s[1] != ds.W || s[2] != ds.C) {
    std::string got;
    for (size_t i = 0; i < s.size(); ++i) got += (i ? ", " : "") + std::to_string(s[i]);
    throw ConfigError(fmt::format("model.input_shape [{}] does not match the data set {} ([{}, {}, {}])", got,
                                  cfg.data.dataset, ds.H, ds.W, ds.C));
  }
}

std::vector<float> download_all(Backend& be, const Tensor& t) {
  if (t.empty()) return {};
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

/// Loads master + state of a checkpoint into `m` after checking that it fits.
void restore_weights(Backend& be, Model& m, const Checkpoint& ck, const std::string& path, const Config& cfg) {
  if (ck.header.num_params != m.num_params() || ck.header.num_state != m.num_state()) {
    throw ConfigError(fmt::format(
        "checkpoint '{}' (config '{}') holds {} parameters and {} state values, but the model of config '{}' has {} "
        "parameters and {} state values: the checkpoint was written for another model",
        path, ck.header.config_name, ck.header.num_params, ck.header.num_state, cfg.name, m.num_params(),
        m.num_state()));
  }
  if (m.num_params() > 0) be.upload(m.master(), ck.master.data());
  if (m.num_state() > 0) be.upload(m.state(), ck.state.data());
  m.refresh_compute_copy();
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m{:02}s", t / 3600, (t / 60) % 60, t % 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// The live progress line on a terminal ('\r' updates), cleared before log lines.
class Progress {
 public:
  explicit Progress(bool on) : on_(on) {}
  bool on() const { return on_; }
  void show(const std::string& s) {
    if (!on_) return;
    const auto now = Clock::now();
    if (shown_ && std::chrono::duration<double>(now - last_).count() < 0.2) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[K%s", s.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  void clear() {
    if (!on_ || !shown_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }
  ~Progress() { clear(); }

 private:
  bool on_;
  bool shown_ = false;
  Clock::time_point last_{};
};

}  // namespace

// ---- train ------------------------------------------------------------------

TrainResult train(const Config& cfg_in, const TrainOptions& opts) {
  const auto t_start = Clock::now();

  // Phase 1 (errors are thrown): device, policy, loss scaling, the checkpoint to resume.
  Config cfg = cfg_in;
  if (cfg.data.batch_size <= 0) throw ConfigError("data.batch_size must be > 0");
  // Data parallel (DESIGN.md "Beyond one machine"): under mpirun every rank runs this function.
  Communicator& comm = world();
  const int rank = comm.rank(), world_size = comm.world_size();
  const bool rank0 = rank == 0;
  if (cfg.data.batch_size % world_size != 0)
    throw ConfigError(fmt::format("data.batch_size {} (the global batch) does not divide evenly over the {} ranks; "
                                  "use a multiple of {}",
                                  cfg.data.batch_size, world_size, world_size));
  const int64_t local_batch = cfg.data.batch_size / world_size;
  ResolvedDevice rd = resolve_device(cfg.device);
  if (world_size > 1 && rd.device.rfind("cuda:", 0) == 0 && (cfg.device == "auto" || cfg.device == "cuda")) {
    const int n = std::max(1, cuda_device_count());
    rd.device = fmt::format("cuda:{}", comm.local_rank() % n);
    rd.reason += fmt::format("; rank {} (local rank {}) takes {}", rank, comm.local_rank(), rd.device);
  }
  bool collective_failure = false;  // every rank knows of the failure (no MPI_Abort needed)
  auto all_ranks = [&](const std::string& what, const std::function<void()>& fn) {
    try {
      run_on_all_ranks(comm, what, fn);
    } catch (...) {
      if (world_size > 1) collective_failure = true;
      throw;
    }
  };
  std::unique_ptr<Backend> backend;
  all_ranks("starting the backend", [&] { backend = create_backend(rd.device); });
  Backend& be = *backend;
  const DeviceInfo dev = be.info();
  std::string policy_reason;
  const Policy policy = resolve_policy(cfg.policy, dev, &policy_reason);
  const bool auto_fell_back = cfg.policy == Policy::Auto && policy == Policy::Float32;
  const std::vector<std::string> warnings = precision_warnings(cfg, policy, auto_fell_back);
  const LossScaleMode mode = effective_mode(cfg.loss_scale, policy);
  // The resolved config (config.yaml): the policy and loss-scale mode actually used.
  cfg.policy = policy;
  cfg.loss_scale.mode = mode;
  cfg.loss_scale.mode_explicit = true;

  std::optional<Checkpoint> resume;
  std::string resume_path;
  all_ranks("reading the checkpoint to resume", [&] {
    if (!opts.resume.empty()) {
      resume_path = resolve_checkpoint_path(opts.resume);
      resume = load_checkpoint(resume_path);
      if (resume->header.world_size != world_size)
        throw ConfigError(fmt::format("checkpoint '{}' was written by a run of {} rank{}, this run has {}: resume "
                                      "with the same number of ranks (mpirun -np {})",
                                      resume_path, resume->header.world_size,
                                      resume->header.world_size == 1 ? "" : "s", world_size,
                                      resume->header.world_size));
    }
  });

  // The run directory: --run-dir; else, when resuming from <run>/checkpoints/x.ckpt, that run's
  // directory (metrics.jsonl and train.log are appended to); else runs/<name>-<timestamp>.
  std::string run_dir = opts.run_dir;
  if (run_dir.empty() && resume) {
    const fs::path ck_dir = fs::path(resume_path).parent_path();
    if (ck_dir.filename() == "checkpoints") run_dir = ck_dir.parent_path().string();
  }
  if (run_dir.empty()) run_dir = default_run_dir(cfg.name);
  const bool append = resume && fs::exists(fs::path(run_dir) / "metrics.jsonl");
  all_ranks("creating the run directory", [&] {
    if (rank0) create_run_dir(run_dir);  // only rank 0 writes the run directory
  });

  // Phase 2: from here on every failure is recorded in summary.json.
  TrainResult result;
  result.run_dir = run_dir;
  result.policy = policy_name(policy);
  result.device = rd.device;
  result.eval_policy = cfg.train.eval_policy == EvalPolicy::Float32 ? "float32" : policy_name(policy);
  result.final_loss_scale = mode == LossScaleMode::None ? 1.0 : cfg.loss_scale.initial;
  const fs::path dir(run_dir);
  const std::string ckpt_dir = (dir / "checkpoints").string();
  std::optional<LogFileSink> log_file;
  if (rank0) log_file.emplace((dir / "train.log").string());
  Progress progress(rank0 && opts.progress && ::isatty(STDERR_FILENO) != 0);
  std::unique_ptr<Communicator> nccl;  // the GPU gradient all-reduce

  double prior_wall = 0;
  double run_train_seconds = 0;
  int64_t run_images = 0;
  std::unique_ptr<Engine> engine;
  try {
    if (rank0) write_file_atomic((dir / "config.yaml").string(), to_yaml(cfg));
    spdlog::info("run directory: {}{}", run_dir, resume ? " (resumed from " + resume_path + ")" : "");
    spdlog::info("{}: {}", rd.reason, dev.description);
    if (world_size > 1) {
      // Each rank's device, gathered on rank 0: slot r holds 0 for the CPU, 1 + N for cuda:N.
      std::vector<double> devs(static_cast<size_t>(world_size), 0.0);
      if (rd.device.rfind("cuda:", 0) == 0) devs[static_cast<size_t>(rank)] = 1.0 + std::stoi(rd.device.substr(5));
      comm.all_reduce_sum(devs.data(), devs.size());
      std::string list;
      for (int r = 0; r < world_size; ++r) {
        const int d = static_cast<int>(devs[static_cast<size_t>(r)]);
        list += fmt::format("{}rank {} {}", r ? ", " : "", r, d == 0 ? std::string("cpu") : fmt::format("cuda:{}", d - 1));
      }
      spdlog::info("data parallel: world size {} ({}), this is rank {} (local rank {}); devices: {}", world_size,
                   comm.kind(), rank, comm.local_rank(), list);
      if (rd.device.rfind("cuda:", 0) == 0 && built_with_nccl()) {
        all_ranks("starting NCCL", [&] { nccl = make_nccl_communicator(comm, std::stoi(rd.device.substr(5))); });
      }
    }
    spdlog::info("{}", policy_reason);
    spdlog::info("loss scaling: {}{}", loss_scale_mode_name(mode),
                 mode == LossScaleMode::Dynamic
                     ? fmt::format(" (initial {}, x{} every {} finite steps, x{} on overflow, min {}, stop after {} "
                                   "skips in a row)",
                                   format_scale(cfg.loss_scale.initial), cfg.loss_scale.growth_factor,
                                   cfg.loss_scale.growth_interval, cfg.loss_scale.backoff_factor,
                                   format_scale(cfg.loss_scale.min_scale), cfg.loss_scale.max_consecutive_skips)
                 : mode == LossScaleMode::Fixed ? fmt::format(" (S = {})", format_scale(cfg.loss_scale.initial))
                                                : std::string());
    for (const auto& w : warnings) spdlog::warn("{}", w);

    // Data: every rank reads the whole data set and takes its shard of each global batch.
    Dataset train_ds, test_ds;
    all_ranks("loading the data", [&] {
      train_ds = load_dataset(cfg.data, Split::Train, cfg.seed);
      test_ds = load_dataset(cfg.data, Split::Test, cfg.seed);
      check_input_shape(cfg, train_ds);
      if (test_ds.H != train_ds.H || test_ds.W != train_ds.W || test_ds.C != train_ds.C)
        throw DataError("the test split's image shape differs from the training split's");
    });
    Loader loader(train_ds, cfg.data.batch_size, cfg.data.shuffle, cfg.data.drop_last, cfg.data.augment, cfg.seed,
                  rank, world_size);
    const int64_t steps_per_epoch = loader.steps_per_epoch();
    if (steps_per_epoch <= 0)
      throw ConfigError(fmt::format("data.drop_last with batch_size {} leaves no batch of the {} training records",
                                    cfg.data.batch_size, train_ds.size()));

    // Model, optimizer, scaler.
    all_ranks("building the model", [&] {
      engine = std::make_unique<Engine>(cfg, policy, be, train_ds.H, train_ds.W, train_ds.C, train_ds.num_classes,
                                        mode, &comm, local_batch, nccl.get());
      set_normalization(engine->model(), cfg);
      engine->model().init_params(cfg.seed);
      if (!cfg.weights.init_from.empty() && !resume) {  // weights.init_from (train/weights.h); --resume restores its own
        const WeightsLayout wl = import_weights(engine->model(), be, cfg, Shape{train_ds.H, train_ds.W, train_ds.C},
                                                cfg.weights.init_from);
        spdlog::info("weights: {} ({} layout)", cfg.weights.init_from, weights_layout_name(wl));
      }
    });
    Model& model = engine->model();
    Optimizer& opt = engine->optimizer();
    LossScaler& scaler = engine->scaler();

    std::unique_ptr<Model> eval_model;
    if (cfg.train.eval_policy == EvalPolicy::Float32 && !model.compute_copy().empty()) {
      eval_model = std::make_unique<Model>(strip_layer_dtypes(cfg), Policy::Float32, be, train_ds.H, train_ds.W,
                                           train_ds.C, train_ds.num_classes, local_batch);
      set_normalization(*eval_model, cfg);
    }

    const double base_lr =
        cfg.optimizer.learning_rate *
        (cfg.optimizer.scale_lr_by_batch ? static_cast<double>(cfg.data.batch_size) / 256.0 : 1.0);
    LrSchedule sched(cfg.schedule, base_lr, cfg.train.epochs, steps_per_epoch);

    // Position and state (restored on --resume).
    int64_t epoch = 0, first_step = 0, global_step = 0;
    double best_acc = 0, last_acc = 0, last_test_loss = 0;
    double ep_loss_sum = 0;
    int64_t ep_correct = 0, ep_count = 0, ep_skipped = 0;
    bool evaluated_at_end = false;
    if (resume) {
      const CheckpointHeader& h = resume->header;
      all_ranks("restoring the checkpoint", [&] {
        restore_weights(be, model, *resume, resume_path, cfg);
        if (h.optimizer != enum_name(cfg.optimizer.name))
          throw ConfigError(fmt::format("checkpoint '{}' was written by optimizer '{}', the config uses '{}'",
                                        resume_path, h.optimizer, cfg.optimizer.name));
      });
      opt.upload_state(resume->opt1, resume->opt2);
      opt.set_applied_updates(h.applied_updates);
      scaler.set_state(h.scaler);
      sched.set_state(h.schedule);
      epoch = h.epoch;
      first_step = h.step_in_epoch;
      global_step = h.global_step;
      best_acc = h.best_test_accuracy;
      last_acc = h.last_test_accuracy;
      last_test_loss = h.last_test_loss;
      ep_loss_sum = h.epoch_loss_sum;
      ep_correct = h.epoch_correct;
      ep_count = h.epoch_count;
      ep_skipped = h.epoch_skipped;
      prior_wall = h.wall_seconds;
      result.final_train_loss = h.final_train_loss;
      result.final_train_accuracy = h.final_train_accuracy;
      if (h.policy != policy_name(policy))
        spdlog::info("the checkpoint was written under policy {}, training continues under {}", h.policy,
                     policy_name(policy));
      if (first_step >= steps_per_epoch) {
        ++epoch;
        first_step = 0;
      }
      spdlog::info("resuming at epoch {}, step {} of the epoch (global step {}, {} updates applied, loss scale {})",
                   epoch + 1, first_step, global_step, opt.applied_updates(), format_scale(scaler.scale()));
    }
    result.epochs = epoch;
    result.steps = global_step;
    result.best_test_accuracy = best_acc;
    result.final_test_accuracy = last_acc;
    result.final_test_loss = last_test_loss;

    if (world_size > 1) {
      // Every rank starts from rank 0's weights and batch-norm statistics (they are equal already when
      // initialisation is deterministic; this makes it a guarantee, as DDP does).
      for (const Tensor& t : {model.master(), model.state()}) {
        if (t.empty() || t.numel() == 0) continue;
        std::vector<float> v = download_all(be, t);
        comm.broadcast(v.data(), v.size() * sizeof(float), 0);
        be.upload(t, v.data());
      }
      model.refresh_compute_copy();
    }
    result.memory = model.memory_report();
    result.optimizer_state_bytes = opt.state_bytes();
    spdlog::info("model:\n{}", model.summary_table());
    spdlog::info("data: {} train {} records, test {} records of {}x{}x{}; batch {}, {} steps/epoch, {} epoch{}",
                 cfg.data.dataset, train_ds.size(), test_ds.size(), train_ds.H, train_ds.W, train_ds.C,
                 cfg.data.batch_size, steps_per_epoch, cfg.train.epochs, cfg.train.epochs == 1 ? "" : "s");
    if (world_size > 1)
      spdlog::info("data parallel: {} records per rank of each global batch of {}; one all-reduce ({}) of {} B of "
                   "float32 gradients per step, still loss-scaled; batch-norm statistics stay per rank (rank 0's "
                   "are checkpointed); test evaluation sharded over the ranks",
                   local_batch, cfg.data.batch_size, engine->reduce_path(), model.num_params() * 4);
    if (world_size > 1 && !engine->overlap_description().empty())
      spdlog::info("data parallel: {}", engine->overlap_description());
    spdlog::info("step: {}", engine->sync_description());
    spdlog::info("optimizer: {} learning rate {:g}, schedule {}; memory: master {} B, grads {} B, compute copy {} B, "
                 "optimizer state {} B, activations {} B",
                 cfg.optimizer.name, base_lr, cfg.schedule.name, result.memory.master_bytes,
                 result.memory.grad_bytes, result.memory.compute_copy_bytes, result.optimizer_state_bytes,
                 result.memory.activation_bytes);

    std::optional<MetricsWriter> metrics;
    if (rank0) metrics.emplace((dir / "metrics.jsonl").string(), append);

    // ---- helpers over the current state ----
    auto make_checkpoint = [&](int64_t ck_epoch, int64_t ck_step) {
      Checkpoint c;
      CheckpointHeader& h = c.header;
      h.config_name = cfg.name;
      h.policy = policy_name(policy);
      h.device = rd.device;
      h.optimizer = enum_name(cfg.optimizer.name);
      h.dataset = enum_name(cfg.data.dataset);
      h.seed = cfg.seed;
      h.batch_size = cfg.data.batch_size;
      h.world_size = world_size;
      h.num_params = model.num_params();
      h.num_state = model.num_state();
      h.epoch = ck_epoch;
      h.step_in_epoch = ck_step;
      h.global_step = global_step;
      h.applied_updates = opt.applied_updates();
      h.scaler = scaler.state();
      h.schedule = sched.state();
      h.best_test_accuracy = best_acc;
      h.last_test_accuracy = last_acc;
      h.last_test_loss = last_test_loss;
      h.epoch_loss_sum = ck_step == 0 ? 0.0 : ep_loss_sum;
      h.epoch_correct = ck_step == 0 ? 0 : ep_correct;
      h.epoch_count = ck_step == 0 ? 0 : ep_count;
      h.epoch_skipped = ck_step == 0 ? 0 : ep_skipped;
      h.wall_seconds = prior_wall + seconds_since(t_start);
      h.final_train_loss = result.final_train_loss;
      h.final_train_accuracy = result.final_train_accuracy;
      c.master = download_all(be, model.master());
      c.state = download_all(be, model.state());
      c.opt1 = opt.download_state1();
      c.opt2 = opt.download_state2();
      return c;
    };
    auto save = [&](const std::string& name, int64_t ck_epoch, int64_t ck_step) {
      if (!rank0) return;  // rank 0 holds the same weights and state as every rank
      const std::string path = ckpt_dir + "/" + name;
      save_checkpoint(path, make_checkpoint(ck_epoch, ck_step));
      spdlog::info("saved {} (epoch {}, step {} of the epoch)", path, ck_epoch, ck_step);
    };
    auto evaluate = [&]() {
      Model* m = &model;
      if (eval_model) {
        if (model.num_params() > 0) be.copy(eval_model->master(), model.master());
        if (model.num_state() > 0) be.copy(eval_model->state(), model.state());
        eval_model->refresh_compute_copy();
        m = eval_model.get();
      }
      return evaluate_model(be, *m, engine->buffers(), test_ds, &comm);
    };

    const int64_t epochs = cfg.train.epochs;
    const int64_t log_every = std::max<int64_t>(1, cfg.train.log_every);
    const int64_t max_steps = cfg.train.max_steps;
    bool stop = false;
    std::string stop_kind;  // "interrupted" | "max_steps"
    Batch batch;

    while (!stop && epoch < epochs && !(max_steps > 0 && global_step >= max_steps)) {
      loader.start_epoch(epoch, first_step);
      const auto t_epoch = Clock::now();
      double epoch_train_seconds = 0;
      int64_t epoch_images = 0;
      // the log window
      double win_loss = 0, win_correct = 0;
      int64_t win_count = 0, win_images = 0;
      auto t_win = Clock::now();
      // The sums of one step, or of the steps one flush() read back, into the epoch and the log window.
      auto absorb = [&](const StepOutcome& o) {
        ep_skipped += o.skipped;
        if (o.counted <= 0) return;
        ep_loss_sum += o.loss_sum;
        ep_correct += static_cast<int64_t>(std::llround(o.correct));
        ep_count += o.counted;
        win_loss += o.loss_sum;
        win_correct += o.correct;
        win_count += o.counted;
      };

      while (loader.next(batch)) {
        const auto t_step = Clock::now();
        const double lr = sched.lr(global_step);
        StepOutcome o;
        try {
          o = engine->step(batch.images.data(), batch.labels.data(), batch.n, batch.global_n, lr, global_step);
        } catch (const DivergedError&) {
          result.steps = global_step + 1;  // the step ran (and was the last straw)
          throw;
        }
        ++global_step;
        epoch_images += o.n;
        run_images += o.n;
        win_images += o.n;
        // train.sync "log": the results of the steps since the last read come at log lines, at
        // the end of the epoch and when stopping (the read waits for the device).
        if (o.pending && (global_step % log_every == 0 || loader.position() >= steps_per_epoch ||
                          stop_requested().load() || (max_steps > 0 && global_step >= max_steps))) {
          try {
            o = engine->flush();
          } catch (const DivergedError&) {
            result.steps = global_step;
            throw;
          }
        }
        const double dt = seconds_since(t_step);
        epoch_train_seconds += dt;
        run_train_seconds += dt;
        if (!o.pending) absorb(o);
        result.steps = global_step;
        result.skipped_steps = scaler.state().skipped_total;
        result.final_loss_scale = scaler.scale();
        result.last_skip_reason = skip_reason_name(scaler.state().last_skip_reason);

        const int64_t pos = loader.position();
        const double avg_step = run_train_seconds / static_cast<double>(std::max<int64_t>(1, run_images)) *
                                static_cast<double>(cfg.data.batch_size);
        const int64_t total_steps =
            max_steps > 0 ? std::min(max_steps, epochs * steps_per_epoch) : epochs * steps_per_epoch;
        const double eta = avg_step * static_cast<double>(std::max<int64_t>(0, total_steps - global_step));
        if (global_step % log_every == 0) {
          const double win_s = seconds_since(t_win);
          const double ips = win_s > 0 ? static_cast<double>(win_images) / win_s : 0.0;
          const double wl = win_count ? win_loss / static_cast<double>(win_count) : std::nan("");
          const double wa = win_count ? win_correct / static_cast<double>(win_count) : std::nan("");
          const std::string line = fmt::format(
              "epoch {}/{} step {}/{} (global {}): loss {:.4f} acc {:.4f} lr {:.3g} scale {} skipped {} "
              "{:.0f} img/s ETA {}",
              epoch + 1, epochs, pos, steps_per_epoch, global_step, wl, wa, lr, format_scale(scaler.scale()),
              scaler.state().skipped_total, ips, format_duration(eta));
          if (progress.on()) {
            spdlog::debug("{}", line);  // the live line shows it; train.log gets it below
            if (log_file) log_file->write_info(line);
          } else {
            spdlog::info("{}", line);
          }
          if (metrics) metrics->write({{"kind", "step"},
                         {"step", global_step},
                         {"epoch", epoch + 1},
                         {"loss", json_number(wl)},
                         {"accuracy", json_number(wa)},
                         {"learning_rate", lr},
                         {"loss_scale", scaler.scale()},
                         {"skipped_steps", scaler.state().skipped_total},
                         {"images_per_sec", ips},
                         {"memory_bytes", be.memory_stats().current_bytes}});
          win_loss = win_correct = 0;
          win_count = win_images = 0;
          t_win = Clock::now();
        }
        if (progress.on()) {
          const double l = ep_count ? ep_loss_sum / static_cast<double>(ep_count) : std::nan("");
          const double a = ep_count ? static_cast<double>(ep_correct) / static_cast<double>(ep_count) : std::nan("");
          progress.show(fmt::format("epoch {}/{} {}/{} loss {:.4f} acc {:.4f} lr {:.3g} scale {} {:.0f} img/s ETA {}",
                                    epoch + 1, epochs, pos, steps_per_epoch, l, a, lr, format_scale(scaler.scale()),
                                    epoch_train_seconds > 0 ? static_cast<double>(epoch_images) / epoch_train_seconds
                                                            : 0.0,
                                    format_duration(eta)));
        }
        if (world_size > 1 ? o.stop : stop_requested().load()) {
          stop = true;
          stop_kind = "interrupted";
          break;
        }
        if (max_steps > 0 && global_step >= max_steps) {
          stop = true;
          stop_kind = "max_steps";
          break;
        }
      }
      progress.clear();
      // Not expected (every way out of the loop reads back), but never lose steps.
      if (engine->pending()) absorb(engine->flush());

      const bool epoch_done = loader.position() >= steps_per_epoch;
      const double train_loss = ep_count ? ep_loss_sum / static_cast<double>(ep_count) : std::nan("");
      const double train_acc = ep_count ? static_cast<double>(ep_correct) / static_cast<double>(ep_count) : 0.0;
      if (stop_kind == "interrupted") {
        // Save the exact position (mid-epoch); the partial epoch's sums go into the checkpoint.
        if (epoch_done) {
          result.final_train_loss = train_loss;
          result.final_train_accuracy = train_acc;
          ++epoch;
          result.epochs = epoch;
          save("last.ckpt", epoch, 0);
        } else {
          save("last.ckpt", epoch, loader.position());
        }
        break;
      }
      if (!epoch_done) {  // max_steps inside the epoch
        result.final_train_loss = train_loss;
        result.final_train_accuracy = train_acc;
        break;
      }

      // ---- end of a complete epoch ----
      result.final_train_loss = train_loss;
      result.final_train_accuracy = train_acc;
      ++epoch;
      result.epochs = epoch;
      const bool last_epoch = epoch >= epochs || (max_steps > 0 && global_step >= max_steps);
      const bool do_eval = last_epoch || (cfg.train.eval_every > 0 && epoch % cfg.train.eval_every == 0);
      json rec = {{"kind", "epoch"},
                  {"epoch", epoch},
                  {"step", global_step},
                  {"train_loss", json_number(train_loss)},
                  {"train_accuracy", train_acc},
                  {"test_loss", nullptr},
                  {"test_accuracy", nullptr},
                  {"learning_rate", sched.lr(std::max<int64_t>(0, global_step - 1))},
                  {"loss_scale", scaler.scale()},
                  {"skipped_steps", scaler.state().skipped_total},
                  {"epoch_skipped_steps", ep_skipped},
                  {"last_skip_reason", skip_reason_name(scaler.state().last_skip_reason)},
                  {"images_per_sec",
                   epoch_train_seconds > 0 ? static_cast<double>(epoch_images) / epoch_train_seconds : 0.0},
                  {"wall_seconds", prior_wall + seconds_since(t_start)}};
      bool improved = false;
      if (do_eval) {
        const EvalStats ev = evaluate();
        last_acc = ev.accuracy;
        last_test_loss = ev.loss;
        improved = ev.accuracy > best_acc || (best_acc == 0 && !fs::exists(ckpt_dir + "/best.ckpt"));
        best_acc = std::max(best_acc, ev.accuracy);
        result.final_test_accuracy = ev.accuracy;
        result.final_test_loss = ev.loss;
        result.best_test_accuracy = best_acc;
        rec["test_loss"] = json_number(ev.loss);
        rec["test_accuracy"] = ev.accuracy;
        if (sched.on_eval(ev.loss))
          spdlog::info("reduce_on_plateau: test loss has not improved for {} evaluations; learning rate -> {:g}",
                       cfg.schedule.patience, sched.state().plateau_lr);
        evaluated_at_end = last_epoch;
      }
      spdlog::info("epoch {}/{} done in {}: train loss {:.4f} acc {:.4f}{}; {:.0f} img/s, loss scale {}, {} skipped "
                   "steps this epoch{}",
                   epoch, epochs, format_duration(seconds_since(t_epoch)), train_loss, train_acc,
                   do_eval ? fmt::format(", test loss {:.4f} acc {:.4f} (best {:.4f}{})", last_test_loss, last_acc,
                                         best_acc, cfg.train.eval_policy == EvalPolicy::Float32 ? ", float32 eval" : "")
                           : std::string(),
                   rec["images_per_sec"].get<double>(), format_scale(scaler.scale()), ep_skipped,
                   ep_skipped ? std::string(", last reason ") + skip_reason_name(scaler.state().last_skip_reason)
                              : std::string());
      if (metrics) metrics->write(rec);
      ep_loss_sum = 0;
      ep_correct = ep_count = ep_skipped = 0;
      first_step = 0;
      if (improved) save("best.ckpt", epoch, 0);
      if (last_epoch || (cfg.train.checkpoint_every > 0 && epoch % cfg.train.checkpoint_every == 0))
        save("last.ckpt", epoch, 0);
      if (log_file) log_file->flush();
    }

    if (stop_kind == "interrupted") {
      result.status = "interrupted";
      result.exit_code = kExitInterrupted;
      result.message = fmt::format("interrupted after step {}; last.ckpt saved, continue with --resume {}",
                                   global_step, run_dir);
      spdlog::info("{}", result.message);
    } else {
      if (!evaluated_at_end) {
        const EvalStats ev = evaluate();
        last_acc = ev.accuracy;
        last_test_loss = ev.loss;
        best_acc = std::max(best_acc, ev.accuracy);
        result.final_test_accuracy = ev.accuracy;
        result.final_test_loss = ev.loss;
        result.best_test_accuracy = best_acc;
        spdlog::info("final evaluation: test loss {:.4f} acc {:.4f}", ev.loss, ev.accuracy);
        if (stop_kind == "max_steps") {
          if (metrics) metrics->write({{"kind", "epoch"},
                         {"epoch", epoch + 1},
                         {"partial", true},
                         {"step", global_step},
                         {"train_loss", json_number(result.final_train_loss)},
                         {"train_accuracy", result.final_train_accuracy},
                         {"test_loss", json_number(ev.loss)},
                         {"test_accuracy", ev.accuracy},
                         {"learning_rate", sched.lr(std::max<int64_t>(0, global_step - 1))},
                         {"loss_scale", scaler.scale()},
                         {"skipped_steps", scaler.state().skipped_total},
                         {"last_skip_reason", skip_reason_name(scaler.state().last_skip_reason)},
                         {"images_per_sec", run_train_seconds > 0 ? static_cast<double>(run_images) / run_train_seconds : 0.0},
                         {"wall_seconds", prior_wall + seconds_since(t_start)}});
          save("last.ckpt", epoch, loader.position() >= steps_per_epoch ? 0 : loader.position());
        }
      }
      result.status = "completed";
      result.exit_code = kExitOk;
      result.message.clear();
    }
  } catch (const DivergedError& e) {
    if (world_size > 1) collective_failure = true;  // every rank reaches it at the same step (shared verdicts)
    result.status = "diverged";
    result.exit_code = kExitDiverged;
    result.message = e.what();
  } catch (const Error& e) {
    result.status = "failed";
    result.exit_code = e.exit_code();
    result.message = e.what();
  } catch (const std::bad_alloc&) {
    result.status = "failed";
    result.exit_code = kExitInternal;
    result.message = "out of host memory";
  } catch (const std::exception& e) {
    result.status = "failed";
    result.exit_code = kExitInternal;
    result.message = std::string("internal error: ") + e.what();
  }
  progress.clear();
  if (result.exit_code != kExitOk && result.exit_code != kExitInterrupted) spdlog::error("{}", result.message);
  if (world_size > 1 && result.status == "completed" && engine) {
    // The loss scale and skip count must be the same on every rank (DESIGN.md): check it once.
    double v[2] = {engine->scaler().scale(), static_cast<double>(engine->scaler().state().skipped_total)};
    const double mine[2] = {v[0], v[1]};
    comm.all_reduce_sum(v, 2);
    if (v[0] != mine[0] * world_size || v[1] != mine[1] * world_size) {
      spdlog::error("internal error: the ranks disagree on the loss scale or the skipped steps");
      result.status = "failed";
      result.exit_code = kExitInternal;
    } else {
      spdlog::info("all {} ranks agree: loss scale {}, {} skipped steps", world_size,
                   format_scale(engine->scaler().scale()), engine->scaler().state().skipped_total);
    }
  }

  if (engine && engine->pending()) {
    // Steps queued under train.sync "log" when a failure ended the loop: their counters still count.
    try {
      engine->flush();
    } catch (const std::exception& e) {
      spdlog::debug("reading the last steps back: {}", e.what());
    }
  }
  if (engine) {
    result.skipped_steps = engine->scaler().state().skipped_total;
    result.final_loss_scale = engine->scaler().scale();
    result.last_skip_reason = skip_reason_name(engine->scaler().state().last_skip_reason);
  }
  result.wall_seconds = prior_wall + seconds_since(t_start);
  result.images_per_sec = run_train_seconds > 0 ? static_cast<double>(run_images) / run_train_seconds : 0.0;
  result.peak_memory_bytes = be.memory_stats().peak_bytes;
  if (rank0) {
    try {
      write_summary((dir / "summary.json").string(), result);
    } catch (const std::exception& e) {
      spdlog::error("cannot write summary.json: {}", e.what());
    }
  }
  if (result.status == "completed") {
    spdlog::info("completed: {} epoch{}, {} steps, test accuracy {:.4f} (best {:.4f}), {:.0f} img/s, {}",
                 result.epochs, result.epochs == 1 ? "" : "s", result.steps, result.final_test_accuracy, result.best_test_accuracy,
                 result.images_per_sec, format_duration(result.wall_seconds));
  }
  if (log_file) log_file->flush();
  if (world_size > 1 && !collective_failure && result.exit_code != kExitOk && result.exit_code != kExitInterrupted) {
    // This rank failed alone (the others may wait in a collective): end the whole job with its code.
    spdlog::error("stopping all {} ranks (exit code {})", world_size, result.exit_code);
    comm.abort(result.exit_code);
  }
  return result;
}

// ---- eval -------------------------------------------------------------------

EvalResult evaluate_checkpoint(const Config& cfg_in, const std::string& checkpoint) {
  Config cfg = cfg_in;
  const std::string path = resolve_checkpoint_path(checkpoint);
  const Checkpoint ck = load_checkpoint(path);
  const ResolvedDevice rd = resolve_device(cfg.device);
  std::unique_ptr<Backend> backend = create_backend(rd.device);
  std::string reason;
  const Policy policy = resolve_policy(cfg.policy, backend->info(), &reason);
  const Dataset test_ds = load_dataset(cfg.data, Split::Test, cfg.seed);
  check_input_shape(cfg, test_ds);
  Model model(cfg, policy, *backend, test_ds.H, test_ds.W, test_ds.C, test_ds.num_classes, cfg.data.batch_size);
  set_normalization(model, cfg);
  restore_weights(*backend, model, ck, path, cfg);
  BatchBuffers bb(*backend, cfg.data.batch_size, test_ds.H, test_ds.W, test_ds.C, test_ds.num_classes);
  const EvalStats ev = evaluate_model(*backend, model, bb, test_ds);
  EvalResult r;
  r.loss = ev.loss;
  r.accuracy = ev.accuracy;
  r.count = ev.count;
  r.policy = policy_name(policy);
  return r;
}

// ---- bench ------------------------------------------------------------------

BenchResult bench(const Config& cfg_in, int64_t steps, int64_t warmup) {
  if (steps <= 0) throw ConfigError("bench: steps must be > 0, got " + std::to_string(steps));
  if (warmup < 0) throw ConfigError("bench: warmup must be >= 0, got " + std::to_string(warmup));
  Config cfg = cfg_in;
  const ResolvedDevice rd = resolve_device(cfg.device);
  std::unique_ptr<Backend> backend = create_backend(rd.device);
  Backend& be = *backend;
  std::string reason;
  const Policy policy = resolve_policy(cfg.policy, be.info(), &reason);
  const LossScaleMode mode = effective_mode(cfg.loss_scale, policy);
  spdlog::info("{}; {}", rd.reason, reason);

  // Real data when it loads, else random uint8 images of the data set's shape.
  std::optional<Dataset> ds;
  try {
    ds = load_dataset(cfg.data, Split::Train, cfg.seed);
  } catch (const DataError& e) {
    spdlog::info("bench: no data ({}); timing random inputs", e.what());
  }
  int H = 28, W = 28, C = 1, K = 10;
  if (ds) {
    H = ds->H, W = ds->W, C = ds->C, K = ds->num_classes;
  } else if (cfg.model.input_shape.size() == 3) {
    H = static_cast<int>(cfg.model.input_shape[0]);
    W = static_cast<int>(cfg.model.input_shape[1]);
    C = static_cast<int>(cfg.model.input_shape[2]);
  } else if (cfg.data.dataset == DatasetName::Cifar10) {
    H = W = 32, C = 3;
  }
  const int64_t B = cfg.data.batch_size;
  Engine engine(cfg, policy, be, H, W, C, K, mode);
  set_normalization(engine.model(), cfg);
  engine.model().init_params(cfg.seed);
  const double lr = cfg.optimizer.learning_rate;

  std::vector<uint8_t> rnd_images;
  std::vector<int32_t> rnd_labels;
  std::optional<Loader> loader;
  Batch batch;
  if (ds) {
    loader.emplace(*ds, B, cfg.data.shuffle, true, cfg.data.augment, cfg.seed);
    if (loader->steps_per_epoch() == 0) loader.reset();
  }
  if (!loader) {
    Rng rng(cfg.seed);
    rnd_images.resize(static_cast<size_t>(B * H * W * C));
    rnd_labels.resize(static_cast<size_t>(B));
    for (auto& v : rnd_images) v = static_cast<uint8_t>(rng.uniform_int(256));
    for (auto& v : rnd_labels) v = static_cast<int32_t>(rng.uniform_int(static_cast<uint64_t>(K)));
  }
  int64_t epoch = 0;
  auto next = [&](const uint8_t*& x, const int32_t*& y, int64_t& n) {
    if (loader) {
      if (!loader->next(batch)) {
        loader->start_epoch(++epoch);
        loader->next(batch);
      }
      x = batch.images.data(), y = batch.labels.data(), n = batch.n;
    } else {
      x = rnd_images.data(), y = rnd_labels.data(), n = B;
    }
  };
  if (loader) loader->start_epoch(0);

  std::vector<double> ms;
  int64_t images = 0;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    const uint8_t* x;
    const int32_t* y;
    int64_t n;
    next(x, y, n);
    be.synchronize();
    const auto t = Clock::now();
    engine.step(x, y, n, n, lr, i);
    be.synchronize();
    if (engine.pending() && (i + 1) % std::max<int64_t>(1, cfg.train.log_every) == 0) engine.flush();
    const double dt = seconds_since(t) * 1e3;
    if (i >= warmup) {
      ms.push_back(dt);
      images += n;
    }
  }
  BenchResult r;
  if (engine.deferred()) {
    // train.sync log: the same number of steps again as one block, synchronising only at the end
    // (the steps above wait for the device after each one, as a per-step timer must).
    if (engine.pending()) engine.flush();
    be.synchronize();
    const auto t0 = Clock::now();
    int64_t block_images = 0;
    for (int64_t i = 0; i < steps; ++i) {
      const uint8_t* x;
      const int32_t* y;
      int64_t n;
      next(x, y, n);
      engine.step(x, y, n, n, lr, warmup + steps + i);
      block_images += n;
      if (engine.pending() && (i + 1) % std::max<int64_t>(1, cfg.train.log_every) == 0) engine.flush();
    }
    if (engine.pending()) engine.flush();
    be.synchronize();
    const double s_block = seconds_since(t0);
    r.images_per_sec_pipelined = s_block > 0 ? static_cast<double>(block_images) / s_block : 0.0;
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t m = sorted.size();
  r.step_ms_median = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);
  r.step_ms_min = sorted.front();
  r.step_ms_max = sorted.back();
  double total_ms = 0;
  for (double v : ms) total_ms += v;
  r.images_per_sec = total_ms > 0 ? static_cast<double>(images) / (total_ms / 1e3) : 0.0;
  r.peak_memory_bytes = be.memory_stats().peak_bytes;
  r.policy = policy_name(policy);
  r.device = rd.device;
  r.batch_size = B;
  r.steps = steps;
  r.memory = engine.model().memory_report();
  return r;
}

}  // namespace mpx
