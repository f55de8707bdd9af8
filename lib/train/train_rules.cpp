// SPDX-License-Identifier: MIT
// `mpx train`'s rules applied between steps and at epoch ends (train_run.h): the time to
// train.target_accuracy, train.lookahead's averaged weights, train.divergence_patience and
// train.early_stopping (docs/fast-cifar.md, docs/precision.md "When training stops",
// docs/design.md "Validation split").
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "train/lookahead.h"
#include "train/train_run.h"

using nlohmann::json;

namespace mpx::train_detail {

bool TrainRun::reach_target(double accuracy, int64_t epoch, json& rec) {
  const double target = cfg().train.target_accuracy;
  if (target <= 0 || st_.target_met || !(accuracy >= target)) return false;
  st_.target_met = true;
  st_.target_epoch = epoch;
  st_.target_step = st_.global_step;
  st_.target_seconds = st_.prior_wall_seconds + seconds_since(t_start_) - std::max(0.0, st_.first_step_wall);
  rec["target_reached"] = true;
  rec["time_to_target_seconds"] = st_.target_seconds;
  spdlog::info("target accuracy {:.4f} reached after epoch {} (step {}): {:.4f}, {} from the first step{}", target,
               epoch, st_.global_step, accuracy, format_duration(st_.target_seconds),
               cfg().train.stop_at_target ? "; stopping (train.stop_at_target)" : "");
  return true;
}

void TrainRun::start_lookahead() {
  if (cfg().train.lookahead.every <= 0) {
    st_.avg_master.clear();
    st_.avg_state.clear();
    return;
  }
  Model& m = engine_->model();
  const auto fits = [](const std::vector<float>& v, const Tensor& t) { return static_cast<int64_t>(v.size()) == (t.empty() ? 0 : t.numel()); };
  if (!st_.avg_master.empty() && fits(st_.avg_master, m.master()) && fits(st_.avg_state, m.state())) return;
  if (st_.global_step > 0)
    spdlog::warn("train.lookahead: the checkpoint holds no averaged weights; averaging starts again from the current ones");
  st_.avg_master.assign(static_cast<size_t>(m.num_params()), 0.0f);
  st_.avg_state.assign(static_cast<size_t>(m.num_state()), 0.0f);
  if (m.num_params() > 0) be().download(st_.avg_master.data(), m.master());
  if (m.num_state() > 0) be().download(st_.avg_state.data(), m.state());
}

void TrainRun::lookahead(double decay) {
  // avg += (1 - decay) (w - avg); w = avg, for the master weights and the batch-norm statistics,
  // in float32 on the host, so that both backends compute the same bits.
  Model& m = engine_->model();
  if (engine_->pending()) absorb(engine_->flush());
  std::vector<float> cur;
  const auto mix = [&](std::vector<float>& avg, const Tensor& t) {
    if (t.empty() || t.numel() == 0) return;
    cur.resize(static_cast<size_t>(t.numel()));
    be().download(cur.data(), t);
    lookahead_mix(avg, cur, decay);
    be().upload(t, cur.data());
  };
  mix(st_.avg_master, m.master());
  mix(st_.avg_state, m.state());
  m.refresh_compute_copy();
}

void TrainRun::check_train_loss_plateau(double train_loss, int64_t epoch) {
  // train.divergence_patience (docs/precision.md, "When training stops"): the train loss, never
  // a held-out split, so the check cannot leak test data into the choice.
  const int64_t patience = cfg().train.divergence_patience;
  if (patience <= 0 || !std::isfinite(train_loss)) return;
  if (st_.best_epoch_train_loss <= 0 || train_loss < st_.best_epoch_train_loss) {
    st_.best_epoch_train_loss = train_loss;
    st_.epochs_without_improvement = 0;
    return;
  }
  if (++st_.epochs_without_improvement < patience) return;
  throw DivergedError(fmt::format(
      "training diverged: the train loss has not improved on its best {:.4g} for {} epochs in a row (epoch {}: "
      "{:.4g}; train.divergence_patience {}); try a lower optimizer.learning_rate (a tenth of {:g}) or a "
      "schedule that lowers it (cosine, reduce_on_plateau); train.divergence_patience: 0 turns this check off",
      st_.best_epoch_train_loss, st_.epochs_without_improvement, epoch, train_loss, patience,
      cfg().optimizer.learning_rate));
}

bool TrainRun::early_stop_after(const EvalResult& val, int64_t epoch, bool& improved) {
  // Keras EarlyStopping (2.x): every evaluation counts one more wait; an improvement by more
  // than min_delta resets it; a wait of `patience` (at least one) on a non-improvement stops.
  const EarlyStoppingConfig& es = cfg().train.early_stopping;
  if (es.monitor == EarlyStopMonitor::None) return false;
  const bool loss = es.monitor == EarlyStopMonitor::ValLoss;
  const double current = loss ? val.loss : val.accuracy;
  ++st_.es_wait;
  const bool better = !st_.es_has_best || (loss ? current < st_.es_best - es.min_delta
                                                 : current > st_.es_best + es.min_delta);
  improved = better;
  if (better) {
    st_.es_best = current;
    st_.es_has_best = true;
    st_.es_wait = 0;
    return false;
  }
  if (st_.es_wait < es.patience) return false;
  st_.early_stopped = true;
  st_.stopped_early_epoch = result_.stopped_early_epoch = epoch;
  spdlog::info("early stopping: {} has not improved by more than {:g} for {} evaluation{} (best {:.4f}); stopping "
               "after epoch {}",
               enum_name(es.monitor), es.min_delta, st_.es_wait, st_.es_wait == 1 ? "" : "s", st_.es_best, epoch);
  return true;
}

}  // namespace mpx::train_detail
