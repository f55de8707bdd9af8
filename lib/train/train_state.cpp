// SPDX-License-Identifier: MIT
// TrainState <-> checkpoint (train_state.h).
#include "train/train_state.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include <cmath>

#include "core/error.h"
#include "weights/checkpoint_layout.h"

namespace mpx {

double EpochSums::loss() const { return count ? loss_sum / static_cast<double>(count) : std::nan(""); }
double EpochSums::accuracy() const { return count ? static_cast<double>(correct) / static_cast<double>(count) : 0.0; }

namespace {

std::vector<float> download_all(Backend& be, const Tensor& t) {
  if (t.empty()) return {};
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

}  // namespace

std::vector<std::string> model_signature(const Model& m) {
  std::vector<std::string> out;
  for (const ParamInfo& p : m.params()) out.push_back(fmt::format("{}/{} {}", p.layer, p.name, p.shape.str()));
  return out;
}

void restore_model(Backend& be, Model& m, const Checkpoint& ck, const std::string& path, const Config& cfg) {
  const Checkpoint own = in_model_layout(ck, m, path, cfg.name);  // throws for another model
  if (m.num_params() > 0) be.upload(m.master(), own.master.data());
  if (m.num_state() > 0) be.upload(m.state(), own.state.data());
  m.refresh_compute_copy();
}

Checkpoint make_checkpoint(const Config& cfg, const RunIdentity& who, const TrainState& st, int64_t epoch,
                           int64_t step_in_epoch, double wall_seconds, const TrainedParts& parts) {
  Checkpoint c;
  CheckpointHeader& h = c.header;
  h.config_name = cfg.name;
  h.policy = policy_name(cfg.policy);
  h.device = who.device;
  h.optimizer = enum_name(cfg.optimizer.name);
  h.dataset = enum_name(cfg.data.dataset);
  h.seed = cfg.seed;
  h.batch_size = cfg.data.batch_size;
  h.world_size = who.world_size;
  h.num_params = parts.model.num_params();
  h.num_state = parts.model.num_state();
  h.param_align = Model::param_alignment();
  h.epoch = epoch;
  h.step_in_epoch = step_in_epoch;
  h.global_step = st.global_step;
  h.applied_updates = parts.opt.iterations();
  h.scaler = parts.scaler.state();
  h.schedule = parts.sched.state();
  h.best_test_accuracy = st.best_test_accuracy;
  h.last_test_accuracy = st.last_test_accuracy;
  h.last_test_loss = st.last_test_loss;
  h.start_loss = st.start_loss;
  h.best_val_accuracy = st.best_val_accuracy;
  h.last_val_accuracy = st.last_val_accuracy;
  h.last_val_loss = st.last_val_loss;
  h.es_best = st.es_best;
  h.es_wait = st.es_wait;
  h.es_has_best = st.es_has_best;
  h.early_stopped = st.early_stopped;
  h.stopped_early_epoch = st.stopped_early_epoch;
  h.best_epoch_train_loss = st.best_epoch_train_loss;
  h.epochs_without_improvement = st.epochs_without_improvement;
  h.target_met = st.target_met;
  h.target_epoch = st.target_epoch;
  h.target_step = st.target_step;
  h.target_seconds = st.target_seconds;
  h.first_step_wall = st.first_step_wall;
  const bool mid_epoch = step_in_epoch != 0;
  h.epoch_loss_sum = mid_epoch ? st.sums.loss_sum : 0.0;
  h.epoch_correct = mid_epoch ? st.sums.correct : 0;
  h.epoch_count = mid_epoch ? st.sums.count : 0;
  h.epoch_skipped = mid_epoch ? st.sums.skipped : 0;
  h.wall_seconds = wall_seconds;
  h.final_train_loss = st.final_train_loss;
  h.final_train_accuracy = st.final_train_accuracy;
  h.params = model_signature(parts.model);
  c.master = download_all(parts.be, parts.model.master());
  c.state = download_all(parts.be, parts.model.state());
  c.opt = parts.opt.download_states();
  c.avg_master = st.avg_master;
  c.avg_state = st.avg_state;
  return c;
}

TrainState restore_checkpoint(const Checkpoint& file, const std::string& path, const Config& cfg,
                              int64_t steps_per_epoch, const TrainedParts& parts) {
  // Another size: in_model_layout names both counts. The same size: the shapes must agree too.
  const Checkpoint ck = in_model_layout(file, parts.model, path, cfg.name);
  const CheckpointHeader& h = ck.header;
  if (!h.params.empty()) {
    const std::vector<std::string> mine = model_signature(parts.model);
    for (size_t i = 0; i < std::max(mine.size(), h.params.size()); ++i) {
      const std::string a = i < h.params.size() ? h.params[i] : "(none)", b = i < mine.size() ? mine[i] : "(none)";
      if (a != b)
        throw ConfigError(fmt::format("checkpoint '{}' was written for another model: parameter #{} is {} there "
                                      "and {} in config '{}' (resume with the config the run started with)",
                                      path, i, a, b, cfg.name));
    }
  }
  restore_model(parts.be, parts.model, ck, path, cfg);
  if (h.optimizer != enum_name(cfg.optimizer.name))
    throw ConfigError(fmt::format("checkpoint '{}' was written by optimizer '{}', the config uses '{}'", path,
                                  h.optimizer, cfg.optimizer.name));
  if (h.dataset != enum_name(cfg.data.dataset))
    throw ConfigError(fmt::format("checkpoint '{}' was trained on data set '{}', the config reads '{}'", path,
                                  h.dataset, cfg.data.dataset));
  if (h.seed != cfg.seed)
    spdlog::warn("checkpoint '{}' was written by a run with seed {}, the config has {}: shuffling and dropout "
                 "continue from the new seed (the resumed run is not bit-exact)",
                 path, h.seed, cfg.seed);
  if (h.batch_size != cfg.data.batch_size)
    spdlog::warn("checkpoint '{}' was written with batch size {}, the config has {}: the position in the epoch "
                 "and the schedule are counted in the new batches (the resumed run is not bit-exact)",
                 path, h.batch_size, cfg.data.batch_size);
  parts.opt.upload_states(ck.opt);
  parts.opt.set_iterations(h.applied_updates);
  parts.scaler.set_state(h.scaler);
  parts.sched.set_state(h.schedule);
  TrainState st;
  st.epoch = h.epoch;
  st.step_in_epoch = h.step_in_epoch;
  st.global_step = h.global_step;
  st.best_test_accuracy = h.best_test_accuracy;
  st.last_test_accuracy = h.last_test_accuracy;
  st.last_test_loss = h.last_test_loss;
  st.start_loss = h.start_loss;
  st.best_val_accuracy = h.best_val_accuracy;
  st.last_val_accuracy = h.last_val_accuracy;
  st.last_val_loss = h.last_val_loss;
  st.es_best = h.es_best;
  st.es_wait = h.es_wait;
  st.es_has_best = h.es_has_best;
  st.early_stopped = h.early_stopped;
  st.stopped_early_epoch = h.stopped_early_epoch;
  st.best_epoch_train_loss = h.best_epoch_train_loss;
  st.epochs_without_improvement = h.epochs_without_improvement;
  st.target_met = h.target_met;
  st.target_epoch = h.target_epoch;
  st.target_step = h.target_step;
  st.target_seconds = h.target_seconds;
  st.first_step_wall = h.first_step_wall;
  st.avg_master = ck.avg_master;
  st.avg_state = ck.avg_state;
  st.sums.loss_sum = h.epoch_loss_sum;
  st.sums.correct = h.epoch_correct;
  st.sums.count = h.epoch_count;
  st.sums.skipped = h.epoch_skipped;
  st.prior_wall_seconds = h.wall_seconds;
  st.final_train_loss = h.final_train_loss;
  st.final_train_accuracy = h.final_train_accuracy;
  if (st.step_in_epoch >= steps_per_epoch) {
    ++st.epoch;
    st.step_in_epoch = 0;
  }
  return st;
}

}  // namespace mpx
