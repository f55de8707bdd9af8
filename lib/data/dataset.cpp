// SPDX-License-Identifier: MIT
// load_dataset: picks the reader for DataConfig::dataset, applies the record
// limits; plus the standard normalization statistics of each data set.
#include "data/dataset.h"

#include <algorithm>

#include "core/error.h"
#include "data/readers.h"

namespace mpx {

std::string default_data_path(DatasetName dataset) { return std::string("data/") + enum_name(dataset); }

std::string fetch_script(DatasetName dataset) {
  switch (dataset) {
    case DatasetName::Mnist: return "data_scripts/get_mnist.sh";
    case DatasetName::FashionMnist: return "data_scripts/get_fashion_mnist.sh";
    case DatasetName::Cifar10: return "data_scripts/get_cifar10.sh";
    case DatasetName::Synthetic: break;
  }
  return "";
}

Dataset load_dataset(const DataConfig& cfg, Split split, uint64_t seed) {
  const int64_t limit = split == Split::Train ? cfg.train_limit : cfg.test_limit;
  if (limit < 0) throw ConfigError("data." + std::string(split == Split::Train ? "train" : "test") +
                                   "_limit must be >= 0 (0 = all records), got " + std::to_string(limit));
  Dataset ds;
  if (cfg.dataset == DatasetName::Synthetic) {
    int64_t n = split == Split::Train ? cfg.synthetic_train : cfg.synthetic_test;
    if (n <= 0) throw ConfigError("data.synthetic_" + std::string(split == Split::Train ? "train" : "test") +
                                  " must be > 0, got " + std::to_string(n));
    if (limit > 0) n = std::min(n, limit);
    return data::make_synthetic(n, split, seed);
  }
  const std::string folder = cfg.path.empty() ? default_data_path(cfg.dataset) : cfg.path;
  if (cfg.dataset == DatasetName::Cifar10) {
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
    throw DataError(folder + ": the " + std::string(split == Split::Train ? "training" : "test") + " split of " +
                    enum_name(cfg.dataset) + " holds no records; " + data::fetch_hint(cfg.dataset, folder));
  }
  return ds;
}

void default_normalization(DatasetName dataset, std::vector<double>& mean, std::vector<double>& std) {
  switch (dataset) {
    case DatasetName::Mnist:
      mean = {0.1307};
      std = {0.3081};
      return;
    case DatasetName::FashionMnist:
      mean = {0.2860};
      std = {0.3530};
      return;
    case DatasetName::Cifar10:
      mean = {0.4914, 0.4822, 0.4465};
      std = {0.2470, 0.2435, 0.2616};
      return;
    case DatasetName::Synthetic: break;
  }
  mean = {0.5};
  std = {0.5};
}

}  // namespace mpx
