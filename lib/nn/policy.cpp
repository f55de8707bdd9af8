// SPDX-License-Identifier: MIT
// Precision policy (docs/design.md "The precision contract"): which dtype a layer
// computes in, from the model's policy and the layer's `dtype:` override.
#include <fmt/format.h>

#include <optional>

#include "core/error.h"
#include "nn/model.h"

namespace mpx {

DType compute_dtype_for(Policy model_policy, std::optional<LayerDType> layer_dtype) {
  if (!layer_dtype) {
    switch (model_policy) {
      case Policy::Float32: return DType::F32;
      case Policy::MixedFloat16: return DType::F16;
      case Policy::MixedBFloat16: return DType::BF16;
      case Policy::Auto: break;
    }
    throw Error("policy 'auto' must be resolved before the model is built");
  }
  switch (*layer_dtype) {
    case LayerDType::Float32: return DType::F32;
    case LayerDType::MixedFloat16:
    case LayerDType::Float16: return DType::F16;
    case LayerDType::MixedBFloat16:
    case LayerDType::BFloat16: return DType::BF16;
  }
  throw ConfigError(fmt::format("unknown layer dtype {}", static_cast<int>(*layer_dtype)));
}

}  // namespace mpx
