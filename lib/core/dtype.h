// SPDX-License-Identifier: MIT
// Element types of device tensors (float32, float16, bfloat16, plus the integer
// types the data path needs) and their names as they appear in configs and logs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace mpx {

enum class DType : uint8_t { F32, F16, BF16, I32, U8 };

/// @brief Bytes per element.
size_t dtype_size(DType t);
/// @brief Keras-style name: "float32", "float16", "bfloat16", "int32", "uint8".
const char* dtype_name(DType t);
/// @brief Parses "float32"/"float16"/"bfloat16" (and "fp32"/"fp16"/"bf16"); nullopt otherwise.
std::optional<DType> parse_dtype(std::string_view s);
/// @brief True for float16 and bfloat16.
inline bool is_16bit(DType t) { return t == DType::F16 || t == DType::BF16; }
/// @brief True for the three floating types.
inline bool is_float(DType t) { return t == DType::F32 || is_16bit(t); }

}  // namespace mpx
