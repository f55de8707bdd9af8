// SPDX-License-Identifier: MIT
// The safetensors file format (https://github.com/huggingface/safetensors):
// reader and writer, independent of the model. Used by `mpx export`, the
// `weights.init_from` import and the `mpx inspect` dump.
//
// Format (little-endian):
//   offset 0     u64      N: length of the header
//   offset 8     N bytes  UTF-8 JSON object {name: {"dtype": "F32", "shape": [..],
//                         "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
//                         (mpx pads it with spaces so the data starts 8-byte aligned)
//   offset 8+N   data     the tensors' raw bytes; offsets are relative to 8+N and
//                         must cover the data section exactly, without holes or overlap.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mpx {

/// @brief One named tensor: dtype as the header spells it ("F32", "F16", "BF16",
/// "I32", ...), shape, and its raw little-endian bytes.
struct StTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;  // [] is a scalar (one element)
  std::vector<uint8_t> bytes;

  int64_t numel() const;
};

/// @brief A whole file: metadata (`__metadata__`) and the tensors in data order.
struct StFile {
  std::map<std::string, std::string> metadata;
  std::vector<StTensor> tensors;

  /// The tensor called `name`, or nullptr.
  const StTensor* find(const std::string& name) const;
};

/// Bytes per element of a safetensors dtype name; 0 for an unknown name.
size_t st_dtype_size(const std::string& dtype);
/// "F32" / "F16" / "BF16" / "I32" / "U8" for an mpx dtype.
const char* st_dtype_name(DType t);

/**
 * @brief Parses a file's bytes, checking everything the format promises: the
 * header length against the file size, the JSON, every entry's dtype, shape and
 * data_offsets (inside the data section, of the size dtype x shape needs, no
 * overlap, no gap, nothing left over). Throws ConfigError (exit 2) that names
 * `source` and the offending tensor; never reads out of bounds.
 */
StFile parse_safetensors(const std::string& bytes, const std::string& source);
/// @brief Reads and parses `path` (ConfigError when missing, unreadable or malformed).
StFile read_safetensors(const std::string& path);

/// @brief The file's bytes: header (tensors in the given order, offsets
/// consecutive, padded with spaces to a multiple of 8) then the data.
/// Throws Error when a tensor's byte count does not match dtype x shape.
std::string serialize_safetensors(const StFile& f);
/// @brief Writes `f` to `path` atomically (temporary file, fsync, rename).
void write_safetensors(const std::string& path, const StFile& f);

/// @brief A tensor from host values of an mpx dtype (float32, float16/bfloat16
/// as raw uint16, int32, uint8); `data` holds product(shape) elements.
StTensor make_st_tensor(const std::string& name, DType t, const std::vector<int64_t>& shape, const void* data);
/// @brief The tensor's values as float32: F32 as is, F16 and BF16 widened
/// exactly. Throws ConfigError naming `source` and the tensor for other dtypes.
std::vector<float> st_to_float32(const StTensor& t, const std::string& source);

/// "[3, 3, 1, 32]"
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace mpx
