// SPDX-License-Identifier: MIT
// support/float_bits.h, the comparison the CPU-vs-CUDA tests use: two NaNs of a float
// dtype are equal whatever their payload or sign (x86 keeps 0x7fc00000, NVIDIA GPUs write
// 0x7fffffff), every other bit difference is reported at its element.
#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <vector>

#include "support/float_bits.h"

using mpx::DType;
using support::first_difference_nan_equal;

namespace {

template <typename U>
std::vector<uint8_t> bytes_of(const std::vector<U>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(U));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <typename U>
size_t first_diff(const std::vector<U>& a, const std::vector<U>& b, DType t) {
  const auto x = bytes_of(a), y = bytes_of(b);
  REQUIRE(x.size() == y.size());
  return first_difference_nan_equal(x.data(), y.data(), x.size(), t);
}

}  // namespace

TEST_CASE("nan-equal compare: float32 NaN payloads and signs are equal, other bits are not", "[core][nan]") {
  // 1.0, x86's quiet NaN, +inf, -0.0
  const std::vector<uint32_t> cpu{0x3f800000u, 0x7fc00000u, 0x7f800000u, 0x80000000u};
  std::vector<uint32_t> gpu = cpu;
  gpu[1] = 0x7fffffffu;  // the GPU's canonical NaN
  CHECK(first_diff(cpu, gpu, DType::F32) == 4);
  gpu[1] = 0xffc00001u;  // negative NaN with a payload
  CHECK(first_diff(cpu, gpu, DType::F32) == 4);
  gpu[1] = 0x7f800000u;  // inf is not NaN
  CHECK(first_diff(cpu, gpu, DType::F32) == 1);
  gpu = cpu;
  gpu[3] = 0x00000000u;  // +0 vs -0 differ in their bits
  CHECK(first_diff(cpu, gpu, DType::F32) == 3);
  gpu = cpu;
  gpu[0] = 0x3f800001u;  // one ulp
  CHECK(first_diff(cpu, gpu, DType::F32) == 0);
  gpu[0] = 0x7fc00000u;  // NaN where the CPU has a number
  CHECK(first_diff(cpu, gpu, DType::F32) == 0);
}

TEST_CASE("nan-equal compare: float16 and bfloat16 NaNs", "[core][nan]") {
  const std::vector<uint16_t> h_cpu{0x3c00, 0x7e00, 0x7c00};  // 1.0, NaN, inf
  std::vector<uint16_t> h_gpu{0x3c00, 0x7fff, 0x7c00};
  CHECK(first_diff(h_cpu, h_gpu, DType::F16) == 3);
  h_gpu[2] = 0x7c01;  // a NaN where the CPU has inf
  CHECK(first_diff(h_cpu, h_gpu, DType::F16) == 2);
  const std::vector<uint16_t> b_cpu{0x3f80, 0x7fc0, 0xff80};  // 1.0, NaN, -inf
  std::vector<uint16_t> b_gpu{0x3f80, 0xffff, 0xff80};
  CHECK(first_diff(b_cpu, b_gpu, DType::BF16) == 3);
  b_gpu[0] = 0x3f81;
  CHECK(first_diff(b_cpu, b_gpu, DType::BF16) == 0);
  // 0x7f80 is a float16 NaN pattern's neighbour but a bfloat16 inf: dtype decides.
  CHECK(support::is_nan_bits(reinterpret_cast<const uint8_t*>(&b_cpu[1]), DType::BF16));
  CHECK_FALSE(support::is_nan_bits(reinterpret_cast<const uint8_t*>(&b_cpu[2]), DType::BF16));
}

TEST_CASE("nan-equal compare: integer dtypes compare plain bytes", "[core][nan]") {
  const std::vector<uint8_t> a{0xff, 0x7f, 0xc0, 0x00};
  std::vector<uint8_t> b{0xff, 0x7f, 0xc0, 0x00};
  CHECK(first_diff(a, b, DType::U8) == 4);
  b[2] = 0xc1;
  CHECK(first_diff(a, b, DType::U8) == 2);
  // the bytes of two different float32 NaNs are different int32 values
  const std::vector<uint32_t> i{0x7fc00000u}, j{0x7fffffffu};
  CHECK(first_diff(i, j, DType::I32) == 0);
}

TEST_CASE("same_or_both_nan: doubles of a read-back struct", "[core][nan]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(support::same_or_both_nan(nan, -nan));
  CHECK(support::same_or_both_nan(1.5, 1.5));
  CHECK_FALSE(support::same_or_both_nan(nan, 1.5));
  CHECK_FALSE(support::same_or_both_nan(1.5, 2.5));
}
