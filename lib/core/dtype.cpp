// SPDX-License-Identifier: MIT
#include "core/dtype.h"

namespace mpx {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I32: return "int32";
    case DType::U8: return "uint8";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "float32" || s == "fp32" || s == "f32") return DType::F32;
  if (s == "float16" || s == "fp16" || s == "f16" || s == "half") return DType::F16;
  if (s == "bfloat16" || s == "bf16") return DType::BF16;
  return std::nullopt;
}

}  // namespace mpx
