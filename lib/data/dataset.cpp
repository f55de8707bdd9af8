// SPDX-License-Identifier: MIT
// load_dataset: picks the reader for DataConfig::dataset, applies the record
// limits; plus the standard normalization statistics of each data set.
#include "data/dataset.h"

#include <algorithm>

#include "core/error.h"
#include "data/readers.h"

namespace mpx {

namespace {

void check_known(const std::string& dataset) {
  if (dataset != "mnist" && dataset != "fashion_mnist" && dataset != "cifar10" && dataset != "synthetic") {
    throw ConfigError("data.dataset: unknown data set '" + dataset +
                      "' (expected mnist | fashion_mnist | cifar10 | synthetic)");
  }
}

}  // namespace

std::string default_data_path(const std::string& dataset) { return "data/" + dataset; }

std::string fetch_script(const std::string& dataset) {
  if (dataset == "mnist") return "data_scripts/get_mnist.sh";
  if (dataset == "fashion_mnist") return "data_scripts/get_fashion_mnist.sh";
  if (dataset == "cifar10") return "data_scripts/get_cifar10.sh";
  return "";
}

Dataset load_dataset(const DataConfig& cfg, Split split, uint64_t seed) {
  check_known(cfg.dataset);
  const int64_t limit = split == Split::Train ? cfg.train_limit : cfg.test_limit;
  if (limit < 0) throw ConfigError("data." + std::string(split == Split::Train ? "train" : "test") +
                                   "_limit must be >= 0 (0 = all records), got " + std::to_string(limit));
  Dataset ds;
  if (cfg.dataset == "synthetic") {
    int64_t n = split == Split::Train ? cfg.synthetic_train : cfg.synthetic_test;
    if (n <= 0) throw ConfigError("data.synthetic_" + std::string(split == Split::Train ? "train" : "test") +
                                  " must be > 0, got " + std::to_string(n));
    if (limit > 0) n = std::min(n, limit);
    return data::make_synthetic(n, split, seed);
  }
  const std::string folder = cfg.path.empty() ? default_data_path(cfg.dataset) : cfg.path;
  if (cfg.dataset == "cifar10") {
    ds = data::load_cifar10(folder, split);
  } else {
    ds = data::load_idx_dataset(cfg.dataset, folder, split);
  }
  if (limit > 0 && limit < ds.size()) {
    ds.labels.resize(static_cast<size_t>(limit));
    ds.images.resize(static_cast<size_t>(limit * ds.image_bytes()));
    ds.labels.shrink_to_fit();
    ds.images.shrink_to_fit();
  }
  if (ds.size() == 0) {
    throw DataError(folder + ": the " + std::string(split == Split::Train ? "training" : "test") +
                    " split of " + cfg.dataset + " holds no records; " + data::fetch_hint(cfg.dataset, folder));
  }
  return ds;
}

void default_normalization(const std::string& dataset, std::vector<double>& mean, std::vector<double>& std) {
  check_known(dataset);
  if (dataset == "mnist") {
    mean = {0.1307};
    std = {0.3081};
  } else if (dataset == "fashion_mnist") {
    mean = {0.2860};
    std = {0.3530};
  } else if (dataset == "cifar10") {
    mean = {0.4914, 0.4822, 0.4465};
    std = {0.2470, 0.2435, 0.2616};
  } else {
    mean = {0.5};
    std = {0.5};
  }
}

}  // namespace mpx
