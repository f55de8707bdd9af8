// SPDX-License-Identifier: MIT
// The one copy of the set-up every command shares (docs/design.md, "Train
// module layout"): device -> backend -> policy and loss-scale mode -> data ->
// model with its input normalization -> initial weights. `mpx train` runs the
// steps one at a time (each on every rank); eval, bench, inspect, validate and
// export call open() or the steps they need.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "data/dataset.h"
#include "nn/model.h"
#include "train/device.h"

namespace mpx {

/// [H, W, C] of the model input without reading data: model.input_shape, else the
/// data set's standard shape (32x32x3 for CIFAR-10, 28x28x1 for the others).
Shape config_input_shape(const Config& cfg);

/// Which splits a command reads.
enum class DataNeed { None, Test, TrainAndTest, TrainIfPresent };

class Session {
 public:
  /// Resolves the device (no backend yet). Throws ConfigError for a bad device string.
  explicit Session(const Config& cfg);

  /// Replaces the resolved device (data-parallel ranks pick their GPU by local rank).
  void set_device(ResolvedDevice d) { device_ = std::move(d); }
  /// Creates the backend on the resolved device, then resolves the policy and the
  /// loss-scale mode from its capabilities; config() then holds both.
  void start_backend();
  /// For commands that only plan (validate, export): the policy is resolved for the
  /// resolved device's capabilities where it is visible (else the CPU's), and the
  /// model is built on a CPU backend, without input normalization (it never runs).
  void plan_on_cpu();
  /// Reads the splits `need` names and checks them against model.input_shape.
  /// TrainIfPresent reads the training split when it loads (bench), else falls back
  /// to config_input_shape() and random inputs; data_note() then says why.
  void load_data(DataNeed need);

  /// The model for batches of up to `batch` records, with the data set's (or the
  /// config's) input normalization; `policy` overrides the resolved one.
  std::unique_ptr<Model> make_model(int64_t batch) const;
  std::unique_ptr<Model> make_model(int64_t batch, Policy policy, const Config& cfg) const;
  /// The model's layers and memory plan for `batch`, with nothing allocated (`mpx validate`).
  std::unique_ptr<Model> plan_model(int64_t batch) const;

  /// Initial weights of `m`: the safetensors file `weights`, else the checkpoint
  /// (file or run directory) `checkpoint`, else weights.init_from, else the seeded
  /// initialization. Returns where they came from, for the log.
  std::string init_weights(Model& m, const std::string& weights = "", const std::string& checkpoint = "");
  /// kernel_initializer patch_whitening (docs/fast-cifar.md): the first conv2d's kernel from
  /// the training images loaded (nothing when none are); ConfigError for a layer that is not
  /// the first or whose filters are not 2 x kernel area x channels.
  void apply_patch_whitening(Model& m) const;

  /// The config with the policy and loss-scale mode resolved (after start_backend/plan_on_cpu).
  const Config& config() const { return cfg_; }
  const Config& given() const { return given_; }
  const ResolvedDevice& device() const { return device_; }
  Backend& backend() const { return *backend_; }
  /// The capabilities the policy was resolved for (the target GPU under plan_on_cpu()).
  const DeviceInfo& target() const { return target_; }
  bool target_visible() const { return target_visible_; }
  Policy policy() const { return cfg_.policy; }
  const std::string& policy_reason() const { return policy_reason_; }
  bool auto_fell_back() const { return auto_fell_back_; }
  LossScaleMode loss_scale_mode() const { return cfg_.loss_scale.mode; }
  std::vector<std::string> warnings() const { return precision_warnings(cfg_, cfg_.policy, auto_fell_back_); }

  bool has_train() const { return has_train_; }
  const Dataset& train_data() const { return train_; }
  /// The records data.validation_split held out of the training split (TrainAndTest only;
  /// empty without a split).
  const Dataset& validation_data() const { return validation_; }
  bool has_validation() const { return validation_.size() > 0; }
  const Dataset& test_data() const { return test_; }
  const std::string& data_note() const { return data_note_; }
  int H() const { return H_; }
  int W() const { return W_; }
  int C() const { return C_; }
  int num_classes() const { return K_; }
  Shape input_shape() const { return Shape{H_, W_, C_}; }

 private:
  void resolve_policy_for(const DeviceInfo& info);
  void set_shape(const Dataset& ds);

  Config given_, cfg_;
  ResolvedDevice device_;
  std::unique_ptr<Backend> backend_;
  DeviceInfo target_;
  bool target_visible_ = false;
  bool plan_only_ = false;
  std::string policy_reason_;
  bool auto_fell_back_ = false;
  Dataset train_, validation_, test_;
  bool has_train_ = false;
  std::string data_note_;
  int H_ = 0, W_ = 0, C_ = 0, K_ = 10;
};

}  // namespace mpx
