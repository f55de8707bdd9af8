// SPDX-License-Identifier: MIT
// THE config schema: one entry per key (config/schema.h says what reads it).
// A new key = its field in config/config.h (the member initializer is the
// default) + one line here; the reader, to_yaml, docs/config.md and the
// round-trip test pick it up from this table. Regenerate the reference with
// `mpx config-reference > docs/config.md` (a test fails while it is stale).
#include <fmt/format.h>

#include <map>

#include "config/schema_values.h"

namespace mpx::schema {

using config_detail::kI64Max;
using config_detail::kIntMax;

namespace {

/// Schedules compute with the epoch count in float; a million epochs is far
/// past any real run and keeps epoch / epochs meaningful (docs/inputs.md).
constexpr int64_t kMaxEpochs = 1000000;
/// Converted to bytes (<< 20) in a size_t: 1 TiB is more than any GPU holds.
constexpr int64_t kMaxWorkspaceMb = int64_t{1} << 20;

std::string check_run_name(const std::string& s) {
  if (s.find_first_of("/\\") == std::string::npos) return "";
  return fmt::format("expected a run name without '/' or '\\', got '{}'", config_detail::clip(s));
}

void default_data_path(Config& c) { c.data.path = std::string("data/") + enum_name(c.data.dataset); }

void default_pool_strides(LayerConfig& l) {  // Keras: strides default to the pool size
  l.pool_stride_h = l.pool_h;
  l.pool_stride_w = l.pool_w;
}

void check_normalize(const Reader& r, const Origin& at, const std::string& path, Config& c) {
  if (c.data.mean.size() != c.data.std.size())
    r.fail(at, path,
           fmt::format("mean and std must have the same length (one value per channel), got {} and {}",
                       c.data.mean.size(), c.data.std.size()));
}

void collect_names(const Reader& r, const std::vector<LayerConfig>& layers,
                   std::map<std::string, const LayerConfig*>& taken) {
  for (const auto& L : layers) {
    if (!L.name.empty()) {
      auto [it, fresh] = taken.emplace(L.name, &L);
      if (!fresh) {
        Origin o;
        o.line = L.line;
        o.column = L.column;
        r.fail(o, L.key_path + ".name",
               fmt::format("duplicate layer name '{}' (also used by {})", L.name, it->second->key_path));
      }
    }
    collect_names(r, L.layers, taken);
  }
}

void assign_names(std::vector<LayerConfig>& layers, std::map<std::string, const LayerConfig*>& taken,
                  std::map<LayerType, int>& counters) {
  for (auto& L : layers) {
    if (L.name.empty()) {
      int& k = counters[L.type];
      std::string candidate;
      do {
        candidate = k == 0 ? enum_name(L.type) : fmt::format("{}_{}", enum_name(L.type), k);
        ++k;
      } while (taken.count(candidate));
      L.name = candidate;
      taken.emplace(candidate, &L);
    }
    assign_names(L.layers, taken, counters);
  }
}

/// Keras-style default names (conv2d, conv2d_1, ...), unique over the whole
/// model including nested layers; explicit names must be unique.
void name_layers(const Reader& r, const Origin&, const std::string&, Config& c) {
  std::map<std::string, const LayerConfig*> taken;
  collect_names(r, c.model.layers, taken);
  std::map<LayerType, int> counters;
  assign_names(c.model.layers, taken, counters);
}

}  // namespace

const std::vector<MapCheck>& map_checks() {
  static const std::vector<MapCheck> checks = {{"data.normalize", check_normalize}, {"model", name_layers}};
  return checks;
}

const std::vector<Key<Config>>& config_keys() {
  using R = Range;
  const auto k = [](auto&&... a) { return key<Config>(std::forward<decltype(a)>(a)...); };
  // clang-format off
  static const std::vector<Key<Config>> keys = {
    MPX_KEY(name, Str(check_run_name), "run name; the run directory defaults to runs/<name>-<timestamp>"),
    MPX_KEY(seed, UInt64(), "one seed for init, shuffling, augmentation and dropout"),
    MPX_KEY(device, Device(), "where to train; auto: the first GPU, else the CPU"),
    MPX_KEY(policy, Enum<Policy>(), "precision policy (Keras names); auto: chosen from the device at start"),

    k("loss_scale.mode", MPX_HW(loss_scale.mode, loss_scale.mode_explicit), FlaggedEnum<LossScaleMode>(),
      "loss scaling (Keras LossScaleOptimizer)").doc_default("dynamic for mixed_float16, else none"),
    MPX_KEY(loss_scale.initial, Num(R::gt(0)), "the first loss scale S"),
    MPX_KEY(loss_scale.growth_interval, Int(1, kI64Max), "dynamic: S grows after this many finite steps in a row"),
    MPX_KEY(loss_scale.growth_factor, Num(R::gt(1)), "dynamic: S is multiplied by this to grow"),
    MPX_KEY(loss_scale.backoff_factor, Num(R::open(0, 1)), "dynamic: S is multiplied by this after a non-finite step"),
    MPX_KEY(loss_scale.min_scale, Num(R::gt(0)), "dynamic: S never backs off below this"),
    MPX_KEY(loss_scale.max_consecutive_skips, Int(1, kI64Max),
      "stop (exit code 4) after this many skipped steps in a row"),

    MPX_KEY(data.dataset, Enum<DatasetName>(), "the data set").req(),
    MPX_KEY(data.path, Str(), "folder with the official files").derived(default_data_path, "data/<dataset>"),
    MPX_KEY(data.batch_size, Int(1, kIntMax), "images per step (per rank)"),
    MPX_KEY(data.train_limit, Int(0, kI64Max), "use only the first N training records (0 = all)"),
    MPX_KEY(data.test_limit, Int(0, kI64Max), "use only the first N test records (0 = all)"),
    MPX_KEY(data.drop_last, Bool(), "drop the last partial batch of an epoch"),
    MPX_KEY(data.shuffle, Bool(), "shuffle the training records every epoch"),
    k("data.normalize.mean", MPX_F(data.mean), Nums(R::any()),
      "per-channel mean; [] = the dataset's standard statistics"),
    k("data.normalize.std", MPX_F(data.std), Nums(R::gt(0)), "per-channel standard deviation (as many as mean)"),
    MPX_KEY(data.augment.random_crop_padding, Int(0, 1024), "pad by this many pixels, then crop at random (0 = off)"),
    MPX_KEY(data.augment.padding_mode, Enum<PadMode>(),
      "what the crop sees outside the image: zeros, or the image reflected about its edge (reflect: padding < H, W)"),
    MPX_KEY(data.augment.horizontal_flip, Bool(), "flip half the images left-right"),
    MPX_KEY(data.augment.flip_mode, Enum<FlipMode>(),
      "random: a new coin per image every epoch; alternating: epoch 0 at random, then each image flips every other epoch"),
    MPX_KEY(data.synthetic_train, Int(1, kIntMax), "synthetic: training records"),
    MPX_KEY(data.synthetic_test, Int(1, kIntMax), "synthetic: test records"),
    MPX_KEY(data.validation_split, Num(R::ge(0)),
      "training records held out for validation: a fraction in (0, 1) or a count >= 1, drawn with the seed (0 = none)"),

    MPX_KEY(model.input_shape, Shape(), "H, W, C; [] = from the dataset"),
    MPX_KEY(model.layers, Layers(), "the network, input to output (layer keys below)").req(),

    MPX_KEY(optimizer.name, Enum<OptimizerName>(), "the optimizer"),
    MPX_KEY(optimizer.learning_rate, Num(R::gt(0)), "the base learning rate"),
    MPX_KEY(optimizer.scale_lr_by_batch, Bool(), "true: learning_rate * batch_size / 256"),
    MPX_KEY(optimizer.momentum, Num(R::closed(0, 1)), "sgd: momentum"),
    MPX_KEY(optimizer.nesterov, Bool(), "sgd: Nesterov momentum"),
    MPX_KEY(optimizer.beta1, Num(R::half_open(0, 1)), "all but sgd: first-moment decay"),
    MPX_KEY(optimizer.beta2, Num(R::half_open(0, 1)), "all but sgd: second-moment decay"),
    MPX_KEY(optimizer.epsilon, Num(R::gt(0)), "all but sgd: added to the denominator"),
    MPX_KEY(optimizer.weight_decay, Num(R::ge(0)), "decoupled decay (adamw), else L2 added to the gradient"),
    MPX_KEY(optimizer.lr_multipliers, ParamRules(R::ge(0)),
      "per parameter: \"<layer>/<parameter>=m\" (a glob; the first match wins) multiplies its learning rate by m; 0 freezes it"),
    MPX_KEY(optimizer.weight_decay_multipliers, ParamRules(R::ge(0)),
      "per parameter, as lr_multipliers: multiplies its weight_decay"),
    MPX_KEY(optimizer.freeze_after_epochs, ParamRules(R::ge(0)),
      "per parameter, as lr_multipliers: \"<layer>/<parameter>=n\" is updated in the first n epochs only"),

    MPX_KEY(schedule.name, Enum<ScheduleName>(), "the learning-rate schedule"),
    MPX_KEY(schedule.warmup_epochs, Num(R::closed(0, kMaxEpochs)), "linear warm-up from 0 over this many epochs"),
    MPX_KEY(schedule.step_epochs, Int(1, kI64Max), "step: multiply by gamma every step_epochs"),
    MPX_KEY(schedule.gamma, Num(R::gt(0)), "step: the factor"),
    MPX_KEY(schedule.min_lr, Num(R::ge(0)), "cosine and reduce_on_plateau: the floor"),
    MPX_KEY(schedule.start_factor, Num(R::ge(0)), "triangular: the rate at the first step, times the base rate"),
    MPX_KEY(schedule.peak_fraction, Num(R::closed(0, 1)),
      "triangular: where the base rate is reached, as a fraction of all steps"),
    MPX_KEY(schedule.end_factor, Num(R::ge(0)), "triangular: the rate after the last step, times the base rate"),
    MPX_KEY(schedule.factor, Num(R::open(0, 1)),
      "reduce_on_plateau (Keras ReduceLROnPlateau on the validation loss, else the test loss): the factor"),
    MPX_KEY(schedule.patience, Int(0, kI64Max), "reduce_on_plateau: evaluations without improvement"),
    MPX_KEY(schedule.min_delta, Num(R::ge(0)), "reduce_on_plateau: smallest improvement that counts"),
    MPX_KEY(schedule.cooldown, Int(0, kI64Max), "reduce_on_plateau: evaluations to wait after a cut"),

    MPX_KEY(train.epochs, Int(1, kMaxEpochs), "epochs to train"),
    MPX_KEY(train.log_every, Int(1, kI64Max), "steps between log lines / metrics.jsonl records"),
    MPX_KEY(train.eval_every, Int(1, kI64Max),
      "epochs between evaluations (on the validation split when data.validation_split is set, else the test split)"),
    MPX_KEY(train.eval_policy, Enum<EvalPolicy>(), "evaluate under the training policy or float32"),
    MPX_KEY(train.checkpoint_every, Int(1, kI64Max), "epochs between checkpoints"),
    MPX_KEY(train.max_steps, Int(0, kI64Max), "stop after this many steps (0 = no limit)"),
    MPX_KEY(train.label_smoothing, Num(R::half_open(0, 1)),
      "training loss against (1 - e) onehot + e / classes (Keras' label_smoothing); the test loss stays plain"),
    MPX_KEY(train.divergence_factor, Num(R::ge(0)),
      "stop as diverged (exit code 4) when the train loss exceeds this many times its starting value (0 = off)"),
    MPX_KEY(train.divergence_patience, Int(0, kI64Max),
      "also stop as diverged when the epoch's train loss has not improved on its best for this many epochs in a row (0 = off)"),
    MPX_KEY(train.early_stopping.monitor, Enum<EarlyStopMonitor>(),
      "stop when this validation figure stops improving (Keras EarlyStopping; needs data.validation_split)"),
    MPX_KEY(train.early_stopping.patience, Int(0, kI64Max),
      "evaluations without improvement before stopping (as Keras: 0 and 1 both stop at the first)"),
    MPX_KEY(train.early_stopping.min_delta, Num(R::ge(0)), "smallest change of the monitored figure that counts as an improvement"),
    MPX_KEY(train.early_stopping.restore_best, Bool(),
      "on stopping early, go back to the weights of the best evaluation (Keras restore_best_weights)"),
    MPX_KEY(train.tta, Enum<TtaMode>(),
      "test-time augmentation of every evaluation: none, mirror (the image and its mirror), mirror_translate (and both shifted by one pixel)"),
    MPX_KEY(train.target_accuracy, Num(R::half_open(0, 1)),
      "record when an evaluation first reaches this accuracy (time_to_target in summary.json; 0 = none)"),
    MPX_KEY(train.stop_at_target, Bool(), "stop once train.target_accuracy is reached"),
    MPX_KEY(train.lookahead.every, Int(0, kI64Max),
      "lookahead: every this many steps the averaged weights move towards the trained ones, which then take their value (0 = off)"),
    MPX_KEY(train.lookahead.decay, Num(R::closed(0, 1)), "lookahead: the averaged weights keep decay * (step / steps)^power of themselves"),
    MPX_KEY(train.lookahead.power, Num(R::ge(0)), "lookahead: the power of the decay's schedule"),
    MPX_KEY(train.tensorboard, Bool(), "write TensorBoard event files under <run dir>/tensorboard"),
    MPX_KEY(train.sync, Enum<SyncMode>(),
      "when the host reads the loss and skip verdict: every step, or every log_every steps (auto: log on one GPU)"),
    MPX_KEY(train.cuda_graph, Bool(), "replay the steady-state step as a CUDA graph (GPU, sync log)"),

    MPX_KEY(debug.check_numerics, Bool(), "check every layer's output and gradient every step"),

    MPX_KEY(weights.init_from, OptStr(),
      "a safetensors file (mpx export, keras or pytorch layout) loaded after initialization"),

    MPX_KEY(dist.overlap_allreduce, Enum<OverlapMode>(),
      "all-reduce gradient buckets during the backward pass (auto: on with NCCL on GPUs, off on the CPU)"),
    MPX_KEY(dist.bucket_bytes, Int(4, kI64Max), "smallest bucket of the overlapped all-reduce, in bytes"),

    MPX_KEY(cpu.winograd, Enum<CpuWinograd>(),
      "3x3 stride-1 convolutions on mpx's Winograd kernel: auto (where it measured faster), "
      "off (oneDNN's direct kernels), on (F(4x4,3x3) wherever it applies), f2 (F(2x2,3x3)); on and f2 also keep "
      "bfloat16 weight gradients off mpx's AMX kernel. 16-bit passes that run oneDNN's native kernels "
      "([precision.md](precision.md#16-bit-arithmetic-on-the-cpu)) stay on them under on and f2; where bfloat16 "
      "is native per shape (AVX512-BF16 without AMX) the rule weighs the native kernel against the one this key "
      "picks"),

    MPX_KEY(cuda.workspace_mb, Int(0, kMaxWorkspaceMb), "cuDNN / cuBLASLt workspace budget in MiB"),
    MPX_KEY(cuda.conv_algo, Enum<ConvAlgo>(),
      "convolution algorithms: cuDNN's heuristic ranking (the same every run) or measured (search)"),
    MPX_KEY(cuda.deterministic, Bool(), "deterministic convolution algorithms only (bit-identical reruns)"),
  };
  // clang-format on
  return keys;
}

namespace {

std::string leaky_relu_only(const LayerConfig& L) {
  if (L.activation == ActivationName::LeakyRelu) return "";
  return fmt::format("negative_slope applies to activation leaky_relu only, not to {}", enum_name(L.activation));
}
void use_leaky_relu(LayerConfig& L) { L.activation = ActivationName::LeakyRelu; }
std::string whitening_only(const LayerConfig& L) {
  if (L.kernel_initializer == KernelInit::PatchWhitening) return "";
  return fmt::format("applies to kernel_initializer patch_whitening only, not to {}", enum_name(L.kernel_initializer));
}
void use_whitening(LayerConfig& L) { L.kernel_initializer = KernelInit::PatchWhitening; }

}  // namespace

const std::vector<Key<LayerConfig>>& layer_keys() {
  using T = LayerType;
  using R = Range;
  const auto k = [](auto&&... a) { return key<LayerConfig>(std::forward<decltype(a)>(a)...); };
  constexpr auto sharing = layer_types_sharing;
  // clang-format off
  static const std::vector<Key<LayerConfig>> keys = {
    MPX_KEY(type, Enum<LayerType>(), "the layer type").req(),
    MPX_KEY(name, Str(), "unique over the model").doc_default("<type>, <type>_1, ... (Keras style)"),
    MPX_KEY(dtype, OptEnum<LayerDType>(), "compute dtype of this layer (float16 = mixed_float16)")
      .doc_default("the model's policy"),
    // The keys of one type each (the layer table): the ones that size a layer here, the
    // others after the shared window, padding and bias keys.
#define MPX_LAYER_SIZE(id, type, field, init, value, help, ...) MPX_KEY(field, value, help).only({T::id}) __VA_ARGS__,
#include "config/layer_table.inc"
    // The keys that several types share: the types whose table row names them.
    k("kernel", MPX_HW(kernel_h, kernel_w), Pair(1, 1024), "kernel size").only_types(sharing(kConvWindow)),
    k("strides", MPX_HW(stride_h, stride_w), Pair(1, 1024), "strides").only_types(sharing(kConvWindow)).aka("stride"),
    k("pool_size", MPX_HW(pool_h, pool_w), Pair(1, 1024), "window size").only_types(sharing(kPoolWindow)).aka("size"),
    k("strides", MPX_HW(pool_stride_h, pool_stride_w), Pair(1, 1024), "strides")
      .only_types(sharing(kPoolWindow)).aka("stride").derived(default_pool_strides, "pool_size"),
    MPX_KEY(padding, Enum<Padding>(), "same: output size = ceil(input / stride)").only_types(sharing(kPadding)),
    MPX_KEY(use_bias, Bool(), "add a bias").only_types(sharing(kBias)),
#define MPX_LAYER_KEY(id, type, field, init, value, help, ...) MPX_KEY(field, value, help).only({T::id}) __VA_ARGS__,
#include "config/layer_table.inc"
    MPX_KEY(activation, Enum<ActivationName>(), "fused activation (softmax: last layer only)")
      .only_types(sharing(kActivation)),
    MPX_KEY(negative_slope, Num(R::ge(0)), "leaky_relu: slope for x < 0 (Keras 3's default)")
      .only_types(sharing(kActivation)).only_if(leaky_relu_only, use_leaky_relu),
  };
  // clang-format on
  return keys;
}

}  // namespace mpx::schema
