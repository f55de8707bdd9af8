// SPDX-License-Identifier: MIT
// lib/config: defaults, every error kind with its message, --set overrides,
// to_yaml round trip, layer names, and that every file in configs/ loads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "config/config.h"
#include "core/activation.h"
#include "core/error.h"

using namespace mpx;

namespace {

const char* kMinimal =
    "data:\n"
    "  dataset: mnist\n"
    "model:\n"
    "  layers:\n"
    "    - {type: dense, units: 10}\n";

/// The message of the ConfigError that parsing throws ("" when none).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {},
                     const std::string& source = "x.yaml") {
  try {
    parse_config(text, source, overrides);
  } catch (const ConfigError& e) {
    CHECK(e.exit_code() == kExitUsage);
    return e.what();
  }
  return "";
}

/// load_config(path) throws the unknown-key error for the 'bogus' key on line 6.
bool error_of_file(const std::string& path) {
  try {
    load_config(path);
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::StartsWith(path + ":6:1: bogus: unknown key in the top level"));
    return true;
  }
  return false;
}

/// kMinimal with one more top-level section appended.
std::string with_section(const std::string& extra) { return std::string(kMinimal) + extra; }

}  // namespace

// ---- defaults -------------------------------------------------------------------

TEST_CASE("config: every key but model.layers and data.dataset has a default", "[config]") {
  const Config c = parse_config(kMinimal, "min.yaml");
  CHECK(c.source == "min.yaml");
  CHECK(c.name == "run");
  CHECK(c.seed == 42);
  CHECK(c.device == "auto");
  CHECK(c.policy == Policy::Float32);
  CHECK(c.loss_scale.mode == LossScaleMode::None);
  CHECK_FALSE(c.loss_scale.mode_explicit);
  CHECK(c.loss_scale.initial == 32768.0);
  CHECK(c.loss_scale.growth_interval == 2000);
  CHECK(c.loss_scale.growth_factor == 2.0);
  CHECK(c.loss_scale.backoff_factor == 0.5);
  CHECK(c.loss_scale.min_scale == 1.0);
  CHECK(c.loss_scale.max_consecutive_skips == 50);
  CHECK(c.data.dataset == DatasetName::Mnist);
  CHECK(c.data.path == "data/mnist");
  CHECK(c.data.batch_size == 128);
  CHECK(c.data.shuffle);
  CHECK_FALSE(c.data.drop_last);
  CHECK(c.data.mean.empty());
  CHECK(c.data.augment.random_crop_padding == 0);
  CHECK(c.model.input_shape.empty());
  REQUIRE(c.model.layers.size() == 1);
  const LayerConfig& d = c.model.layers[0];
  CHECK(d.type == LayerType::Dense);
  CHECK(d.name == "dense");
  CHECK(d.units == 10);
  CHECK(d.use_bias);
  CHECK(d.activation == ActivationName::Linear);
  CHECK_FALSE(d.dtype.has_value());
  CHECK(d.key_path == "model.layers[0]");
  CHECK(d.line == 5);
  CHECK(d.column == 7);
  CHECK(c.optimizer.name == OptimizerName::Adam);
  CHECK(c.optimizer.learning_rate == 1e-3);
  CHECK(c.optimizer.epsilon == 1e-7);
  CHECK(c.schedule.name == ScheduleName::Constant);
  CHECK(c.train.epochs == 1);
  CHECK(c.train.log_every == 50);
  CHECK(c.train.eval_policy == EvalPolicy::Same);
  CHECK(c.train.max_steps == 0);
  CHECK_FALSE(c.debug.check_numerics);
}

TEST_CASE("config: the docs/design.md example loads with its values", "[config]") {
  const Config c = parse_config(R"(
name: cifar10_bf16
seed: 7
device: cuda:1
policy: mixed_bfloat16
loss_scale: {mode: fixed, initial: 1024, growth_interval: 10, growth_factor: 4, backoff_factor: 0.25,
             min_scale: 2, max_consecutive_skips: 5}
data:
  dataset: cifar10
  path: /tmp/cifar
  batch_size: 256
  train_limit: 1000
  test_limit: 100
  drop_last: true
  shuffle: false
  normalize: {mean: [0.4914, 0.4822, 0.4465], std: [0.2470, 0.2435, 0.2616]}
  augment: {random_crop_padding: 4, horizontal_flip: true}
model:
  input_shape: [32, 32, 3]
  layers:
    - {type: conv2d, filters: 64, kernel: [3, 5], strides: [1, 2], padding: same, activation: relu, use_bias: false}
    - {type: max_pool, size: [3, 2], stride: 1}
    - {type: avg_pool}
    - {type: dropout, rate: 0.25}
    - {type: batch_norm, momentum: 0.9, epsilon: 1.0e-5}
    - {type: global_avg_pool}
    - {type: dense, units: 10, activation: softmax, dtype: float32, name: predictions}
optimizer: {name: sgd, learning_rate: 0.1, momentum: 0.9, nesterov: true, weight_decay: 5.0e-4, scale_lr_by_batch: yes}
schedule: {name: step, warmup_epochs: 1.5, step_epochs: 3, gamma: 0.5}
train: {epochs: 30, log_every: 10, eval_every: 2, eval_policy: float32, checkpoint_every: 3, max_steps: 500}
debug: {check_numerics: true}
)",
                                "design.yaml");
  CHECK(c.name == "cifar10_bf16");
  CHECK(c.seed == 7);
  CHECK(c.device == "cuda:1");
  CHECK(c.policy == Policy::MixedBFloat16);
  CHECK(c.loss_scale.mode == LossScaleMode::Fixed);
  CHECK(c.loss_scale.mode_explicit);
  CHECK(c.loss_scale.initial == 1024.0);
  CHECK(c.loss_scale.growth_factor == 4.0);
  CHECK(c.loss_scale.backoff_factor == 0.25);
  CHECK(c.loss_scale.max_consecutive_skips == 5);
  CHECK(c.data.path == "/tmp/cifar");
  CHECK(c.data.train_limit == 1000);
  CHECK(c.data.drop_last);
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.data.mean == std::vector<double>{0.4914, 0.4822, 0.4465});
  CHECK(c.data.std == std::vector<double>{0.2470, 0.2435, 0.2616});
  CHECK(c.data.augment.random_crop_padding == 4);
  CHECK(c.data.augment.horizontal_flip);
  CHECK(c.model.input_shape == std::vector<int64_t>{32, 32, 3});
  const auto& L = c.model.layers;
  REQUIRE(L.size() == 7);
  CHECK(L[0].kernel_h == 3);
  CHECK(L[0].kernel_w == 5);
  CHECK(L[0].stride_h == 1);
  CHECK(L[0].stride_w == 2);
  CHECK(L[0].padding == Padding::Same);
  CHECK_FALSE(L[0].use_bias);
  CHECK(L[1].pool_h == 3);
  CHECK(L[1].pool_w == 2);
  CHECK(L[1].pool_stride_h == 1);
  CHECK(L[1].pool_stride_w == 1);
  CHECK(L[2].pool_h == 2);
  CHECK(L[2].pool_stride_h == 2);  // strides default to the pool size
  CHECK(L[2].padding == Padding::Valid);
  CHECK(L[3].rate == 0.25);
  CHECK(L[4].momentum == 0.9);
  CHECK(L[4].epsilon == 1e-5);
  CHECK(L[6].name == "predictions");
  CHECK(L[6].dtype == LayerDType::Float32);
  CHECK(c.optimizer.name == OptimizerName::Sgd);
  CHECK(c.optimizer.momentum == 0.9);
  CHECK(c.optimizer.nesterov);
  CHECK(c.optimizer.scale_lr_by_batch);
  CHECK(c.optimizer.weight_decay == 5e-4);
  CHECK(c.schedule.name == ScheduleName::Step);
  CHECK(c.schedule.warmup_epochs == 1.5);
  CHECK(c.schedule.step_epochs == 3);
  CHECK(c.train.eval_policy == EvalPolicy::Float32);
  CHECK(c.train.max_steps == 500);
  CHECK(c.debug.check_numerics);
}

TEST_CASE("config: policy and loss-scale names", "[config]") {
  CHECK(std::string(policy_name(Policy::Float32)) == "float32");
  CHECK(std::string(policy_name(Policy::MixedFloat16)) == "mixed_float16");
  CHECK(std::string(policy_name(Policy::MixedBFloat16)) == "mixed_bfloat16");
  CHECK(std::string(policy_name(Policy::Auto)) == "auto");
  CHECK(std::string(loss_scale_mode_name(LossScaleMode::Dynamic)) == "dynamic");
  CHECK(std::string(loss_scale_mode_name(LossScaleMode::Fixed)) == "fixed");
  CHECK(std::string(loss_scale_mode_name(LossScaleMode::None)) == "none");
  CHECK(parse_policy("mixed_float16") == Policy::MixedFloat16);
  CHECK_FALSE(parse_policy("fp16").has_value());
  CHECK(parse_loss_scale_mode("dynamic") == LossScaleMode::Dynamic);
}

TEST_CASE("config: loss_scale.mode present sets mode_explicit", "[config]") {
  const Config c = parse_config(with_section("policy: mixed_float16\nloss_scale: {mode: none}\n"), "x.yaml");
  CHECK(c.loss_scale.mode == LossScaleMode::None);
  CHECK(c.loss_scale.mode_explicit);
  const Config d = parse_config(with_section("policy: mixed_float16\nloss_scale: {initial: 128}\n"), "x.yaml");
  CHECK_FALSE(d.loss_scale.mode_explicit);
  CHECK(d.loss_scale.initial == 128.0);
}

// ---- unknown keys ---------------------------------------------------------------

TEST_CASE("config: unknown top-level key names file, line, column and the closest key", "[config]") {
  const std::string msg = error_of(with_section("optimiser:\n  name: sgd\n"));
  CHECK(msg ==
        "x.yaml:6:1: optimiser: unknown key in the top level; did you mean 'optimizer'? (valid keys: name, seed, "
        "device, policy, loss_scale, data, model, optimizer, schedule, train, debug, weights, dist, cpu, cuda)");
}

TEST_CASE("config: unknown key in a section", "[config]") {
  const std::string msg = error_of(with_section("optimizer:\n  lerning_rate: 0.1\n"));
  CHECK_THAT(msg, Catch::StartsWith("x.yaml:7:3: optimizer.lerning_rate: unknown key in the optimizer section; "
                                    "did you mean 'learning_rate'?"));
}

TEST_CASE("config: unknown key inside a layer suggests a key of that layer type", "[config]") {
  const std::string text =
      "data: {dataset: mnist}\n"
      "model:\n"
      "  layers:\n"
      "    - {type: conv2d, filters: 8}\n"
      "    - {type: max_pool}\n"
      "    - type: conv2d\n"
      "      filtres: 16\n";
  const std::string msg = error_of(text);
  CHECK_THAT(msg, Catch::StartsWith("x.yaml:7:7: model.layers[2].filtres: unknown key in a conv2d layer; "
                                    "did you mean 'filters'? (valid keys: type, name, dtype, filters, kernel,"));

  // 'units' is a dense key, not a conv2d one: no suggestion, the valid keys listed.
  const std::string msg2 = error_of("data: {dataset: mnist}\nmodel:\n  layers:\n    - {type: conv2d, units: 3}\n");
  CHECK_THAT(msg2, Catch::StartsWith("x.yaml:4:22: model.layers[0].units: unknown key in a conv2d layer (valid keys: "));
  CHECK_THAT(msg2, !Catch::Contains("did you mean"));

  // the suggestion comes from the type's own keys: 'rates' on dropout -> 'rate'.
  CHECK_THAT(error_of("data: {dataset: mnist}\nmodel:\n  layers:\n    - {type: dropout, rates: 0.1}\n"),
             Catch::Contains("model.layers[0].rates: unknown key in a dropout layer; did you mean 'rate'?"));
}

TEST_CASE("config: unknown layer type", "[config]") {
  CHECK(error_of("data: {dataset: mnist}\nmodel:\n  layers:\n    - {type: conv2D, filters: 3}\n") ==
        "x.yaml:4:14: model.layers[0].type: expected one of conv2d | dense | activation | max_pool | avg_pool | "
        "global_avg_pool | flatten | dropout | batch_norm | residual | depthwise_conv2d, got 'conv2D'; did you mean "
        "'conv2d'?");
  CHECK(error_of("data: {dataset: mnist}\nmodel:\n  layers:\n    - {filters: 3}\n") ==
        "x.yaml:4:7: model.layers[0].type: required key is missing (one of conv2d | dense | activation | max_pool | "
        "avg_pool | global_avg_pool | flatten | dropout | batch_norm | residual | depthwise_conv2d)");
  CHECK(error_of("data: {dataset: mnist}\nmodel:\n  layers:\n    - dense\n") ==
        "x.yaml:4:7: model.layers[0]: expected a layer (a mapping with a 'type' key, e.g. {type: dense, units: 10}), "
        "got 'dense'");
}

// ---- types and ranges ------------------------------------------------------------

TEST_CASE("config: wrong types name the key, position and value", "[config]") {
  CHECK(error_of("data:\n  dataset: mnist\n  batch_size: abc\nmodel: {layers: [{type: flatten}]}\n") ==
        "x.yaml:3:15: data.batch_size: expected an integer, got 'abc'");
  CHECK(error_of("data:\n  dataset: mnist\n  batch_size: 1.5\nmodel: {layers: [{type: flatten}]}\n") ==
        "x.yaml:3:15: data.batch_size: expected an integer, got '1.5'");
  CHECK(error_of(with_section("optimizer: {learning_rate: fast}\n")) ==
        "x.yaml:6:28: optimizer.learning_rate: expected a number, got 'fast'");
  CHECK(error_of(with_section("debug: {check_numerics: maybe}\n")) ==
        "x.yaml:6:25: debug.check_numerics: expected true or false, got 'maybe'");
  CHECK(error_of(with_section("train: [1, 2]\n")) == "x.yaml:6:8: train: expected a mapping, got a list");
  CHECK(error_of(with_section("seed: -1\n")) ==
        "x.yaml:6:7: seed: expected an integer in [0, 18446744073709551615], got -1");
  CHECK(error_of(with_section("name: {a: 1}\n")) == "x.yaml:6:7: name: expected a non-empty string, got a mapping");
  CHECK(error_of("model: {layers: [{type: flatten}]}\ndata: {dataset: mnist, normalize: {mean: 0.5, std: [1]}}\n") ==
        "x.yaml:2:42: data.normalize.mean: expected a list of numbers, got '0.5'");
  CHECK(error_of(with_section("train: {epochs: }\n")) ==
        "x.yaml:6:17: train.epochs: expected an integer in [1, 1000000], got an empty value");
}

TEST_CASE("config: out-of-range values name the allowed range and the value", "[config]") {
  const std::string pre = "data: {dataset: mnist}\nmodel:\n  layers:\n";
  CHECK(error_of(pre + "    - {type: conv2d, filters: -3}\n") ==
        "x.yaml:4:31: model.layers[0].filters: expected a positive integer, got -3");
  CHECK(error_of(pre + "    - {type: dense, units: 0}\n") ==
        "x.yaml:4:28: model.layers[0].units: expected a positive integer, got 0");
  CHECK(error_of(pre + "    - {type: dropout, rate: 1}\n") ==
        "x.yaml:4:29: model.layers[0].rate: expected a number in [0, 1), got 1");
  CHECK(error_of(pre + "    - {type: batch_norm, momentum: 1.5}\n") ==
        "x.yaml:4:36: model.layers[0].momentum: expected a number in [0, 1], got 1.5");
  CHECK(error_of(pre + "    - {type: conv2d, filters: 3, kernel: [3, 0]}\n") ==
        "x.yaml:4:46: model.layers[0].kernel[1]: expected an integer in [1, 1024], got 0");
  CHECK(error_of(pre + "    - {type: conv2d, filters: 3, kernel: [3, 3, 3]}\n") ==
        "x.yaml:4:42: model.layers[0].kernel: expected an integer or a list [h, w], got a list of 3 elements");
  CHECK(error_of("data: {dataset: mnist, batch_size: 0}\nmodel: {layers: [{type: flatten}]}\n") ==
        "x.yaml:1:36: data.batch_size: expected a positive integer, got 0");
  CHECK(error_of(with_section("optimizer: {learning_rate: 0}\n")) ==
        "x.yaml:6:28: optimizer.learning_rate: expected a number > 0, got 0");
  CHECK(error_of(with_section("optimizer: {momentum: 1.01}\n")) ==
        "x.yaml:6:23: optimizer.momentum: expected a number in [0, 1], got 1.01");
  CHECK(error_of(with_section("loss_scale: {initial: -1}\n")) ==
        "x.yaml:6:23: loss_scale.initial: expected a number > 0, got -1");
  CHECK(error_of(with_section("loss_scale: {growth_factor: 1}\n")) ==
        "x.yaml:6:29: loss_scale.growth_factor: expected a number > 1, got 1");
  CHECK(error_of(with_section("loss_scale: {backoff_factor: 1.0}\n")) ==
        "x.yaml:6:30: loss_scale.backoff_factor: expected a number in (0, 1), got 1.0");
  CHECK(error_of(with_section("loss_scale: {backoff_factor: 0}\n")) ==
        "x.yaml:6:30: loss_scale.backoff_factor: expected a number in (0, 1), got 0");
  CHECK(error_of(with_section("loss_scale: {initial: .inf}\n")) ==
        "x.yaml:6:23: loss_scale.initial: expected a number > 0, got .inf");
  CHECK(error_of(with_section("train: {max_steps: -1}\n")) ==
        "x.yaml:6:20: train.max_steps: expected an integer >= 0, got -1");
  CHECK(error_of("model: {layers: [{type: flatten}]}\ndata: {dataset: mnist, normalize: {mean: [0.5], std: [0]}}\n") ==
        "x.yaml:2:55: data.normalize.std[0]: expected a number > 0, got 0");
  CHECK(error_of("model: {layers: [{type: flatten}]}\ndata: {dataset: mnist, normalize: {mean: [0.5, 0.5], std: [1]}}\n") ==
        "x.yaml:2:35: data.normalize: mean and std must have the same length (one value per channel), got 2 and 1");
  CHECK(error_of("data: {dataset: mnist}\nmodel: {input_shape: [28, 28], layers: [{type: flatten}]}\n") ==
        "x.yaml:2:22: model.input_shape: expected a list [H, W, C] of 3 positive integers, got a list of 2 elements");
}

TEST_CASE("config: bad enum values list the allowed set", "[config]") {
  CHECK(error_of(with_section("policy: mixed_float32\n")) ==
        "x.yaml:6:9: policy: expected one of float32 | mixed_float16 | mixed_bfloat16 | auto, got "
        "'mixed_float32'; did you mean 'mixed_float16'?");
  CHECK(error_of(with_section("device: gpu\n")) ==
        "x.yaml:6:9: device: expected one of auto | cpu | cuda | cuda:N (N a device index), got 'gpu'");
  CHECK(error_of(with_section("device: cuda:x\n")) ==
        "x.yaml:6:9: device: expected one of auto | cpu | cuda | cuda:N (N a device index), got 'cuda:x'");
  CHECK(error_of("data: {dataset: imagenet}\nmodel: {layers: [{type: flatten}]}\n") ==
        "x.yaml:1:17: data.dataset: expected one of mnist | fashion_mnist | cifar10 | synthetic, got 'imagenet'");
  CHECK(error_of(with_section("optimizer: {name: rmsprop}\n")) ==
        "x.yaml:6:19: optimizer.name: expected one of sgd | adam | adamw | amsgrad, got 'rmsprop'");
  CHECK(error_of(with_section("schedule: {name: cosin}\n")) ==
        "x.yaml:6:18: schedule.name: expected one of constant | step | cosine | reduce_on_plateau | triangular, got "
              "'cosin'; "
        "did you mean 'cosine'?");
  CHECK(error_of(with_section("train: {eval_policy: float16}\n")) ==
        "x.yaml:6:22: train.eval_policy: expected one of same | float32, got 'float16'; did you mean 'float32'?");
  CHECK(error_of(with_section("loss_scale: {mode: static}\n")) ==
        "x.yaml:6:20: loss_scale.mode: expected one of dynamic | fixed | none, got 'static'");
  const std::string pre = "data: {dataset: mnist}\nmodel:\n  layers:\n";
  CHECK(error_of(pre + "    - {type: conv2d, filters: 3, padding: full}\n") ==
        "x.yaml:4:43: model.layers[0].padding: expected one of same | valid, got 'full'");
  std::string activations;  // core/activation.h's names, then softmax
  for (const ActivationEntry& a : kActivationNames) activations += std::string(a.name) + " | ";
  CHECK(error_of(pre + "    - {type: dense, units: 3, activation: elu}\n") ==
        "x.yaml:4:43: model.layers[0].activation: expected one of " + activations +
            "softmax, got 'elu'; did you mean 'relu'?");
  CHECK(error_of(pre + "    - {type: dense, units: 3, dtype: half}\n") ==
        "x.yaml:4:38: model.layers[0].dtype: expected one of float32 | mixed_float16 | mixed_bfloat16 | float16 | "
        "bfloat16, got 'half'");
  const Config c = parse_config(pre + "    - {type: dense, units: 3, dtype: bfloat16}\n", "x.yaml");
  CHECK(c.model.layers[0].dtype == LayerDType::BFloat16);
  CHECK(parse_config(with_section("device: cuda:3\n"), "x.yaml").device == "cuda:3");
}

TEST_CASE("config: required keys", "[config]") {
  CHECK(error_of("data: {dataset: mnist}\nmodel:\n  input_shape: [28, 28, 1]\n") ==
        "x.yaml:3:3: model.layers: required key is missing (a non-empty list of layers)");
  CHECK(error_of("data: {dataset: mnist}\n") == "x.yaml:1:1: model.layers: required key is missing (a non-empty list of layers)");
  CHECK(error_of("data: {dataset: mnist}\nmodel: {layers: []}\n") ==
        "x.yaml:2:17: model.layers: expected a non-empty list of layers, got an empty list");
  CHECK(error_of("data:\n  batch_size: 32\nmodel: {layers: [{type: flatten}]}\n") ==
        "x.yaml:2:3: data.dataset: required key is missing (one of mnist | fashion_mnist | cifar10 | synthetic)");
  CHECK(error_of("model: {layers: [{type: flatten}]}\n") ==
        "x.yaml:1:1: data.dataset: required key is missing (one of mnist | fashion_mnist | cifar10 | synthetic)");
  CHECK(error_of("", {}, "empty.yaml") ==
        "empty.yaml: data.dataset: required key is missing (one of mnist | fashion_mnist | cifar10 | synthetic)");
  CHECK(error_of("data: {dataset: mnist}\nmodel: {layers: [{type: conv2d}]}\n") ==
        "x.yaml:2:18: model.layers[0].filters: required key is missing (a positive integer)");
  CHECK(error_of("data: {dataset: mnist}\nmodel: {layers: [{type: residual}]}\n") ==
        "x.yaml:2:18: model.layers[0].layers: required key is missing (a non-empty list of layers)");
}

TEST_CASE("config: file and YAML errors", "[config]") {
  SECTION("missing file names the path") {
    try {
      load_config("/nonexistent/dir/cfg.yaml");
      FAIL("no error");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()) == "/nonexistent/dir/cfg.yaml: cannot open config file: No such file or directory");
      CHECK(e.exit_code() == 2);
    }
  }
  SECTION("a directory is not a config") {
    CHECK_THROWS_WITH(load_config("/tmp"), "/tmp: cannot read config file: it is a directory");
  }
  SECTION("malformed YAML has yaml-cpp's line and column") {
    CHECK(error_of("data:\n  dataset: [mnist\nmodel: 3\n") ==
          "x.yaml:3:6: invalid YAML: end of sequence flow not found");
    CHECK_THAT(error_of("a: b: c\n"), Catch::StartsWith("x.yaml:1:5: invalid YAML: "));
  }
  SECTION("duplicate keys are an error, not a silent overwrite") {
    CHECK(error_of(with_section("seed: 1\nseed: 2\n")) == "x.yaml:7:1: duplicate key 'seed'");
  }
  SECTION("a top level that is not a mapping") {
    CHECK(error_of("- a\n- b\n") == "x.yaml:1:1: config: expected a mapping of sections at the top level, got a list");
  }
  SECTION("load_config reads a file and records its path") {
    const std::string path = (std::filesystem::temp_directory_path() / "mpx_test_config_load.yaml").string();
    {
      std::ofstream f(path);
      f << kMinimal << "bogus: 1\n";
    }
    CHECK(error_of_file(path));
    std::filesystem::remove(path);
  }
}

// ---- layers ----------------------------------------------------------------------

TEST_CASE("config: default layer names are Keras style and unique across nesting", "[config]") {
  const Config c = parse_config(R"(
data: {dataset: cifar10}
model:
  layers:
    - {type: conv2d, filters: 8}
    - {type: conv2d, filters: 8, name: conv2d_1}
    - type: residual
      layers:
        - {type: conv2d, filters: 8}
        - {type: batch_norm}
        - type: residual
          layers:
            - {type: conv2d, filters: 8, strides: 2}
            - {type: dense, units: 4}
    - {type: residual, layers: [{type: batch_norm}]}
    - {type: dense, units: 10}
)",
                                "n.yaml");
  const auto& L = c.model.layers;
  REQUIRE(L.size() == 5);
  CHECK(L[0].name == "conv2d");
  CHECK(L[1].name == "conv2d_1");
  CHECK(L[2].name == "residual");
  REQUIRE(L[2].layers.size() == 3);
  CHECK(L[2].layers[0].name == "conv2d_2");  // conv2d_1 is taken by the explicit name
  CHECK(L[2].layers[1].name == "batch_norm");
  CHECK(L[2].layers[2].name == "residual_1");
  REQUIRE(L[2].layers[2].layers.size() == 2);
  CHECK(L[2].layers[2].layers[0].name == "conv2d_3");
  CHECK(L[2].layers[2].layers[0].stride_h == 2);
  CHECK(L[2].layers[2].layers[0].key_path == "model.layers[2].layers[2].layers[0]");
  CHECK(L[2].layers[2].layers[0].line == 13);
  CHECK(L[2].layers[2].layers[1].name == "dense");
  CHECK(L[3].name == "residual_2");
  CHECK(L[3].layers[0].name == "batch_norm_1");
  CHECK(L[4].name == "dense_1");
}

TEST_CASE("config: duplicate explicit layer names are an error", "[config]") {
  CHECK(error_of(R"(data: {dataset: mnist}
model:
  layers:
    - {type: dense, units: 8, name: head}
    - type: residual
      layers:
        - {type: dense, units: 8, name: head}
)") == "x.yaml:7:11: model.layers[1].layers[0].name: duplicate layer name 'head' (also used by model.layers[0])");
}

TEST_CASE("config: errors inside nested residual layers carry the full key path", "[config]") {
  CHECK(error_of(R"(data: {dataset: mnist}
model:
  layers:
    - type: residual
      layers:
        - {type: conv2d, filters: 8, kernal: 3}
)") == "x.yaml:6:38: model.layers[0].layers[0].kernal: unknown key in a conv2d layer; did you mean 'kernel'? "
       "(valid keys: type, name, dtype, filters, kernel, strides, stride, padding, use_bias, kernel_initializer, "
        "whitening_images, whitening_epsilon, activation, negative_slope)");
}

TEST_CASE("config: alias keys stride/strides and size/pool_size", "[config]") {
  const Config c = parse_config(
      "data: {dataset: mnist}\nmodel:\n  layers:\n    - {type: conv2d, filters: 4, stride: 2}\n"
      "    - {type: avg_pool, pool_size: 3, strides: [1, 2], padding: same}\n",
      "x.yaml");
  CHECK(c.model.layers[0].stride_h == 2);
  CHECK(c.model.layers[0].stride_w == 2);
  CHECK(c.model.layers[1].pool_h == 3);
  CHECK(c.model.layers[1].pool_stride_h == 1);
  CHECK(c.model.layers[1].pool_stride_w == 2);
  CHECK(c.model.layers[1].padding == Padding::Same);
  CHECK(error_of("data: {dataset: mnist}\nmodel:\n  layers:\n    - {type: max_pool, size: 2, pool_size: 2}\n") ==
        "x.yaml:4:30: model.layers[0].size: 'pool_size' and 'size' are the same key; give only one");
}

// ---- overrides -------------------------------------------------------------------

TEST_CASE("config: --set overrides", "[config][overrides]") {
  const std::string text = R"(data:
  dataset: mnist
  normalize: {mean: [0.1307], std: [0.3081]}
model:
  layers:
    - {type: conv2d, filters: 32}
    - type: residual
      layers:
        - {type: conv2d, filters: 32, padding: same}
    - {type: dense, units: 10}
optimizer:
  learning_rate: 0.001
)";
  SECTION("scalar") {
    const Config c = parse_config(text, "x.yaml", {"optimizer.learning_rate=3e-3", "policy=mixed_bfloat16"});
    CHECK(c.optimizer.learning_rate == 3e-3);
    CHECK(c.policy == Policy::MixedBFloat16);
  }
  SECTION("nested key into a section the file lacks") {
    const Config c = parse_config(text, "x.yaml", {"debug.check_numerics=true", "loss_scale.mode=dynamic"});
    CHECK(c.debug.check_numerics);
    CHECK(c.loss_scale.mode == LossScaleMode::Dynamic);
    CHECK(c.loss_scale.mode_explicit);
  }
  SECTION("list index, nested list index") {
    const Config c = parse_config(text, "x.yaml", {"model.layers[0].filters=64", "model.layers[1].layers[0].kernel=[5, 3]"});
    CHECK(c.model.layers[0].filters == 64);
    CHECK(c.model.layers[1].layers[0].kernel_h == 5);
    CHECK(c.model.layers[1].layers[0].kernel_w == 3);
    CHECK(c.model.layers[1].layers[0].filters == 32);
  }
  SECTION("flow list and whole mapping values") {
    const Config c = parse_config(text, "x.yaml", {"data.normalize.mean=[0.5]", "data.normalize.std=[0.25]",
                                                   "data.augment={horizontal_flip: true}"});
    CHECK(c.data.mean == std::vector<double>{0.5});
    CHECK(c.data.std == std::vector<double>{0.25});
    CHECK(c.data.augment.horizontal_flip);
  }
  SECTION("a later override wins; whitespace around the key is ignored") {
    const Config c = parse_config(text, "x.yaml", {"data.batch_size=32", " data.batch_size =64"});
    CHECK(c.data.batch_size == 64);
  }
  SECTION("a valid new key inside a layer") {
    const Config c = parse_config(text, "x.yaml", {"model.layers[2].activation=softmax"});
    CHECK(c.model.layers[2].activation == ActivationName::Softmax);
  }
  SECTION("malformed overrides name the override") {
    CHECK(error_of(text, {"optimizer.learning_rate"}) ==
          "x.yaml: in --set 'optimizer.learning_rate': expected key.path=value");
    CHECK(error_of(text, {"=3"}) == "x.yaml: in --set '=3': expected key.path=value (the key path is empty)");
    CHECK(error_of(text, {"model.layers[x].filters=3"}) ==
          "x.yaml: in --set 'model.layers[x].filters=3': malformed key path 'model.layers[x].filters': index 'x' is "
          "not a non-negative integer (expected e.g. model.layers[0].filters=64)");
    CHECK(error_of(text, {"optimizer..name=sgd"}) ==
          "x.yaml: in --set 'optimizer..name=sgd': malformed key path 'optimizer..name': empty key (expected e.g. "
          "model.layers[0].filters=64)");
    CHECK(error_of(text, {"data.normalize.mean=[0.5"}) ==
          "x.yaml: in --set 'data.normalize.mean=[0.5': invalid YAML value: end of sequence flow not found");
  }
  SECTION("index out of range, or indexing a non-list") {
    CHECK(error_of(text, {"model.layers[3].filters=64"}) ==
          "x.yaml: in --set 'model.layers[3].filters=64': index 3 out of range: 'model.layers' has 3 elements");
    CHECK(error_of(text, {"optimizer[0]=1"}) ==
          "x.yaml: in --set 'optimizer[0]=1': 'optimizer' is a mapping, not a list, so it cannot be indexed with [0]");
    CHECK(error_of(text, {"optimizer.learning_rate.x=1"}) ==
          "x.yaml: in --set 'optimizer.learning_rate.x=1': 'optimizer.learning_rate' is a scalar, not a mapping, so "
          "it has no key 'x'");
  }
  SECTION("an unknown key via --set is the unknown-key error") {
    CHECK(error_of(text, {"optimizer.lr=0.1"}) ==
          "x.yaml: in --set 'optimizer.lr=0.1': optimizer.lr: unknown key in the optimizer section (valid keys: name, "
          "learning_rate, scale_lr_by_batch, momentum, nesterov, beta1, beta2, epsilon, weight_decay, lr_multipliers, "
          "weight_decay_multipliers, freeze_after_epochs)");
    CHECK_THAT(error_of(text, {"model.layers[0].filtres=64"}),
               Catch::StartsWith("x.yaml: in --set 'model.layers[0].filtres=64': model.layers[0].filtres: unknown key "
                                 "in a conv2d layer; did you mean 'filters'?"));
    CHECK_THAT(error_of(text, {"trian.epochs=3"}),
               Catch::StartsWith("x.yaml: in --set 'trian.epochs=3': trian: unknown key in the top level; did you "
                                 "mean 'train'?"));
  }
  SECTION("override values are validated like the file's") {
    CHECK(error_of(text, {"model.layers[0].filters=-3"}) ==
          "x.yaml: in --set 'model.layers[0].filters=-3': model.layers[0].filters: expected a positive integer, got -3");
    CHECK(error_of(text, {"optimizer.learning_rate=abc"}) ==
          "x.yaml: in --set 'optimizer.learning_rate=abc': optimizer.learning_rate: expected a number, got 'abc'");
    CHECK(error_of(text, {"policy=fp16"}) ==
          "x.yaml: in --set 'policy=fp16': policy: expected one of float32 | mixed_float16 | mixed_bfloat16 | auto, "
          "got 'fp16'");
  }
  SECTION("errors elsewhere in the file keep their file position") {
    CHECK(error_of(text + "train: {epochs: 0}\n", {"optimizer.learning_rate=0.1"}) ==
          "x.yaml:13:17: train.epochs: expected an integer in [1, 1000000], got 0");
  }
}

// ---- to_yaml ----------------------------------------------------------------------

namespace {

void check_layers_equal(const std::vector<LayerConfig>& a, const std::vector<LayerConfig>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("layer " << a[i].key_path);
    CHECK(a[i].type == b[i].type);
    CHECK(a[i].name == b[i].name);
    CHECK(a[i].dtype == b[i].dtype);
    CHECK(a[i].filters == b[i].filters);
    CHECK(a[i].units == b[i].units);
    CHECK(a[i].kernel_h == b[i].kernel_h);
    CHECK(a[i].kernel_w == b[i].kernel_w);
    CHECK(a[i].stride_h == b[i].stride_h);
    CHECK(a[i].stride_w == b[i].stride_w);
    CHECK(a[i].padding == b[i].padding);
    CHECK(a[i].use_bias == b[i].use_bias);
    CHECK(a[i].activation == b[i].activation);
    CHECK(a[i].pool_h == b[i].pool_h);
    CHECK(a[i].pool_w == b[i].pool_w);
    CHECK(a[i].pool_stride_h == b[i].pool_stride_h);
    CHECK(a[i].pool_stride_w == b[i].pool_stride_w);
    CHECK(a[i].rate == b[i].rate);
    CHECK(a[i].momentum == b[i].momentum);
    CHECK(a[i].epsilon == b[i].epsilon);
    CHECK(a[i].key_path == b[i].key_path);
    check_layers_equal(a[i].layers, b[i].layers);
  }
}

}  // namespace

TEST_CASE("config: to_yaml round-trips to an equal Config", "[config][to_yaml]") {
  const std::string text = R"(name: rt
seed: 18446744073709551615
device: cuda:0
policy: mixed_float16
loss_scale: {mode: dynamic, initial: 65536, backoff_factor: 0.1}
data:
  dataset: cifar10
  normalize: {mean: [0.4914, 0.4822, 0.4465], std: [0.2470, 0.2435, 0.2616]}
  augment: {random_crop_padding: 4, horizontal_flip: true}
model:
  input_shape: [32, 32, 3]
  layers:
    - {type: conv2d, filters: 16, kernel: [3, 1], strides: [2, 1], padding: same, use_bias: false}
    - {type: batch_norm, momentum: 0.9, epsilon: 1.001e-5}
    - type: residual
      dtype: float32
      layers:
        - {type: conv2d, filters: 16, kernel: 3, padding: same}
        - {type: activation, activation: relu}
    - {type: max_pool, pool_size: [3, 2]}
    - {type: dropout, rate: 0.30000000000000004}
    - {type: global_avg_pool}
    - {type: flatten}
    - {type: dense, units: 10, activation: softmax, dtype: float32, name: predictions}
optimizer: {name: adamw, learning_rate: 3.0e-4, weight_decay: 0.01, epsilon: 1.0e-8}
schedule: {name: reduce_on_plateau, factor: 0.2, patience: 3, min_delta: 1.0e-3, cooldown: 1}
train: {epochs: 3, max_steps: 17}
)";
  const Config a = parse_config(text, "rt.yaml");
  const std::string y = to_yaml(a);
  INFO(y);
  const Config b = parse_config(y, "resolved.yaml");
  CHECK(to_yaml(b) == y);

  CHECK(b.name == a.name);
  CHECK(b.seed == 18446744073709551615ull);
  CHECK(b.device == "cuda:0");
  CHECK(b.policy == Policy::MixedFloat16);
  CHECK(b.loss_scale.mode == LossScaleMode::Dynamic);
  CHECK(b.loss_scale.mode_explicit);
  CHECK(b.loss_scale.initial == 65536.0);
  CHECK(b.loss_scale.backoff_factor == 0.1);
  CHECK(b.data.path == "data/cifar10");
  CHECK(b.data.mean == a.data.mean);
  CHECK(b.data.std == a.data.std);
  CHECK(b.data.augment.random_crop_padding == 4);
  CHECK(b.model.input_shape == a.model.input_shape);
  check_layers_equal(a.model.layers, b.model.layers);
  CHECK(b.model.layers[4].rate == 0.30000000000000004);  // exact, not 0.3
  CHECK(b.model.layers[1].epsilon == 1.001e-5);
  CHECK(b.optimizer.name == OptimizerName::AdamW);
  CHECK(b.optimizer.learning_rate == 3e-4);
  CHECK(b.optimizer.epsilon == 1e-8);
  CHECK(b.schedule.name == ScheduleName::ReduceOnPlateau);
  CHECK(b.schedule.factor == 0.2);
  CHECK(b.schedule.patience == 3);
  CHECK(b.train.max_steps == 17);

  // every key is written, defaults included, doubles with a '.' in the mantissa
  CHECK_THAT(y, Catch::Contains("epsilon: 1.0e-08"));
  CHECK_THAT(y, Catch::Contains("initial: 65536.0"));
  CHECK_THAT(y, Catch::Contains("growth_interval: 2000"));
  CHECK_THAT(y, Catch::Contains("check_numerics: false"));
  CHECK_THAT(y, Catch::Contains("name: conv2d"));
  CHECK_THAT(y, Catch::Contains("strides: [2, 1]"));
}

TEST_CASE("config: to_yaml keeps an unset loss_scale.mode unset", "[config][to_yaml]") {
  const Config a = parse_config(kMinimal, "x.yaml");
  const std::string y = to_yaml(a);
  CHECK_THAT(y, Catch::Contains("# mode unset: dynamic for mixed_float16, else none"));
  const Config b = parse_config(y, "y.yaml");
  CHECK_FALSE(b.loss_scale.mode_explicit);
  CHECK(b.data.path == "data/mnist");
  CHECK(b.data.mean.empty());
  CHECK(b.model.input_shape.empty());
  CHECK(to_yaml(b) == y);
}

TEST_CASE("config: to_yaml quotes strings that would read back as something else", "[config][to_yaml]") {
  Config a = parse_config(kMinimal, "x.yaml", {"name='~'", "data.path='a: b #c'"});
  CHECK(a.name == "~");
  const Config b = parse_config(to_yaml(a), "y.yaml");
  CHECK(b.name == "~");
  CHECK(b.data.path == "a: b #c");
}

// ---- shipped configs -------------------------------------------------------------

TEST_CASE("config: every file in configs/ loads and round-trips", "[config][configs]") {
  const std::filesystem::path dir = std::filesystem::path(MPX_SOURCE_DIR) / "configs";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  CHECK(files.size() >= 9);
  for (const auto& f : files) {
    INFO(f);
    const Config c = load_config(f);
    CHECK(c.source == f);
    CHECK(c.name == std::filesystem::path(f).stem().string());
    CHECK_FALSE(c.model.layers.empty());
    // a comment line at the top saying what it is
    std::ifstream in(f);
    std::string first;
    std::getline(in, first);
    CHECK_THAT(first, Catch::StartsWith("# "));
    const Config r = parse_config(to_yaml(c), "resolved");
    CHECK(to_yaml(r) == to_yaml(c));
  }
}

TEST_CASE("config: shipped configs say what the README and the guides promise", "[config][configs]") {
  const std::string dir = std::string(MPX_SOURCE_DIR) + "/configs/";
  const Config smoke = load_config(dir + "mnist_smoke.yaml");
  CHECK(smoke.policy == Policy::Float32);
  CHECK(smoke.train.epochs == 1);
  CHECK(smoke.data.dataset == DatasetName::Mnist);
  // The shipped configs leave data.path out: data/<dataset> of the current folder, made absolute.
  CHECK(smoke.data.path == (std::filesystem::current_path() / "data/mnist").string());

  const Config fp16 = load_config(dir + "mnist_fp16.yaml");
  CHECK(fp16.policy == Policy::MixedFloat16);
  CHECK(fp16.loss_scale.mode == LossScaleMode::Dynamic);
  CHECK(fp16.model.layers.back().dtype == LayerDType::Float32);
  CHECK(load_config(dir + "mnist_bf16.yaml").policy == Policy::MixedBFloat16);
  CHECK(load_config(dir + "fashion_mnist.yaml").data.path ==
        (std::filesystem::current_path() / "data/fashion_mnist").string());

  for (const char* name : {"cifar10_fp32", "cifar10_fp16", "cifar10_bf16"}) {
    INFO(name);
    const Config c = load_config(dir + name + ".yaml");
    CHECK(c.data.batch_size == 256);
    REQUIRE(c.model.layers.size() == 5);
    CHECK(c.model.layers[0].filters == 64);
    CHECK(c.model.layers[1].filters == 128);
    CHECK(c.model.layers[2].type == LayerType::GlobalAvgPool);
    CHECK(c.model.layers[3].units == 256);
    CHECK(c.model.layers[4].name == "predictions");
    CHECK(c.model.layers[4].dtype == LayerDType::Float32);
    CHECK(c.data.augment.random_crop_padding == 4);
    CHECK(c.data.mean.size() == 3);
  }
  CHECK(load_config(dir + "cifar10_fp16.yaml").loss_scale.mode == LossScaleMode::Dynamic);
  CHECK(load_config(dir + "cifar10_bf16.yaml").policy == Policy::MixedBFloat16);

  const Config res = load_config(dir + "cifar10_resnet.yaml");
  int blocks = 0;
  for (const auto& L : res.model.layers) blocks += L.type == LayerType::Residual;
  CHECK(blocks == 9);  // ResNet-20
  CHECK(res.data.batch_size == 256);
}

TEST_CASE("config: relative paths in a file follow the file's folder; --set and defaults the current one",
          "[config][paths]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("mpx_paths_" + std::to_string(::getpid()));
  fs::create_directories(dir / "sub");
  {
    std::ofstream(dir / "sub" / "c.yaml") << "data: {dataset: mnist, path: ../mnist}\n"
                                             "weights: {init_from: w/x.safetensors}\n"
                                             "model: {layers: [{type: flatten}, {type: dense, units: 10}]}\n";
    std::ofstream(dir / "sub" / "d.yaml") << "data: {dataset: cifar10, path: /abs/cifar}\n"
                                             "model: {layers: [{type: flatten}, {type: dense, units: 10}]}\n";
  }
  const Config c = load_config((dir / "sub" / "c.yaml").string());
  CHECK(c.data.path == (dir / "mnist").string());
  CHECK(c.weights.init_from == (dir / "sub" / "w" / "x.safetensors").string());
  const Config s = load_config((dir / "sub" / "c.yaml").string(), {"data.path=rel/m"});
  CHECK(s.data.path == (fs::current_path() / "rel" / "m").string());
  const Config d = load_config((dir / "sub" / "d.yaml").string());
  CHECK(d.data.path == "/abs/cifar");
  CHECK(d.weights.init_from.empty());
  // Left out: data/<dataset> of the current folder.
  std::ofstream(dir / "sub" / "e.yaml") << "data: {dataset: cifar10}\n"
                                           "model: {layers: [{type: flatten}, {type: dense, units: 10}]}\n";
  const Config dflt = load_config((dir / "sub" / "e.yaml").string());
  CHECK(dflt.data.path == (fs::current_path() / "data" / "cifar10").string());
  // parse_config (text without a file) leaves paths as written.
  CHECK(parse_config("data: {dataset: mnist, path: ../m}\nmodel: {layers: [{type: flatten}]}\n", "t").data.path ==
        "../m");
  fs::remove_all(dir);
}
