// SPDX-License-Identifier: MIT
// The validated configuration of one run, with every default filled in. The
// member initializers below are the defaults; each key's path, range, help and
// YAML spelling is its ONE entry in config/schema_table.cpp, which drives the
// reader, the writer (to_yaml) and docs/config.md. Loading checks types, ranges
// and unknown keys and throws ConfigError naming the file, key path, line and column.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/enums.h"

namespace mpx {

/// "float32", "mixed_float16", "mixed_bfloat16", "auto" (enum_name of config/enums.h).
inline const char* policy_name(Policy p) { return enum_name(p); }
inline const char* loss_scale_mode_name(LossScaleMode m) { return enum_name(m); }
/// The inverse of policy_name / loss_scale_mode_name; nullopt for an unknown name.
inline std::optional<Policy> parse_policy(const std::string& s) { return parse_enum<Policy>(s); }
inline std::optional<LossScaleMode> parse_loss_scale_mode(const std::string& s) { return parse_enum<LossScaleMode>(s); }

/// One rule of a per-parameter list (optimizer.lr_multipliers, ...): the parameters whose
/// name "<layer>/<parameter>" matches the glob `pattern` (* and ?) take `value`; the
/// first matching rule of a list wins (docs/fast-cifar.md, "Parameter groups").
struct ParamRule {
  std::string pattern;
  double value = 0;
  bool operator==(const ParamRule& o) const { return pattern == o.pattern && value == o.value; }
};

struct LossScaleConfig {
  /// Unset in the YAML: dynamic for mixed_float16, none otherwise (resolved by
  /// the trainer once the policy is resolved; `mode_explicit` says whether the user set it).
  LossScaleMode mode = LossScaleMode::None;
  bool mode_explicit = false;
  double initial = 32768.0;
  int64_t growth_interval = 2000;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  double min_scale = 1.0;
  int64_t max_consecutive_skips = 50;
};

struct AugmentConfig {
  int random_crop_padding = 0;
  /// Outside the image the crop sees zeros, or the image mirrored about its edge pixel.
  PadMode padding_mode = PadMode::Zeros;
  bool horizontal_flip = false;
  /// random: each epoch flips each image with probability 1/2; alternating: epoch 0 as
  /// random, then every image flips on the epochs where its epoch-0 choice is inverted.
  FlipMode flip_mode = FlipMode::Random;
};

struct DataConfig {
  DatasetName dataset = DatasetName::Mnist;  // required in the YAML
  std::string path;                          // "" = data/<dataset> (filled in by the reader)
  int64_t batch_size = 128;
  int64_t train_limit = 0;  // 0 = all
  int64_t test_limit = 0;
  bool drop_last = false;
  bool shuffle = true;
  /// Per-channel; empty = the dataset's standard statistics.
  std::vector<double> mean, std;
  AugmentConfig augment;
  /// synthetic only: records per split and classes.
  int64_t synthetic_train = 1024, synthetic_test = 256;
  /// Training records held out for validation: a fraction in (0, 1), or a count >= 1;
  /// 0 = none. Drawn with the seed (docs/design.md, "Validation split").
  double validation_split = 0;
};

/// One layer of `model.layers`. Fields that do not apply to the type keep their defaults.
struct LayerConfig {
  LayerType type = LayerType::Dense;  // required in the YAML
  std::string name;  // default (Keras style): <type>, then <type>_1, <type>_2, ... unique over the model
  std::optional<LayerDType> dtype;  // unset = the model's policy
  // Keys that several types share (LayerShares in config/enums.h).
  int kernel_h = 3, kernel_w = 3;  // kConvWindow
  int stride_h = 1, stride_w = 1;  // kConvWindow
  int pool_h = 2, pool_w = 2;      // kPoolWindow
  int pool_stride_h = 0, pool_stride_w = 0;  // kPoolWindow; 0 = pool size (the loader always fills them in)
  Padding padding = Padding::Valid;  // kPadding
  bool use_bias = true;              // kBias
  ActivationName activation = ActivationName::Linear;  // kActivation: core/activation.h's names, or softmax
  double negative_slope = 0.2;  // kActivation, leaky_relu (Keras 3's activation default; Keras 2's layer had 0.3)
  // The keys of one type each: `filters` (conv2d), `units` (dense), `rate` (dropout), `layers`
  // (residual), ... as the layer table declares them.
#define MPX_LAYER_KEY(id, type, field, init, ...) type field = init;
#define MPX_LAYER_SIZE(id, type, field, init, ...) type field = init;
#include "config/layer_table.inc"
  /// Position in the YAML for error messages ("model.layers[3]", line, column).
  std::string key_path;
  int line = 0, column = 0;
};

struct ModelConfig {
  std::vector<int64_t> input_shape;  // H, W, C; empty = from the dataset
  std::vector<LayerConfig> layers;
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::Adam;
  double learning_rate = 1e-3;
  bool scale_lr_by_batch = false;
  double momentum = 0.0;  // sgd
  bool nesterov = false;  // sgd
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-7;
  double weight_decay = 0.0;
  /// Per-parameter multipliers of the learning rate and of weight_decay, and the epoch from
  /// which a parameter is no longer updated (docs/fast-cifar.md, "Parameter groups").
  std::vector<ParamRule> lr_multipliers, weight_decay_multipliers, freeze_after_epochs;
};

struct ScheduleConfig {
  ScheduleName name = ScheduleName::Constant;
  double warmup_epochs = 0;
  // step
  int64_t step_epochs = 10;   // multiply by gamma every step_epochs
  double gamma = 0.1;
  // cosine
  double min_lr = 0.0;
  // triangular: start_factor * base at step 0, base at peak_fraction of the run, end_factor * base at its end
  double start_factor = 0.2, peak_fraction = 0.2, end_factor = 0.0;
  // reduce_on_plateau (Keras ReduceLROnPlateau on the test loss)
  double factor = 0.1;
  int64_t patience = 10;
  double min_delta = 1e-4;
  int64_t cooldown = 0;
};

/// Keras EarlyStopping on the validation split (docs/design.md, "Validation split").
struct EarlyStoppingConfig {
  EarlyStopMonitor monitor = EarlyStopMonitor::None;
  int64_t patience = 0;
  double min_delta = 0;
  bool restore_best = false;  // Keras restore_best_weights
};

/// Lookahead on the weights (docs/fast-cifar.md, "Lookahead"): every `every` steps the
/// averaged weights move towards the trained ones by 1 - decay_t, decay_t = decay *
/// (step / total steps)^power, and the trained weights are set to them.
struct LookaheadConfig {
  int64_t every = 0;  // 0 = off
  double decay = 0.7737809375;  // 0.95^5
  double power = 3.0;
};

struct TrainConfig {
  int64_t epochs = 1;
  int64_t log_every = 50;
  int64_t eval_every = 1;
  EvalPolicy eval_policy = EvalPolicy::Same;
  int64_t checkpoint_every = 1;
  int64_t max_steps = 0;  // 0 = no limit (stop early after this many steps; sweeps and tests)
  /// Keras' label_smoothing of the categorical cross-entropy, in training (the test loss is
  /// the plain cross-entropy).
  double label_smoothing = 0.0;
  /// A finite train loss past this many times the run's starting loss ends the run as
  /// diverged (exit 4), under every policy; 0 = off (docs/precision.md, "When training stops").
  double divergence_factor = 100.0;
  /// Also diverged when the epoch's train loss has not improved on its best for this many
  /// epochs in a row; 0 = off.
  int64_t divergence_patience = 0;
  EarlyStoppingConfig early_stopping;
  /// Test-time augmentation of every evaluation (docs/fast-cifar.md, "Test-time augmentation").
  TtaMode tta = TtaMode::None;
  /// The accuracy the run is timed to (summary.json's time_to_target); 0 = none. The
  /// evaluation of the epoch (validation split, else test split) decides.
  double target_accuracy = 0.0;
  /// Stop once target_accuracy is met.
  bool stop_at_target = false;
  LookaheadConfig lookahead;
  /// Write TensorBoard event files under <run>/tensorboard (docs/report.md).
  bool tensorboard = true;
  /// When the host reads the step's loss and finiteness verdict: Step (every step: per-step
  /// skip diagnostics), Log (the loss scale, verdicts and metrics stay on the device and are
  /// read every log_every steps: no host synchronisation in the step), Auto (Log on a GPU
  /// with one rank, else Step).
  SyncMode sync = SyncMode::Auto;
  /// Capture the steady-state step (full batches, sync "log") as a CUDA graph and replay it.
  /// Off by default until the CUDA test that proves it equal to the uncaptured step has run
  /// on a GPU (tests/cuda/test_cuda_train.cpp).
  bool cuda_graph = false;
};

struct DebugConfig {
  bool check_numerics = false;
};

struct WeightsConfig {
  /// A safetensors file (keras or pytorch layout, as `mpx export` writes) loaded
  /// after initialization; "" = none. Relative paths: as data.path (load_config).
  std::string init_from;
};

/// Data-parallel training (more than one rank).
struct DistConfig {
  /// All-reduce gradient buckets while the backward pass runs: Auto = on with NCCL on GPUs, off on the CPU.
  OverlapMode overlap_allreduce = OverlapMode::Auto;
  int64_t bucket_bytes = int64_t{4} << 20;  // smallest bucket of the overlapped all-reduce
};

/// The CUDA backend.
struct CudaConfig {
  int64_t workspace_mb = 512;  // cuDNN / cuBLASLt workspace budget
  /// How convolution algorithms are chosen: cuDNN's heuristic ranking (repeatable) or by
  /// measuring them (search; may differ from run to run).
  ConvAlgo conv_algo = ConvAlgo::Heuristic;
  bool deterministic = false;  // deterministic convolution algorithms only
};

/// The CPU backend.
struct CpuConfig {
  /// 3x3 stride-1 convolutions on the Winograd kernel: auto (a fixed rule by shape and
  /// ISA), off (oneDNN's direct kernels, their exact numerics), on (F(4x4,3x3) wherever it
  /// applies), f2 (F(2x2,3x3) wherever it applies).
  CpuWinograd winograd = CpuWinograd::Auto;
};

struct Config {
  std::string name = "run";
  uint64_t seed = 42;
  std::string device = "auto";  // auto | cpu | cuda | cuda:N
  Policy policy = Policy::Float32;
  LossScaleConfig loss_scale;
  DataConfig data;
  ModelConfig model;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainConfig train;
  DebugConfig debug;
  WeightsConfig weights;
  DistConfig dist;
  CudaConfig cuda;
  CpuConfig cpu;
  /// Where it was loaded from ("" for strings), for messages.
  std::string source;
};

/// @brief Loads and validates a YAML config file, applying `overrides`
/// ("key.path=value", as from --set) before validation. Throws ConfigError.
/// Paths (data.path, weights.init_from) come back absolute: relative ones written in
/// the file are relative to the file's folder, the others (--set values, the
/// data/<dataset> default) to the current folder (docs/config.md, "Paths").
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
/// @brief The same from YAML text; `source` names it in messages.
Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {});
/// @brief The resolved config as YAML: every key, defaults filled in. Loading the
/// result gives back an equal Config.
std::string to_yaml(const Config& c);
/// @brief The config reference (docs/config.md) as Markdown, generated from the schema.
std::string config_reference_markdown();

}  // namespace mpx
