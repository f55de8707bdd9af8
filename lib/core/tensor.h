// SPDX-License-Identifier: MIT
// Shapes and non-owning tensor views. Device memory is owned by Buffer (see
// backend/backend.h); a Tensor only points into it. Shapes are fixed-size so
// that building a view never allocates (the step loop allocates nothing).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"

namespace mpx {

/// @brief Up to 4 dimensions; activations are NHWC, dense tensors [N, C].
struct Shape {
  static constexpr int kMaxRank = 4;
  int rank = 0;
  std::array<int64_t, kMaxRank> d{};

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int64_t operator[](int i) const { return d[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return d[static_cast<size_t>(i)]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  /// "[256, 28, 28, 32]"
  std::string str() const;
};

/// @brief A typed view of device memory (host memory on the CPU backend).
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;

  Tensor() = default;
  Tensor(void* p, DType t, Shape s) : data(p), dtype(t), shape(s) {}
  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  /// The same memory with another shape of equal element count.
  Tensor reshaped(Shape s) const;
  /// Rows [begin, begin+count) along the first dimension (a batch slice).
  Tensor slice_rows(int64_t begin, int64_t count) const;
  /// Elements [offset, offset+count) of a flat view, as a tensor of `s` (arena views).
  Tensor flat_view(int64_t offset, Shape s) const;
  /// "float16[256, 28, 28, 32]"
  std::string str() const;
};

}  // namespace mpx
