// SPDX-License-Identifier: MIT
// Precision policy (DESIGN.md "Precision semantics"): which dtype a layer
// computes in, from the model's policy and the layer's `dtype:` override.
#include <string>

#include "core/error.h"
#include "nn/model.h"

namespace mpx {

DType compute_dtype_for(Policy model_policy, const std::string& layer_dtype) {
  if (layer_dtype.empty()) {
    switch (model_policy) {
      case Policy::Float32: return DType::F32;
      case Policy::MixedFloat16: return DType::F16;
      case Policy::MixedBFloat16: return DType::BF16;
      case Policy::Auto: break;
    }
    throw Error("policy 'auto' must be resolved before the model is built");
  }
  if (layer_dtype == "float32") return DType::F32;
  if (layer_dtype == "mixed_float16" || layer_dtype == "float16") return DType::F16;
  if (layer_dtype == "mixed_bfloat16" || layer_dtype == "bfloat16") return DType::BF16;
  throw ConfigError("unknown layer dtype '" + layer_dtype +
                    "' (expected float32, mixed_float16, float16, mixed_bfloat16 or bfloat16)");
}

}  // namespace mpx
