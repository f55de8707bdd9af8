// SPDX-License-Identifier: MIT
// The shared set-up of every command (session.h).
#include "train/session.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include "backend/versions.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "io/checkpoint.h"
#include "train/train_state.h"
#include "weights/weights.h"
#include "data/whitening.h"

namespace mpx {

Shape config_input_shape(const Config& cfg) {
  const auto& s = cfg.model.input_shape;
  if (s.size() == 3) return Shape{s[0], s[1], s[2]};
  return cfg.data.dataset == DatasetName::Cifar10 ? Shape{32, 32, 3} : Shape{28, 28, 1};
}

namespace {

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

/// Moves data.validation_split's records (a fraction, or a count) of `train` to `val`: a seeded
/// draw, each part keeping the records' order (docs/design.md, "Validation split").
void split_validation(Dataset& train, Dataset& val, double split, uint64_t seed) {
  const int64_t n = train.size();
  if (split >= 1 && split != std::floor(split))
    throw ConfigError(fmt::format("data.validation_split {}: a count of records must be a whole number (a "
                                  "fraction is below 1)", split));
  const int64_t k = split < 1 ? static_cast<int64_t>(std::llround(split * static_cast<double>(n)))
                              : static_cast<int64_t>(split);
  if (k < 1 || k >= n)
    throw ConfigError(fmt::format("data.validation_split {} holds out {} of the {} training records; it must leave "
                                  "at least one record for validation and one for training", split, k, n));
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed ^ 0x76616c69646174ull);  // its own stream: shuffling and init are untouched
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng() % static_cast<uint64_t>(i + 1))]);
  std::vector<char> held(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < k; ++i) held[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
  Dataset rest;
  for (Dataset* d : {&rest, &val}) {
    d->name = train.name;
    d->H = train.H, d->W = train.W, d->C = train.C;
    d->num_classes = train.num_classes;
  }
  const size_t bytes = static_cast<size_t>(train.image_bytes());
  for (int64_t i = 0; i < n; ++i) {
    Dataset& d = held[static_cast<size_t>(i)] ? val : rest;
    const auto* img = train.images.data() + static_cast<size_t>(i) * bytes;
    d.images.insert(d.images.end(), img, img + bytes);
    d.labels.push_back(train.labels[static_cast<size_t>(i)]);
  }
  train = std::move(rest);
}

}  // namespace

Session::Session(const Config& cfg) : given_(cfg), cfg_(cfg), device_(resolve_device(cfg.device)) {}

void Session::resolve_policy_for(const DeviceInfo& info) {
  target_ = info;
  const Policy p = resolve_policy(given_.policy, info, &policy_reason_);
  auto_fell_back_ = given_.policy == Policy::Auto && p == Policy::Float32;
  cfg_.policy = p;
  cfg_.loss_scale.mode = effective_loss_scale_mode(given_.loss_scale, p);
  cfg_.loss_scale.mode_explicit = true;
}

namespace {

/// On a GPU: the driver and library versions at info level, and a warning when the loaded
/// cuDNN is older than the one mpx was built against (docs/gpu.md, "Library versions").
void log_cuda_versions() {
  CudaLibraryVersions v = cuda_library_versions();
  add_nccl_versions(v);
  spdlog::info("{}", describe_versions(v));
  const std::string warning = cudnn_version_warning(v.cudnn_built, v.cudnn);
  if (!warning.empty()) spdlog::warn("{}", warning);
}

}  // namespace

void Session::start_backend() {
  BackendOptions o;
  o.cuda_workspace_bytes = static_cast<size_t>(cfg_.cuda.workspace_mb) << 20;
  o.cuda_conv_search = cfg_.cuda.conv_algo == ConvAlgo::Search;
  o.cuda_deterministic = cfg_.cuda.deterministic;
  o.cpu_winograd = cfg_.cpu.winograd == CpuWinograd::Off  ? WinogradMode::Off
                   : cfg_.cpu.winograd == CpuWinograd::On ? WinogradMode::F4
                   : cfg_.cpu.winograd == CpuWinograd::F2 ? WinogradMode::F2
                                                          : WinogradMode::Auto;
  if (device_.device != "cpu") log_cuda_versions();
  backend_ = create_backend(device_.device, o);
  target_visible_ = true;
  resolve_policy_for(backend_->info());
}

void Session::plan_on_cpu() {
  plan_only_ = true;
  backend_ = create_backend("cpu");
  DeviceInfo info = backend_->info();
  target_visible_ = device_.device == "cpu";
  if (device_.device != "cpu") {
    const auto gpus = cuda_devices();
    const int index = device_.device.size() > 5 ? std::atoi(device_.device.c_str() + 5) : 0;
    if (index >= 0 && index < static_cast<int>(gpus.size())) {
      info = gpus[static_cast<size_t>(index)];
      target_visible_ = true;
    }
  }
  resolve_policy_for(info);
  const Shape in = config_input_shape(cfg_);
  H_ = static_cast<int>(in[0]), W_ = static_cast<int>(in[1]), C_ = static_cast<int>(in[2]);
}

void Session::set_shape(const Dataset& ds) {
  H_ = ds.H, W_ = ds.W, C_ = ds.C, K_ = ds.num_classes;
}

void Session::load_data(DataNeed need) {
  switch (need) {
    case DataNeed::None: {
      const Shape in = config_input_shape(cfg_);
      H_ = static_cast<int>(in[0]), W_ = static_cast<int>(in[1]), C_ = static_cast<int>(in[2]);
      return;
    }
    case DataNeed::Test:
      test_ = load_dataset(cfg_.data, Split::Test, cfg_.seed);
      check_input_shape(cfg_, test_);
      set_shape(test_);
      return;
    case DataNeed::TrainAndTest:
      train_ = load_dataset(cfg_.data, Split::Train, cfg_.seed);
      test_ = load_dataset(cfg_.data, Split::Test, cfg_.seed);
      check_input_shape(cfg_, train_);
      if (test_.H != train_.H || test_.W != train_.W || test_.C != train_.C)
        throw DataError("the test split's image shape differs from the training split's");
      has_train_ = true;
      set_shape(train_);
      if (cfg_.data.validation_split > 0) split_validation(train_, validation_, cfg_.data.validation_split, cfg_.seed);
      return;
    case DataNeed::TrainIfPresent:
      try {
        train_ = load_dataset(cfg_.data, Split::Train, cfg_.seed);
        check_input_shape(cfg_, train_);
        has_train_ = true;
        set_shape(train_);
      } catch (const DataError& e) {
        data_note_ = e.what();
        load_data(DataNeed::None);
      }
      return;
  }
}

std::unique_ptr<Model> Session::make_model(int64_t batch) const { return make_model(batch, cfg_.policy, cfg_); }

std::unique_ptr<Model> Session::make_model(int64_t batch, Policy policy, const Config& cfg) const {
  auto m = std::make_unique<Model>(cfg, policy, *backend_, H_, W_, C_, K_, batch);
  m->keep_layer_outputs(cfg.debug.check_numerics);  // it scans every layer's output after each step
  if (plan_only_) return m;  // never runs: the normalization is for training's data
  std::vector<double> mean = cfg.data.mean, stdv = cfg.data.std;
  if (mean.empty() || stdv.empty()) default_normalization(cfg.data.dataset, mean, stdv);
  m->set_input_normalization(mean, stdv);
  return m;
}

std::unique_ptr<Model> Session::plan_model(int64_t batch) const {
  return std::make_unique<Model>(cfg_, cfg_.policy, *backend_, H_, W_, C_, K_, batch, true);
}

void Session::apply_patch_whitening(Model& m) const {
  const std::vector<LayerConfig>& layers = cfg_.model.layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerConfig& L = layers[i];
    if (L.type != LayerType::Conv2d || L.kernel_initializer != KernelInit::PatchWhitening) continue;
    // The filters whiten the model's input, so only the first layer can have them.
    if (i != 0)
      throw ConfigError(fmt::format("{}: kernel_initializer patch_whitening needs the first layer of the model "
                                    "(it whitens the input images' patches); this is layer {}",
                                    L.key_path.empty() ? L.name : L.key_path, i));
    const int64_t want = 2LL * L.kernel_h * L.kernel_w * C_;
    if (L.filters != want)
      throw ConfigError(fmt::format("{}: kernel_initializer patch_whitening makes 2 x {} x {} x {} = {} filters; set "
                                    "filters: {} (got {})",
                                    L.key_path.empty() ? L.name : L.key_path, L.kernel_h, L.kernel_w, C_, want, want,
                                    L.filters));
    if (train_.size() == 0) return;  // evaluation and export: the weights come from the file
    std::vector<double> mean = cfg_.data.mean, stdv = cfg_.data.std;
    if (mean.empty() || stdv.empty()) default_normalization(cfg_.data.dataset, mean, stdv);
    const PatchWhitening pw =
        patch_whitening(train_, L.whitening_images, L.kernel_h, L.kernel_w, mean, stdv, L.whitening_epsilon);
    for (const ParamInfo& p : m.params()) {
      if (p.layer != L.name || p.name != "kernel") continue;
      MPX_CHECK(p.trainable && p.shape.numel() == static_cast<int64_t>(pw.weights.size()));
      backend_->upload(m.master().flat_view(p.offset, p.shape), pw.weights.data());
    }
    m.refresh_compute_copy();
    spdlog::debug("{}: patch whitening from {} training images, eigenvalues {:.3g} .. {:.3g}", L.name,
                  std::min<int64_t>(L.whitening_images, train_.size()), pw.eigen.values.front(),
                  pw.eigen.values.back());
  }
}

std::string Session::init_weights(Model& m, const std::string& weights, const std::string& checkpoint) {
  m.init_params(cfg_.seed);
  apply_patch_whitening(m);
  if (!weights.empty()) {
    const WeightsLayout l = import_weights(m, *backend_, cfg_, input_shape(), weights);
    return fmt::format("{} ({} layout)", weights, weights_layout_name(l));
  }
  if (!checkpoint.empty()) {
    const std::string path = resolve_checkpoint_path(checkpoint);
    const Checkpoint ck = load_checkpoint(path);
    restore_model(*backend_, m, ck, path, cfg_);
    return fmt::format("{} (step {})", path, ck.header.global_step);
  }
  if (!cfg_.weights.init_from.empty()) {
    const WeightsLayout l = import_weights(m, *backend_, cfg_, input_shape(), cfg_.weights.init_from);
    return fmt::format("{} ({} layout)", cfg_.weights.init_from, weights_layout_name(l));
  }
  return fmt::format("initialization with seed {}", cfg_.seed);
}

}  // namespace mpx
