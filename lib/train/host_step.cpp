// SPDX-License-Identifier: MIT
// The host-synchronised training step (stepper.h) and the Engine that owns a
// model's training parts.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/env.h"
#include "core/error.h"
#include "core/rng.h"
#include "train/stepper.h"

namespace mpx {

std::atomic<bool>& stop_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

namespace {

/// MPX_DEBUG_INJECT_INF="RANK:STEP" writes +inf into the first gradient of rank RANK at
/// global step STEP, after its backward pass and before the all-reduce (an overflow on one
/// rank's shard; docs/environment.md). -1 when unset or for another rank.
int64_t inject_inf_step(int rank) {
  const std::string v = env_string("MPX_DEBUG_INJECT_INF");
  if (v.empty()) return -1;
  int r = -1;
  long long st = -1;
  char tail = 0;
  if (std::sscanf(v.c_str(), "%d:%lld%c", &r, &st, &tail) != 2 || r < 0 || st < 0)
    throw ConfigError(fmt::format("environment variable MPX_DEBUG_INJECT_INF='{}': expected RANK:STEP, e.g. 0:3", v));
  return r == rank ? st : -1;
}

class HostStepper final : public Stepper {
 public:
  HostStepper(const StepParts& p, std::string why) : p_(p), world_(p.comm ? p.comm->world_size() : 1) {
    what_ = fmt::format("the step reads its loss and verdict back every step ({})", why);
    p_.sync.set_before_send([this] {
      if (cur_step_ != p_.inject_step) return;
      spdlog::warn("MPX_DEBUG_INJECT_INF: writing inf into this rank's gradients at step {}", cur_step_);
      p_.be.fill(p_.model.grads().flat_view(0, Shape{1}), std::numeric_limits<float>::infinity());
    });
  }

  StepOutcome step(const uint8_t* images, const int32_t* labels, int64_t n, int64_t global_n, double lr,
                   int64_t global_step) override {
    StepOutcome o;
    o.n = n;
    std::string forward_where;
    forward(images, labels, n, global_n, global_step, o, forward_where);
    bool forward_bad = !forward_where.empty();
    if (world_ > 1) share_verdicts(n, o, forward_bad);
    o.loss_finite = std::isfinite(o.loss_sum);
    if (!forward_bad) forward_where.clear();
    else if (forward_where.empty()) forward_where = "(on another rank)";

    if (!o.loss_finite) {
      if (p_.policy == Policy::Float32) {
        throw DivergedError(fmt::format(
            "training diverged: the loss is {} at step {} under policy float32{}; {}. {}",
            std::isnan(o.loss_sum) ? "NaN" : "inf", global_step,
            world_ > 1 ? fmt::format(" (summed over the {} ranks)", world_) : std::string(),
            forward_where.empty() ? "every layer output was finite, the loss itself overflowed"
                                  : "first non-finite output: layer " + forward_where,
            divergence_advice(Policy::Float32, p_.cfg.loss_scale.mode)));
      }
      o.reason = forward_bad ? SkipReason::NonfiniteForward : SkipReason::NonfiniteLoss;
    } else {
      backward_and_update(n, lr, global_step, o);
    }
    update_scaler(o, forward_where, global_step);
    o.skipped = o.applied ? 0 : 1;
    o.counted = o.loss_finite ? o.n : 0;
    return o;
  }

 private:
  StepParts p_;
  int world_;
  int64_t cur_step_ = -1;

  void forward(const uint8_t* images, const int32_t* labels, int64_t n, int64_t global_n, int64_t global_step,
               StepOutcome& o, std::string& forward_where) {
    float loss = 0, correct = 0;
    if (n > 0) {
      const Tensor x = p_.bb.images(n), y = p_.bb.labels(n), dl = p_.bb.dl(n);
      p_.be.upload(x, images);
      p_.be.upload(y, labels);
      const Tensor logits = p_.model.forward(x, true, p_.dropout_seed, static_cast<uint64_t>(global_step));
      // The loss gradient is S * (this shard's mean loss) weighted by n * world / global_n, so that the
      // sum over ranks divided by world is S * the global batch's mean loss (the weight is exactly 1
      // when the shards are equal, and with one rank).
      const double w = world_ > 1 ? static_cast<double>(n) * world_ / static_cast<double>(global_n) : 1.0;
      p_.be.softmax_cross_entropy(logits, y, static_cast<float>(p_.scaler.scale() * w), p_.bb.loss(), p_.bb.correct(),
                                  dl, static_cast<float>(p_.cfg.train.label_smoothing));
      p_.be.download(&loss, p_.bb.loss());
      p_.be.download(&correct, p_.bb.correct());
      if (p_.cfg.debug.check_numerics) {
        const std::string bad = p_.model.first_nonfinite_forward();
        if (!bad.empty()) spdlog::warn("check_numerics: step {}: first non-finite forward output: {}", global_step, bad);
      }
      if (!std::isfinite(loss)) forward_where = p_.model.first_nonfinite_forward();
    }
    o.loss_sum = loss;
    o.correct = correct;
  }

  /// One small all-reduce: the global batch's metrics, and the verdicts every rank must share
  /// (a non-finite loss on any rank makes the sum non-finite; a stop request on any rank).
  void share_verdicts(int64_t n, StepOutcome& o, bool& forward_bad) {
    double v[5] = {o.loss_sum, o.correct, static_cast<double>(n), forward_bad ? 1.0 : 0.0,
                   stop_requested().load() ? 1.0 : 0.0};
    p_.comm->all_reduce_sum(v, 5);
    o.loss_sum = v[0], o.correct = v[1], o.n = static_cast<int64_t>(std::llround(v[2]));
    forward_bad = v[3] > 0;
    o.stop = v[4] > 0;
  }

  void backward_and_update(int64_t n, double lr, int64_t global_step, StepOutcome& o) {
    const double S = p_.scaler.scale();
    cur_step_ = global_step;
    p_.sync.begin_step();
    if (n > 0) {
      p_.model.backward(p_.bb.dl(n));  // with overlap, the buckets' all-reduces start in here
    } else if (p_.model.num_params() > 0) {
      p_.be.fill(p_.model.grads(), 0.0f);  // no records on this rank this step: it adds nothing
    }
    if (p_.cfg.debug.check_numerics) {
      const std::string bad = p_.model.first_nonfinite_backward();
      if (!bad.empty())
        spdlog::warn("check_numerics: step {}: first non-finite gradient (loss scale {}): {}", global_step,
                     format_scale(S), bad);
    }
    // Summed while still scaled (inf/NaN propagate), then unscaled by 1/(S * world): the average,
    // and the same finiteness verdict on every rank.
    p_.sync.reduce();
    const bool finite =
        p_.be.unscale_and_check(p_.model.grads(), static_cast<float>(1.0 / (S * static_cast<double>(world_))));
    if (finite) {
      p_.opt.step(p_.model.master(), p_.model.grads(), p_.model.compute_copy(), lr);
      o.applied = true;
    } else {
      o.reason = SkipReason::BackwardOverflow;
    }
  }

  void update_scaler(const StepOutcome& o, const std::string& forward_where, int64_t global_step) {
    const double before = p_.scaler.scale();
    p_.scaler.update(o.applied, o.reason, [&]() -> std::string {
      if (o.reason == SkipReason::BackwardOverflow) {
        const std::string b = p_.model.first_nonfinite_backward();
        return b.empty() ? "the forward pass was finite" : "forward pass finite, first non-finite gradient: " + b;
      }
      return forward_where.empty() ? "every layer output was finite, the loss overflowed"
                                   : "first non-finite forward output: " + forward_where;
    });
    if (!o.applied) {
      p_.opt.skip();
      spdlog::info("step {}: skipped ({}), loss scale {} -> {}", global_step, skip_reason_name(o.reason),
                   format_scale(before), format_scale(p_.scaler.scale()));
    }
  }
};

}  // namespace

std::unique_ptr<Stepper> make_host_stepper(const StepParts& p, std::string why) {
  return std::make_unique<HostStepper>(p, std::move(why));
}

Engine::Engine(const Config& cfg, Policy policy, Backend& be, std::unique_ptr<Model> model, LossScaleMode mode,
               Communicator* comm, int64_t local_batch, Communicator* device_comm)
    : model_(std::move(model)),
      opt_(cfg.optimizer, be, model_->num_params()),
      scaler_(cfg.loss_scale, mode),
      bb_(be, local_batch > 0 ? local_batch : cfg.data.batch_size, static_cast<int>(model_->input_shape()[0]),
          static_cast<int>(model_->input_shape()[1]), static_cast<int>(model_->input_shape()[2]),
          model_->num_classes()),
      sync_(be, *model_, comm, device_comm, cfg.dist) {
  opt_.set_groups(model_->params());
  const int rank = comm ? comm->rank() : 0;
  const StepParts parts{cfg, policy, mode, be, *model_, opt_, scaler_, bb_, sync_, comm,
                        // Dropout masks differ between ranks (rank 0 keeps the single-process masks).
                        rank > 0 ? mix64(cfg.seed + static_cast<uint64_t>(rank)) : cfg.seed, inject_inf_step(rank)};
  std::string why;
  stepper_ = make_device_stepper(parts, &why);
  if (!stepper_) {
    if (cfg.train.sync == SyncMode::Log) spdlog::warn("train.sync: log is not possible here ({}); the step reads back every step", why);
    stepper_ = make_host_stepper(parts, why);
  }
}

}  // namespace mpx
