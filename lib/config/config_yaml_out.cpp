// SPDX-License-Identifier: MIT
// Config -> resolved YAML (the run directory's config.yaml): every key with its
// value, defaults filled in, doubles in shortest round-trip form, so that
// parse_config(to_yaml(c)) gives back an equal Config.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "config/config.h"

namespace mpx {

namespace {

/// Shortest representation that reads back to the same double, always with a
/// '.' in the mantissa ("1.0e-07", "32768.0") so YAML 1.1 readers see a float.
std::string fmt_double(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of("ni") != std::string::npos) return s;  // inf/nan never pass validation
  const size_t e = s.find('e');
  if (s.find('.') == std::string::npos) {
    if (e == std::string::npos)
      s += ".0";
    else
      s.insert(e, ".0");
  }
  return s;
}

struct D {
  double v;
};
YAML::Emitter& operator<<(YAML::Emitter& out, D d) { return out << fmt_double(d.v); }

template <class T>
void kv(YAML::Emitter& out, const char* key, const T& value) {
  out << YAML::Key << key << YAML::Value << value;
}

void pair_or_int(YAML::Emitter& out, const char* key, int h, int w) {
  out << YAML::Key << key << YAML::Value;
  if (h == w) {
    out << h;
  } else {
    out << YAML::Flow << YAML::BeginSeq << h << w << YAML::EndSeq;
  }
}

void double_list(YAML::Emitter& out, const char* key, const std::vector<double>& v) {
  out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (double x : v) out << D{x};
  out << YAML::EndSeq;
}

void emit_layers(YAML::Emitter& out, const std::vector<LayerConfig>& layers);

void emit_layer(YAML::Emitter& out, const LayerConfig& L) {
  out << YAML::BeginMap;
  kv(out, "type", L.type);
  if (!L.name.empty()) kv(out, "name", L.name);
  if (!L.dtype.empty()) kv(out, "dtype", L.dtype);  // absent = the model's policy
  const std::string& t = L.type;
  if (t == "conv2d") {
    kv(out, "filters", L.filters);
    pair_or_int(out, "kernel", L.kernel_h, L.kernel_w);
    pair_or_int(out, "strides", L.stride_h, L.stride_w);
    kv(out, "padding", L.padding);
    kv(out, "use_bias", L.use_bias);
    kv(out, "activation", L.activation);
    if (L.activation == "leaky_relu") kv(out, "negative_slope", D{L.negative_slope});
  } else if (t == "dense") {
    kv(out, "units", L.units);
    kv(out, "use_bias", L.use_bias);
    kv(out, "activation", L.activation);
    if (L.activation == "leaky_relu") kv(out, "negative_slope", D{L.negative_slope});
  } else if (t == "activation") {
    kv(out, "activation", L.activation);
    if (L.activation == "leaky_relu") kv(out, "negative_slope", D{L.negative_slope});
  } else if (t == "max_pool" || t == "avg_pool") {
    pair_or_int(out, "pool_size", L.pool_h, L.pool_w);
    pair_or_int(out, "strides", L.pool_stride_h ? L.pool_stride_h : L.pool_h,
                L.pool_stride_w ? L.pool_stride_w : L.pool_w);
    kv(out, "padding", L.padding);
  } else if (t == "dropout") {
    kv(out, "rate", D{L.rate});
  } else if (t == "batch_norm") {
    kv(out, "momentum", D{L.momentum});
    kv(out, "epsilon", D{L.epsilon});
  } else if (t == "residual") {
    out << YAML::Key << "layers" << YAML::Value;
    emit_layers(out, L.layers);
  }
  out << YAML::EndMap;
}

void emit_layers(YAML::Emitter& out, const std::vector<LayerConfig>& layers) {
  out << YAML::BeginSeq;
  for (const auto& L : layers) emit_layer(out, L);
  out << YAML::EndSeq;
}

}  // namespace

std::string to_yaml(const Config& c) {
  YAML::Emitter out;
  out.SetIndent(2);
  out << YAML::BeginMap;
  kv(out, "name", c.name);
  kv(out, "seed", c.seed);
  kv(out, "device", c.device);
  kv(out, "policy", std::string(policy_name(c.policy)));

  out << YAML::Key << "loss_scale";
  if (!c.loss_scale.mode_explicit) out << YAML::Comment("mode unset: dynamic for mixed_float16, else none");
  out << YAML::Value << YAML::BeginMap;
  if (c.loss_scale.mode_explicit) kv(out, "mode", std::string(loss_scale_mode_name(c.loss_scale.mode)));
  kv(out, "initial", D{c.loss_scale.initial});
  kv(out, "growth_interval", c.loss_scale.growth_interval);
  kv(out, "growth_factor", D{c.loss_scale.growth_factor});
  kv(out, "backoff_factor", D{c.loss_scale.backoff_factor});
  kv(out, "min_scale", D{c.loss_scale.min_scale});
  kv(out, "max_consecutive_skips", c.loss_scale.max_consecutive_skips);
  out << YAML::EndMap;

  const DataConfig& d = c.data;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  kv(out, "dataset", d.dataset);
  kv(out, "path", d.path.empty() ? "data/" + d.dataset : d.path);
  kv(out, "batch_size", d.batch_size);
  kv(out, "train_limit", d.train_limit);
  kv(out, "test_limit", d.test_limit);
  kv(out, "drop_last", d.drop_last);
  kv(out, "shuffle", d.shuffle);
  out << YAML::Key << "normalize" << YAML::Value << YAML::BeginMap;
  double_list(out, "mean", d.mean);
  double_list(out, "std", d.std);
  out << YAML::EndMap;
  out << YAML::Key << "augment" << YAML::Value << YAML::BeginMap;
  kv(out, "random_crop_padding", d.augment.random_crop_padding);
  kv(out, "horizontal_flip", d.augment.horizontal_flip);
  out << YAML::EndMap;
  kv(out, "synthetic_train", d.synthetic_train);
  kv(out, "synthetic_test", d.synthetic_test);
  out << YAML::EndMap;

  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "input_shape" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (int64_t v : c.model.input_shape) out << v;
  out << YAML::EndSeq;
  out << YAML::Key << "layers" << YAML::Value;
  emit_layers(out, c.model.layers);
  out << YAML::EndMap;

  const OptimizerConfig& o = c.optimizer;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  kv(out, "name", o.name);
  kv(out, "learning_rate", D{o.learning_rate});
  kv(out, "scale_lr_by_batch", o.scale_lr_by_batch);
  kv(out, "momentum", D{o.momentum});
  kv(out, "nesterov", o.nesterov);
  kv(out, "beta1", D{o.beta1});
  kv(out, "beta2", D{o.beta2});
  kv(out, "epsilon", D{o.epsilon});
  kv(out, "weight_decay", D{o.weight_decay});
  out << YAML::EndMap;

  const ScheduleConfig& s = c.schedule;
  out << YAML::Key << "schedule" << YAML::Value << YAML::BeginMap;
  kv(out, "name", s.name);
  kv(out, "warmup_epochs", D{s.warmup_epochs});
  kv(out, "step_epochs", s.step_epochs);
  kv(out, "gamma", D{s.gamma});
  kv(out, "min_lr", D{s.min_lr});
  kv(out, "factor", D{s.factor});
  kv(out, "patience", s.patience);
  kv(out, "min_delta", D{s.min_delta});
  kv(out, "cooldown", s.cooldown);
  out << YAML::EndMap;

  const TrainConfig& t = c.train;
  out << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  kv(out, "epochs", t.epochs);
  kv(out, "log_every", t.log_every);
  kv(out, "eval_every", t.eval_every);
  kv(out, "eval_policy", t.eval_policy);
  kv(out, "checkpoint_every", t.checkpoint_every);
  kv(out, "max_steps", t.max_steps);
  kv(out, "sync", t.sync);
  kv(out, "cuda_graph", t.cuda_graph);
  out << YAML::EndMap;

  out << YAML::Key << "debug" << YAML::Value << YAML::BeginMap;
  kv(out, "check_numerics", c.debug.check_numerics);
  out << YAML::EndMap;

  out << YAML::Key << "weights" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "init_from" << YAML::Value;
  if (c.weights.init_from.empty()) {
    out << YAML::Null;
  } else {
    out << c.weights.init_from;
  }
  out << YAML::EndMap;

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace mpx
