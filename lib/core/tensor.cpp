// SPDX-License-Identifier: MIT
#include "core/tensor.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mpx {

Shape::Shape(std::initializer_list<int64_t> dims) {
  MPX_CHECK(dims.size() <= static_cast<size_t>(kMaxRank));
  for (int64_t v : dims) d[static_cast<size_t>(rank++)] = v;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= d[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (d[static_cast<size_t>(i)] != o.d[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += fmt::format("{}{}", i ? ", " : "", d[static_cast<size_t>(i)]);
  return s + "]";
}

Tensor Tensor::reshaped(Shape s) const {
  MPX_CHECK_MSG(s.numel() == numel(), shape.str() + " -> " + s.str());
  return Tensor(data, dtype, s);
}

Tensor Tensor::slice_rows(int64_t begin, int64_t count) const {
  MPX_CHECK(shape.rank >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0]);
  Shape s = shape;
  s[0] = count;
  const int64_t row = shape[0] ? numel() / shape[0] : 0;
  return Tensor(static_cast<char*>(data) + static_cast<size_t>(begin * row) * dtype_size(dtype), dtype, s);
}

Tensor Tensor::flat_view(int64_t offset, Shape s) const {
  MPX_CHECK(offset >= 0 && offset + s.numel() <= numel());
  return Tensor(static_cast<char*>(data) + static_cast<size_t>(offset) * dtype_size(dtype), dtype, s);
}

std::string Tensor::str() const { return std::string(dtype_name(dtype)) + shape.str(); }

}  // namespace mpx
